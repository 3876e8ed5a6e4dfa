"""Batches that hold samples of every DataLoader worker: each worker assembles a part, the training
process joins one part of each (issue 24).

A DataLoader batch otherwise comes from one worker, and a worker reads only its share of the
rank's episodes: with two workers a batch saw half the episodes a shuffle's would. Here worker
``w`` of ``W`` assembles parts of :func:`part_size` samples (the batch size split as evenly as
integers allow), the DataLoader hands the parts over in its usual round-robin order, and
:class:`JoinedParts` joins every ``W`` consecutive parts into one batch, so each batch is drawn
from every worker's pool. An epoch's last batches join what is left (workers whose epoch ended
are skipped by the DataLoader, as before), so every sample is still in exactly one batch.

Without ``pin_memory`` the workers decode their parts' frames straight into their rows of one
shared batch (a :class:`~lerobot_nodes.batch_memory.batch_ring.BatchRing` slot), so the join copies
only the small keys (state, action, task); a part that could not be written there is copied, on the
training thread alone (:func:`copy_rows`; about 20-30 ms for the 88 MB of 3 cameras at 480x640 and
batch 32 on this 2-core VM). With ``pin_memory`` every batch is such a copy, into a pinned storage,
and the DataLoader's own pinning copy is not made, so on a GPU machine the join replaces a copy
rather than adding one.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .batch_ring import BatchRing, CameraSpec, owned_ring
from .recycled_storage import IN_PROCESS_KEEP, RecycledBatch, RecycledStorages
from .storage_views import StorageLayout, split_by_storage, tensors_in_one_storage


def part_size(batch_size: int, num_workers: int, worker: int) -> int:
    """Samples per part of ``worker`` (its schedule's position) when ``num_workers`` workers each
    contribute a part to every batch of ``batch_size``: near-equal integers summing to ``batch_size``."""
    workers = max(1, int(num_workers))
    if batch_size < workers:
        raise ValueError(f"a batch of {batch_size} cannot take a part from each of {workers} workers")
    return batch_size // workers + (1 if worker % workers < batch_size % workers else 0)


def join_parts(
    parts: Sequence[dict[str, Any]],
    *,
    pin_memory: bool = False,
    allocate: Callable[[int], torch.UntypedStorage] | None = None,
    whole: bool = False,
) -> dict[str, Any]:
    """One batch holding the samples of ``parts`` in order, every tensor a view of one storage:
    a new one (pinned with ``pin_memory``), or ``allocate(nbytes)``'s.

    Parts are batches with the same keys, each tensor's trailing shape and dtype equal across
    parts (what workers of one dataset assemble); lists (``task``) are concatenated. One part is
    returned as it is (nothing to join), unless ``whole`` (its storage is lent: copy it)."""
    if len(parts) == 1 and not pin_memory and not whole:
        return parts[0]
    first = parts[0]
    specs = []
    for key, value in first.items():
        if isinstance(value, torch.Tensor):
            rows = sum(int(part[key].shape[0]) for part in parts)
            specs.append((key, value.dtype, (rows, *value.shape[1:])))
    views = tensors_in_one_storage(specs, shared=False, allocate=_pinned if pin_memory else allocate)
    batch: dict[str, Any] = {}
    for key, value in first.items():
        if key in views:
            out, start = views[key], 0
            for part in parts:
                rows = int(part[key].shape[0])
                copy_rows(out[start : start + rows], part[key])
                start += rows
            batch[key] = out
        elif isinstance(value, list):
            batch[key] = [item for part in parts for item in part[key]]
        else:
            raise TypeError(f"cannot join batch parts holding {type(value).__name__} under {key!r}")
    return batch


def copy_rows(target: torch.Tensor, source: torch.Tensor) -> None:
    """``target[...] = source`` on this thread alone.

    ``Tensor.copy_`` of a few MB runs as an OpenMP region on every intra-op thread; in a training
    process on a busy machine its threads wait for each other (measured: 22 ms for a 3.7 MB camera
    part on 2 loaded cores, where numpy's single-threaded copy took 0.7 ms). Dtypes numpy lacks
    (bfloat16) go through torch.
    """
    try:
        np.copyto(target.numpy(), source.numpy())
    except TypeError:
        target.copy_(source)


def _pinned(nbytes: int) -> torch.UntypedStorage:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).untyped_storage()


class RingPart(dict):  # type: ignore[type-arg]
    """A worker's part (``dict``) whose cameras are views of its rows of ring ``slot`` (worker side).

    Pickled to the training process it carries the cameras' places, not their bytes, and becomes a
    :class:`ReceivedRingPart`."""

    def __init__(self, items: dict[str, Any], ring: BatchRing, slot: int, worker: int) -> None:
        super().__init__(items)
        self.ring = ring
        self.slot = slot
        self.worker = worker

    def __copy__(self) -> RingPart:
        # torch's default_convert copies a mapping before updating it: keep the class.
        return RingPart(dict(self), self.ring, self.slot, self.worker)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {key: copy.deepcopy(value, memo) for key, value in self.items()}

    def __reduce__(self) -> tuple[Callable[..., ReceivedRingPart], tuple[Any, ...]]:
        layout, rest = split_by_storage(self, self.ring.slot_base(self.slot))
        return ReceivedRingPart, (self.ring.name, self.slot, self.worker, layout, rest, list(self.keys()))


class ReceivedRingPart:
    """A part as the training process receives it from a :class:`RingPart`: the places of its cameras
    in the slot of ring ``ring_name`` (which this process owns), and its other items (``rest``)."""

    def __init__(
        self,
        ring_name: str,
        slot: int,
        worker: int,
        layout: StorageLayout,
        rest: dict[str, Any],
        order: list[str],
    ) -> None:
        self.ring = owned_ring(ring_name)
        self.slot = slot
        self.worker = worker
        self.layout = layout
        self.rest = rest
        self.order = order
        # A part the DataLoader drops (a new iterator started with parts in flight) gives its region back.
        self._region = weakref.finalize(self, self.ring.free, slot, [worker])

    def handed_over(self) -> None:
        """The region now belongs to a batch delivered in place (freed when that batch goes)."""
        self._region.detach()

    def copied(self) -> None:
        """The part's frames were copied out: give its region back now."""
        self._region()

    @property
    def rows(self) -> int:
        return int(self.layout[0][2][0]) if self.layout else 0

    def as_dict(self) -> dict[str, Any]:
        """The part as a plain ``dict``, its cameras views of the slot (to be copied before the slot is freed)."""
        cameras = self.ring.part_views(self.slot, self.layout)
        return {key: cameras[key] if key in cameras else self.rest[key] for key in self.order}


def camera_specs(part: dict[str, Any]) -> list[CameraSpec]:
    """The cameras of a part received whole: the tensors that share the storage of its largest one
    (the frames decoded in place), in their order in that storage, each as ``(key, dtype, sample shape)``."""
    tensors = {key: value for key, value in part.items() if isinstance(value, torch.Tensor)}
    if not tensors:
        return []
    largest = max(tensors.values(), key=lambda tensor: tensor.numel() * tensor.element_size())
    base = largest.untyped_storage().data_ptr()
    shared = [
        (int(tensor.storage_offset()) * tensor.element_size(), key, tensor)
        for key, tensor in tensors.items()
        if tensor.untyped_storage().data_ptr() == base and tensor.is_contiguous()
    ]
    return [
        (key, tensor.dtype, tuple(tensor.shape[1:]))
        for _, key, tensor in sorted(shared, key=lambda item: item[0])
    ]


class JoinedParts(Iterator[dict[str, Any]]):
    """The batches of ``parts`` (a DataLoader iterator of worker parts), ``num_parts`` parts each.

    Guarantee: every part is in exactly one batch, in the order the parts arrive; a batch is cut
    short only where ``parts`` ends (the epoch's last). Called between batches, the DataLoader's
    ``state_dict()`` is at a batch boundary, so a resumed loader joins the same parts again.

    With ``ring`` (the :class:`~lerobot_nodes.batch_memory.batch_ring.BatchRing` the workers write
    into), batch ``n``'s cameras are slot ``(first_slot + n) % ring.slots`` (``first_slot``: what
    ``ring.begin()`` returned before the workers were reset; None: call it now): views of it when every part was written
    there in order (``in_ring`` counts them), else the parts are copied into it when the slot is not
    made yet (``slots_made``), else into a storage of this process (``copied``).

    Unpinned batches that are copied are written into storages recycled once the training step has
    let go of the batch (:class:`~lerobot_nodes.batch_memory.recycled_storage.RecycledStorages` in
    process memory, :data:`IN_PROCESS_KEEP` kept): a fresh storage would cost a page fault per 4 KiB
    written, about as much as the copy. A batch you keep is never written to.
    """

    def __init__(
        self,
        parts: Iterator[Any],
        num_parts: int,
        *,
        pin_memory: bool = False,
        ring: BatchRing | None = None,
        first_slot: int | None = None,
    ) -> None:
        self.parts = parts
        self.num_parts = max(1, int(num_parts))
        self.pin_memory = pin_memory
        self.ring = ring
        self.storages = RecycledStorages(IN_PROCESS_KEEP, shared=False)
        self._number = 0
        # The slot of this iterator's first batch (BatchRing.begin, called before the workers were reset).
        self.first_slot = ring.begin() if ring is not None and first_slot is None else (first_slot or 0)
        self.in_ring = 0
        self.slots_made = 0
        self.copied = 0
        self.rows_moved = 0

    def __iter__(self) -> JoinedParts:
        return self

    def __next__(self) -> dict[str, Any]:
        taken: list[Any] = []
        while len(taken) < self.num_parts:
            try:
                taken.append(next(self.parts))
            except StopIteration:
                break
        if not taken:
            raise StopIteration
        number, self._number = self._number, self._number + 1
        if self.ring is not None and not self.ring.unlinked:
            self.ring.unlink_once_attached()
        if self.ring is not None and not self.pin_memory:
            self.ring.joined += 1
            batch = self._joined_in_ring(taken, (self.first_slot + number) % self.ring.slots)
            if batch is not None:
                return batch
        in_ring = [part for part in taken if isinstance(part, ReceivedRingPart)]
        parts = [part.as_dict() if isinstance(part, ReceivedRingPart) else part for part in taken]
        try:
            return self._copied(parts, whole=bool(in_ring))
        finally:
            for part in in_ring:
                part.copied()

    def _copied(self, parts: list[dict[str, Any]], whole: bool) -> dict[str, Any]:
        """The parts copied into one storage (``whole``: even a single part, whose storage is lent)."""
        if self.pin_memory or (len(parts) == 1 and not whole):
            return join_parts(parts, pin_memory=self.pin_memory)
        self.copied += 1
        held: list[torch.UntypedStorage] = []

        def allocate(nbytes: int) -> torch.UntypedStorage:
            held.append(self.storages.take(nbytes))
            return held[0]

        batch = join_parts(parts, allocate=allocate, whole=True)
        return RecycledBatch(batch, held[0]).delivered()

    def _joined_in_ring(self, taken: list[Any], slot: int) -> dict[str, Any] | None:
        """The batch with its cameras in ``slot``: views where every part was written there in order,
        a copy into it where the slot is not made yet; None where neither is the case."""
        ring = self.ring
        assert ring is not None
        if all(isinstance(part, ReceivedRingPart) for part in taken):
            if not self._in_their_regions(taken, slot):
                return None
            views = ring.batch_views(slot)
            rows = 0
            for part in taken:
                # A short part (an epoch's last batch) leaves a gap before the next worker's rows: those
                # rows move down into it, inside the regions this batch's parts hold.
                first_row = ring.first_row(part.worker)
                if first_row != rows:
                    for view in views.values():
                        copy_rows(view[rows : rows + part.rows], view[first_row : first_row + part.rows])
                    self.rows_moved += part.rows
                rows += part.rows
            cameras = ring.deliver(slot, views, rows, [part.worker for part in taken])
            for part in taken:
                part.handed_over()
            self.in_ring += 1
            self.storages.shed_released()
            rest = join_parts([part.rest for part in taken])
            return {key: cameras[key] if key in cameras else rest[key] for key in taken[0].order}
        if any(isinstance(part, ReceivedRingPart) for part in taken) or ring.made(slot):
            return None
        specs = camera_specs(taken[0])
        rows = sum(int(part[specs[0][0]].shape[0]) for part in taken) if specs else 0
        if not specs or rows > ring.batch_size or any(camera_specs(part) != specs for part in taken[1:]):
            return None
        views = ring.make(slot, specs)
        self.slots_made += 1
        for key, _, _ in specs:
            start = 0
            for part in taken:
                count = int(part[key].shape[0])
                copy_rows(views[key][start : start + count], part[key])
                start += count
        cameras = ring.deliver(slot, views, rows, range(ring.workers))
        rest = join_parts(
            [{key: value for key, value in part.items() if key not in cameras} for part in taken]
        )
        return {key: cameras[key] if key in cameras else rest[key] for key in taken[0]}

    def _in_their_regions(self, taken: list[ReceivedRingPart], slot: int) -> bool:
        """Whether ``taken`` are parts of workers ``0, 1, ...`` in that order, all in ``slot``, each
        camera at the start of its worker's rows of the slot's layout (a part may be short)."""
        ring = self.ring
        assert ring is not None
        if not ring.made(slot):
            return False
        layout = {key: (dtype, shape, offset) for key, dtype, shape, offset in ring.layout(slot)}
        for position, part in enumerate(taken):
            if part.slot != slot or part.worker != position or len(part.layout) != len(layout):
                return False
            first_row = ring.first_row(part.worker)
            if part.rows > ring.rows_of(part.worker):
                return False
            for key, dtype, shape, offset in part.layout:
                if key not in layout:
                    return False
                whole_dtype, whole_shape, whole_offset = layout[key]
                sample_bytes = int(np.prod(whole_shape[1:], dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
                if (
                    dtype != whole_dtype
                    or tuple(shape[1:]) != tuple(whole_shape[1:])
                    or offset != whole_offset + first_row * sample_bytes
                ):
                    return False
        return True

    def __getattr__(self, name: str) -> Any:
        # The DataLoader iterator's own attributes (``_num_yielded``, ``state_dict``, ...).
        return getattr(self.parts, name)
