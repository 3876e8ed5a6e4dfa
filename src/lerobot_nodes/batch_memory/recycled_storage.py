"""Batch storages written again once the training process has let go of the batch.

A new shared-memory segment costs far more than the copy into it: the kernel allocates,
zeroes and maps every 4 KiB page when the segment is created and first written, and frees
them all when the last process unmaps it. For the ~15 MB camera storage of a batch that is
about 15 ms of a worker's CPU per batch (2-core VM, kernel 6.18), a third of what decoding the
batch costs. :class:`RecycledStorages` hands out storages that are written again once the
training process no longer uses them, so their pages are allocated once. With
``num_workers=0`` the graph recycles the (process memory) storages of the batches it hands
out the same way (:meth:`RecycledBatch.delivered`).

The training process says when: a storage ends with a :data:`TRAILER_BYTES` trailer whose first
byte is :data:`IN_USE` while a receiver may read the storage. A batch whose camera storage is
recycled travels as a :class:`RecycledBatch`; unpickled in the training process it becomes a
plain ``dict`` whose tensors are views of that storage held through one numpy array, and a
finalizer on that array writes :data:`RELEASED` into the trailer when the last view (or
anything derived from it without a copy) is gone. Only then does the worker write the storage
again. A batch the training process never unpickles (a loader shut down with batches in
flight) keeps its storage :data:`IN_USE`; the worker drops such a storage from its list when it
needs room, and the memory goes when the last process holding it unmaps it.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..metrics import MetricsSink, NullMetrics
from .storage_views import ALIGNMENT, StorageLayout, new_storage, split_by_storage, view_of

TRAILER_BYTES = ALIGNMENT
"""Bytes after the payload of a recycled storage; the first says whether a receiver holds it."""

IN_USE = 0
RELEASED = 1

DEFAULT_BATCHES_IN_FLIGHT = 6
"""Batches a worker may have sent that the training process still holds: the DataLoader's
``prefetch_factor`` (4 with ``streaming_dataloader``, LeRobot's default), the batch a training
step holds and the one it holds while the next is fetched."""

SPARE = 0
"""Released storages kept beside the one a batch reuses. None: in steady state one batch is
released per batch taken, and a spare would idle at the size of a batch (the camera segment
of 3 cameras at 640x480 and batch 32 is 88 MB)."""

IN_PROCESS_KEEP = 4
"""Storages kept when batches are handed out in this process (``num_workers=0``): while a
training step's ``next()`` assembles batch n + 1, the step still holds batch n and the ordered
buffer may start batch n + 2 (it runs ``streaming_decoded_queue_size`` samples ahead); one more
for the batch n - 1 that n + 2 reuses once released (with 3, measured: 1 reuse in 84 batches)."""

DEFAULT_KEEP = DEFAULT_BATCHES_IN_FLIGHT + 1
"""Storages a worker keeps for reuse: the batches in flight and the one being filled."""


class RecycledStorages:
    """Batch storages, handed out again once released: shared memory in a DataLoader worker.

    Guarantee: :meth:`take` returns a storage only while no receiver can still read it: a new
    one, or one whose trailer a receiver set to :data:`RELEASED`. ``shared``: storages in shared
    memory (a DataLoader worker's); else process memory, for batches handed out in this process
    (:meth:`RecycledBatch.delivered`). At most ``keep`` storages are kept; ``reused`` and
    ``created`` count what :meth:`take` returned (also in ``metrics`` as
    ``batch_segments_reused``/``_created``). Used from one thread.
    """

    def __init__(self, keep: int = DEFAULT_KEEP, metrics: MetricsSink | None = None, *, shared: bool = True) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self.shared = shared
        self.metrics = metrics or NullMetrics()
        self._kept: list[torch.UntypedStorage] = []
        self.reused = 0
        self.created = 0

    def take(self, nbytes: int) -> torch.UntypedStorage:
        """A storage of ``nbytes`` plus the trailer, marked :data:`IN_USE`.

        Released storages beyond the one reused and :data:`SPARE` more are dropped: memory a
        slower consumer gave back goes back to the system instead of idling here.
        """
        total = int(nbytes) + TRAILER_BYTES
        released = [storage for storage in self._kept if storage[storage.nbytes() - TRAILER_BYTES] == RELEASED]
        reusable = next((storage for storage in released if storage.nbytes() == total), None)
        spares = [storage for storage in released if storage is not reusable]
        for idle in spares[: max(0, len(spares) - SPARE)]:
            self._kept.remove(idle)
        if reusable is not None:
            reusable[total - TRAILER_BYTES] = IN_USE
            self._kept.remove(reusable)
            self._kept.append(reusable)  # most recently used last
            self.reused += 1
            self.metrics.add("batch_segments_reused", 1)
            return reusable
        created = new_storage(total, self.shared)
        created[total - TRAILER_BYTES] = IN_USE
        self._kept.append(created)
        if len(self._kept) > self.keep:
            # The least recently used: released and idle, or held by a receiver that never
            # unpickled its batch. Either way only this reference goes; the memory goes with
            # the last mapping.
            self._kept.pop(0)
        self.created += 1
        self.metrics.add("batch_segments_created", 1)
        return created

    def in_use(self) -> int:
        """Kept storages not :data:`RELEASED`: a receiver holds them, or a batch is being written into one."""
        return sum(storage[storage.nbytes() - TRAILER_BYTES] != RELEASED for storage in self._kept)

    def has_released(self) -> bool:
        """Whether a kept storage is :data:`RELEASED` (:meth:`take` can reuse it instead of creating one,
        when its size fits)."""
        return any(storage[storage.nbytes() - TRAILER_BYTES] == RELEASED for storage in self._kept)

    def shed_released(self) -> None:
        """Forget the kept storages no receiver holds (their memory goes with the last mapping): the
        batches are written elsewhere now (:mod:`~lerobot_nodes.batch_memory.batch_ring`)."""
        self._kept = [storage for storage in self._kept if storage[storage.nbytes() - TRAILER_BYTES] != RELEASED]

    def holding(self, data_ptr: int) -> torch.UntypedStorage | None:
        """The kept storage whose memory starts at ``data_ptr``, if any."""
        for storage in self._kept:
            if storage.data_ptr() == data_ptr:
                return storage
        return None

    def clear(self) -> None:
        """Forget every kept storage (their memory goes with the last mapping)."""
        self._kept.clear()


class RecycledBatch(dict):  # type: ignore[type-arg]
    """A batch (``dict``) whose tensors partly live in a recycled storage (``storage``).

    In the worker it is a plain dict. Pickled to the training process it becomes a ``dict``
    with the same keys in the same order, its storage's tensors views of one array that marks
    the storage :data:`RELEASED` when it is collected (see the module).
    """

    def __init__(self, items: dict[str, Any], storage: torch.UntypedStorage) -> None:
        super().__init__(items)
        self.storage = storage

    def __copy__(self) -> RecycledBatch:
        # torch's default_convert copies a mapping before updating it: keep the class.
        return RecycledBatch(dict(self), self.storage)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        # A deep copy owns its data: a plain dict, the storage not recycled through it.
        return {key: copy.deepcopy(value, memo) for key, value in self.items()}

    def __reduce__(self) -> tuple[Callable[..., dict[str, Any]], tuple[Any, ...]]:
        return receive_recycled_batch, self.parts()

    def delivered(self) -> dict[str, Any]:
        """The batch as a receiver gets it, without a process boundary (``num_workers=0``)."""
        return receive_recycled_batch(*self.parts())

    def parts(
        self,
    ) -> tuple[torch.Tensor, StorageLayout, dict[str, Any], list[str]]:
        """The storage as one uint8 tensor, ``(key, dtype, shape, byte offset)`` of the tensors in
        it, the other items, and the key order: what :func:`receive_recycled_batch` takes."""
        storage = self.storage
        layout, rest = split_by_storage(self, storage.data_ptr())
        whole = view_of(storage, 0, torch.uint8, (storage.nbytes(),))
        return whole, layout, rest, list(self.keys())


def receive_recycled_batch(
    whole: torch.Tensor,
    layout: StorageLayout,
    rest: dict[str, Any],
    order: list[str],
) -> dict[str, Any]:
    """The training process's side of :meth:`RecycledBatch.__reduce__`: a plain ``dict`` batch."""
    holder = whole.numpy()
    weakref.finalize(holder, _release, whole)
    # frombuffer keeps ``holder`` alive as long as any tensor made from it.
    flat = torch.frombuffer(holder, dtype=torch.uint8)  # type: ignore[call-overload]
    views: dict[str, torch.Tensor] = {}
    for key, dtype, shape, offset in layout:
        count = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
        views[key] = flat[offset : offset + count].view(dtype).view(shape)
    return {key: views[key] if key in views else rest[key] for key in order}


def _release(whole: torch.Tensor) -> None:
    whole[whole.numel() - TRAILER_BYTES] = RELEASED
