"""Whole batches that every DataLoader worker writes its part of: joined across workers without a copy (issue 24).

With batches across workers (:mod:`~lerobot_nodes.batch_memory.worker_parts`), each worker assembles a
part and the training process joined the parts by copying them into one storage per batch: for 3
cameras at 480x640 and batch 32, 88 MB copied on the training thread per batch (0.82x the samples/s
of per-worker batches with 2 workers). A :class:`BatchRing` holds a few shared-memory *slots*, each
laid out as one whole batch's camera tensors; worker ``w`` decodes its part's frames straight into
its own rows of a slot (its *region*), so once every worker's part has arrived the batch's cameras
are views of the slot, and nothing is copied.

The training process owns the ring: it creates the slots (before the workers start, from the frame
sizes ``info.json`` declares; where they are not known, the first time it joins a batch that would go
in one, from the parts' layout) and unlinks them. A region is written
by one worker only, and only while its flag in the ring's control table says :data:`FREE`: the
worker sets it to :data:`CLAIMED` before it writes, the training process sets it back to
:data:`FREE` once the batch that used the region is released (its last view collected) or its part
was copied out. At an epoch's end a worker's part may be short: the next worker's rows move down
into the gap (inside the regions the batch's parts hold). Anything else that does not line up (a
slot not made yet, a region still held because the training step keeps old batches, parts in
another order, a camera layout that differs) makes that part an ordinary part, which the training
process copies, as before: the ring changes where frames are written, never which samples a batch holds.

Worker ``w``'s ``n``-th part since its iterator began goes in slot ``(first + n) % slots``, ``first``
being the slot after the last batch the training process joined before this iterator (in the control
table): every worker counts the same parts, so the parts of one batch meet in one slot, and an epoch's
first batch does not go in the slot of the last one, which a training loop still holds when it asks
for the next epoch. The training process checks that they did.

Once every worker has attached to every slot, the training process unlinks the segments' names: the
memory then goes with the last process that maps it, however the processes end (a whole process group
killed included), instead of staying in ``/dev/shm``.

A claimed region is given back whatever happens to its part: a worker frees the claims of parts it
abandoned when its iterator is reset (its decode threads stopped first) or whose frames ended
elsewhere; the training process frees the region of a part it received but never joined (the
DataLoader drops the parts in flight when a new iterator starts).
"""

from __future__ import annotations

import contextlib
import weakref
import zlib
from collections.abc import Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import torch

from ..config import split_evenly
from ..workers.shared_segments import Segment, attach_untracked, release
from .storage_views import StorageLayout, packed_offsets, view_of

FREE = 1
CLAIMED = 0

NAME_BYTES = 48
"""Room for a slot's segment name in the control table."""

def header_bytes(workers: int) -> int:
    """The control table's header: the slot of the current iterator's first part (an int64), then a
    byte per worker set once it has attached to every slot; a multiple of 64."""
    return 64 * -(-(8 + workers) // 64)


CameraSpec = tuple[str, torch.dtype, tuple[int, ...]]
"""``(key, dtype, shape of one sample)`` of a camera's tensor in a batch."""


def slot_layout(cameras: Sequence[CameraSpec], batch_size: int) -> tuple[list[int], int]:
    """Byte offset of each camera's ``(batch_size, *shape)`` tensor in a slot, in order, each on an
    ``storage_views.ALIGNMENT`` boundary, and the slot's size: the layout a worker and the training process
    both derive from the same cameras."""
    return packed_offsets([(key, dtype, (batch_size, *shape)) for key, dtype, shape in cameras])


def layout_signature(cameras: Sequence[CameraSpec], batch_size: int) -> int:
    """A number that differs between two camera layouts a worker must not confuse (a crc of keys,
    dtypes, shapes and the batch size), the same in every process."""
    text = repr(
        [(key, str(dtype), tuple(int(s) for s in shape)) for key, dtype, shape in cameras] + [batch_size]
    )
    return zlib.crc32(text.encode())


class BatchRing:
    """``slots`` shared-memory batches of the cameras of ``workers`` workers' parts (see the module).

    Built in the training process (the owner, which creates and unlinks every segment); pickled into
    a DataLoader worker it attaches to the same control table and, lazily, to the slots. Guarantee: a
    worker is handed a region only while no batch the training process delivered still uses it and
    no other part of its own is written there.
    """

    def __init__(self, slots: int, workers: int, batch_size: int, cameras: Sequence[CameraSpec] | None = None) -> None:
        if slots < 1 or workers < 1:
            raise ValueError(f"a batch ring needs slots and workers, got {slots} and {workers}")
        self.slots = slots
        self.workers = workers
        self.batch_size = batch_size
        self._owner = True
        self._control = Segment(create=True, size=header_bytes(workers) + self._control_dtype().itemsize * slots)
        self._table = _table_of(self._control, self._control_dtype(), slots, workers)
        self._header, self._attached_workers = _header_of(self._control, workers)
        self._header[0] = 0
        self._attached_workers[:] = 0
        self._all_attached = False
        self.unlinked = False
        self.joined = 0  # batches joined so far, over every iterator (owner only)
        self._unsent: dict[int, int] = {}
        self._table["name"] = b""
        self._table["free"] = CLAIMED
        self._table["signature"] = 0
        self._segments: dict[int, shared_memory.SharedMemory] = {}
        self._storages: dict[int, torch.UntypedStorage] = {}
        self._layouts: dict[int, StorageLayout] = {}
        weakref.finalize(self, _release_all, self._control, self._segments)
        _OWNED[self.name] = self
        if cameras:
            # Made now, free: the workers' first parts go in already. A segment's pages are allocated
            # when first written, so a slot no batch reaches costs nothing.
            for slot in range(slots):
                self.make(slot, cameras, claimed=False)

    @property
    def name(self) -> str:
        """The control table's segment name: what a part received from a worker names its ring by."""
        return str(self._control.name)

    def _control_dtype(self) -> np.dtype[Any]:
        return np.dtype(
            [
                ("name", f"S{NAME_BYTES}"),
                ("nbytes", "<i8"),
                ("signature", "<i8"),
                ("free", "u1", (self.workers,)),
            ]
        )

    def __getstate__(self) -> dict[str, Any]:
        return {
            "slots": self.slots,
            "workers": self.workers,
            "batch_size": self.batch_size,
            "name": self._control.name,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.slots, self.workers, self.batch_size = state["slots"], state["workers"], state["batch_size"]
        self._owner = False
        self._control = attach_untracked(state["name"])
        self._table = _table_of(self._control, self._control_dtype(), self.slots, self.workers)
        self._header, self._attached_workers = _header_of(self._control, self.workers)
        self._all_attached = False
        self.unlinked = False
        self.joined = 0
        self._unsent = {}
        self._segments = {}
        self._storages = {}
        self._layouts = {}

    # -- a worker's side ----------------------------------------------------------------------
    def slot_of(self, part: int) -> int:
        """The slot of the current iterator's ``part``-th part."""
        return (int(self._header[0]) + part) % self.slots

    def region_free(self, part: int, worker: int) -> bool:
        """Whether ``worker`` could write its ``part``-th part into the ring now."""
        slot = self.slot_of(part)
        return bool(self._table["name"][slot]) and bool(self._table["free"][slot, worker] == FREE)

    def claim(
        self, part: int, worker: int, cameras: Sequence[CameraSpec], rows: int
    ) -> dict[str, torch.Tensor] | None:
        """Views of ``worker``'s rows of its ``part``-th part's slot, one ``(rows, *shape)`` tensor per
        camera, the region marked :data:`CLAIMED`; None (write elsewhere) when the slot is not made
        yet, holds another layout, or the region is not free."""
        if not 0 <= worker < self.workers:
            return None
        if not self._all_attached:
            self._attach_all(worker)
        slot = self.slot_of(part)
        table = self._table
        offsets, nbytes = slot_layout(cameras, self.batch_size)
        first_row = self.first_row(worker)
        if (
            not table["name"][slot]
            or int(table["nbytes"][slot]) != nbytes
            or int(table["signature"][slot]) != layout_signature(cameras, self.batch_size)
            or rows != self.rows_of(worker)
            or table["free"][slot, worker] != FREE
        ):
            return None
        storage = self._attached(slot, table["name"][slot].decode())
        if storage is None:
            return None
        table["free"][slot, worker] = CLAIMED
        self._unsent[part] = slot
        views = {}
        for (key, dtype, shape), offset in zip(cameras, offsets, strict=True):
            sample_bytes = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
            views[key] = view_of(storage, offset + first_row * sample_bytes, dtype, (rows, *shape))
        return views

    def part_done(self, part: int, worker: int, sent: bool) -> None:
        """The ``part``-th part is assembled: its claim now travels with it (``sent``), or its frames
        ended elsewhere and the claim is given back."""
        slot = self._unsent.pop(part, None)
        if slot is not None and not sent:
            self.free(slot, [worker])

    def abandon_unsent(self, worker: int) -> None:
        """Give back the claims of parts never sent (their iterator was reset; no thread writes them now)."""
        for slot in self._unsent.values():
            self.free(slot, [worker])
        self._unsent.clear()

    def begin(self) -> int:
        """Start an iterator (owner only, before its workers are reset): its first part goes in the slot
        after the last batch joined; returns that slot."""
        first = self.joined % self.slots
        self._header[0] = first
        return first

    def rows_of(self, worker: int) -> int:
        """The rows of ``worker``'s region in each slot: its share of the batch."""
        return split_evenly(self.batch_size, self.workers, worker)

    def first_row(self, worker: int) -> int:
        """The first row of ``worker``'s region in each slot."""
        return sum(self.rows_of(w) for w in range(worker))

    def _attach_all(self, worker: int) -> None:
        """Attach to every slot once all are made, and say so (the owner then unlinks their names)."""
        names = self._table["name"]
        if not all(names):
            return
        if all(self._attached(slot, names[slot].decode()) is not None for slot in range(self.slots)):
            self._all_attached = True
            self._attached_workers[worker] = 1

    def unlink_once_attached(self) -> bool:
        """Unlink every segment's name once every worker has attached to every slot (owner only): the
        memory stays mapped where it is, and goes with the last process, however it ends. True once done."""
        if not self.unlinked and self._owner and bool(self._attached_workers.all()):
            for segment in [*self._segments.values(), self._control]:
                with contextlib.suppress(FileNotFoundError):
                    segment.unlink()
            self.unlinked = True
        return self.unlinked

    def _attached(self, slot: int, name: str) -> torch.UntypedStorage | None:
        segment = self._segments.get(slot)
        if segment is None or segment.name.lstrip("/") != name.lstrip("/"):
            try:
                segment = attach_untracked(name)
            except FileNotFoundError:  # the owner went away
                return None
            self._segments[slot] = segment
            self._storages[slot] = _storage_of(segment)
        return self._storages[slot]

    def slot_base(self, slot: int) -> int:
        """Where ``slot``'s memory starts in this process (attached or made already)."""
        return int(self._storages[slot].data_ptr())

    def holding(self, data_ptr: int) -> int | None:
        """The slot whose memory starts at ``data_ptr`` (in this process), if any."""
        for slot, storage in self._storages.items():
            if storage.data_ptr() == data_ptr:
                return slot
        return None

    # -- the training process's side ------------------------------------------------------------
    def made(self, slot: int) -> bool:
        """Whether the owner has made ``slot``."""
        return slot in self._layouts

    def make(self, slot: int, cameras: Sequence[CameraSpec], *, claimed: bool = True) -> dict[str, torch.Tensor]:
        """Make ``slot`` for batches of ``cameras`` (owner only), every region :data:`CLAIMED` by the
        owner (``claimed``: the caller fills the whole-batch tensors returned and hands them out with
        :meth:`deliver`) or :data:`FREE` for the workers."""
        assert self._owner and slot not in self._layouts
        offsets, nbytes = slot_layout(cameras, self.batch_size)
        segment = Segment(create=True, size=max(1, nbytes))
        self._segments[slot] = segment
        self._storages[slot] = _storage_of(segment)
        self._layouts[slot] = [
            (key, dtype, (self.batch_size, *shape), offset)
            for (key, dtype, shape), offset in zip(cameras, offsets, strict=True)
        ]
        table = self._table
        table["free"][slot] = CLAIMED if claimed else FREE
        table["nbytes"][slot] = nbytes
        table["signature"][slot] = layout_signature(cameras, self.batch_size)
        table["name"][slot] = segment.name.encode()  # last: a worker reads the name first
        return self.batch_views(slot)

    def batch_views(self, slot: int) -> dict[str, torch.Tensor]:
        """Each camera's whole-batch tensor in ``slot`` (owner only)."""
        storage = self._storages[slot]
        return {
            key: view_of(storage, offset, dtype, shape) for key, dtype, shape, offset in self._layouts[slot]
        }

    def layout(self, slot: int) -> StorageLayout:
        """``(key, dtype, whole-batch shape, byte offset)`` of each camera in ``slot`` (owner only)."""
        return self._layouts[slot]

    def part_views(
        self, slot: int, layout: Sequence[tuple[str, torch.dtype, tuple[int, ...], int]]
    ) -> dict[str, torch.Tensor]:
        """Views of ``slot`` at a part's ``(key, dtype, shape, byte offset)`` (owner only)."""
        storage = self._storages[slot]
        return {key: view_of(storage, offset, dtype, shape) for key, dtype, shape, offset in layout}

    def deliver(
        self, slot: int, tensors: dict[str, torch.Tensor], rows: int, regions: Sequence[int]
    ) -> dict[str, torch.Tensor]:
        """``tensors`` (views of ``slot``) cut to ``rows``, as views that set ``regions`` of the slot
        :data:`FREE` once the last of them (or anything made from them without a copy) is collected."""
        storage = self._storages[slot]
        buffer = self._segments[slot].buf
        assert buffer is not None
        holder = np.frombuffer(buffer, dtype=np.uint8)
        weakref.finalize(holder, _free_regions, self._table, slot, tuple(regions))
        flat = torch.frombuffer(holder, dtype=torch.uint8)  # type: ignore[call-overload]
        base = storage.data_ptr()
        out = {}
        for key, tensor in tensors.items():
            offset = tensor.data_ptr() - base
            count = tensor[:rows].numel() * tensor.element_size()
            out[key] = flat[offset : offset + count].view(tensor.dtype).view((rows, *tensor.shape[1:]))
        return out

    def free(self, slot: int, regions: Sequence[int]) -> None:
        """Hand ``regions`` of ``slot`` back to their workers (their parts were copied out)."""
        _free_regions(self._table, slot, tuple(regions))

    def close(self) -> None:
        """Detach from (and, in the owner, unlink) the control table and the slots."""
        if self._owner:
            _release_all(self._control, self._segments)
        else:
            for segment in self._segments.values():
                with contextlib.suppress(BufferError):
                    segment.close()
            with contextlib.suppress(BufferError):
                self._control.close()
        self._segments = {}
        self._storages = {}


_OWNED: weakref.WeakValueDictionary[str, BatchRing] = weakref.WeakValueDictionary()
"""The rings this process owns, by :attr:`BatchRing.name`."""


def owned_ring(name: str) -> BatchRing:
    """The ring named ``name`` that this process owns (a part received from a worker names it)."""
    ring = _OWNED.get(name)
    if ring is None:
        raise RuntimeError(
            f"a batch part names batch ring {name!r}, which this process does not hold (any more)"
        )
    return ring


def _storage_of(segment: shared_memory.SharedMemory) -> torch.UntypedStorage:
    """The segment's memory as a storage that keeps it mapped: the storage owns a numpy export of the
    buffer, so closing the segment fails (``BufferError``) while any view of the storage lives,
    instead of unmapping memory a tensor still points into."""
    buffer = segment.buf
    assert buffer is not None
    return torch.from_numpy(np.frombuffer(buffer, dtype=np.uint8)).untyped_storage()


def _table_of(control: shared_memory.SharedMemory, dtype: np.dtype[Any], slots: int, workers: int) -> np.ndarray:
    """The control table, an array that holds an export of the segment's buffer: closing the segment
    fails while the table (or a finalizer that writes into it) lives, instead of unmapping it."""
    buffer = control.buf
    assert buffer is not None
    return np.frombuffer(buffer, dtype=dtype, count=slots, offset=header_bytes(workers))


def _header_of(control: shared_memory.SharedMemory, workers: int) -> tuple[np.ndarray, np.ndarray]:
    """The header's first slot (an int64 array of one) and its per-worker attached flags."""
    buffer = control.buf
    assert buffer is not None
    return np.frombuffer(buffer, dtype="<i8", count=1), np.frombuffer(buffer, dtype=np.uint8, count=workers, offset=8)


def _free_regions(table: np.ndarray, slot: int, regions: tuple[int, ...]) -> None:
    for region in regions:
        table["free"][slot, region] = FREE


def _release_all(
    control: shared_memory.SharedMemory, segments: dict[int, shared_memory.SharedMemory]
) -> None:
    for segment in list(segments.values()):
        release(segment)
    release(control)
