"""Per-sample destinations inside the next batch's camera tensors, handed out in schedule order.

With a :class:`~lerobot_nodes.nodes.batcher.SampleBatcher` at the root, the decode threads
write each sample's camera frames straight into the batch the sample will be part of: one
``(batch_size, T, 3, H, W)`` tensor per camera (``T`` dropped when the window has one frame,
as LeRobot's samples do), all views of one storage allocated when the batch's first sample is
submitted, in shared memory inside a DataLoader worker. The batcher then finds the cameras
already in place and copies nothing (:func:`~lerobot_nodes.nodes.batcher.collate_into_one_storage`).

Samples are submitted in schedule order and delivered in the same order, so the ``n``-th
sample submitted since the last reset is sample ``n % batch_size`` of batch ``n // batch_size``
(the batcher's count from the same reset).

In the training process itself (``num_workers=0``, storages in process memory) a sample that runs
ahead into the next batch while the training step still holds one batch and the batcher fills
another is decoded into a small storage of its own (a :class:`TemporaryPlace`) instead of a third
batch storage; the batcher copies it into its batch's storage, taken once the step let go of its
batch (:func:`~lerobot_nodes.nodes.batcher.settle_temporary_places`). The decoding that overlaps a
training step is kept; the batch of frames it would have cost is not (issue 24).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from .batch_ring import BatchRing
from .recycled_storage import RecycledStorages
from .storage_views import tensors_in_one_storage

FrameSize = Callable[[str, int], tuple[int, int]]
"""``(camera, episode) -> (height, width)`` of that camera's frames (from the MP4 index)."""


class BatchPlace:
    """One sample's place in its batch's tensor of one camera.

    The decode thread writes the sample's frames into ``frames``, a numpy ``(T, 3, H, W)`` view
    (numpy, not torch: a torch call hands the interpreter lock to another thread). ``batch`` is
    the camera's whole batch as a sample would be collated (``(B, 3, H, W)``, or ``(B, T, 3, H,
    W)`` for a camera window) and ``position`` the sample's index in it, so the batcher takes
    the batch as one view, without a per-sample check.
    """

    __slots__ = ("batch", "position", "frames")

    def __init__(self, batch: torch.Tensor, position: int, frames: np.ndarray) -> None:
        self.batch = batch
        self.position = position
        self.frames = frames

    def tensor(self) -> torch.Tensor:
        """The sample's frames as a view of the batch (its collated shape, without the batch axis)."""
        return self.batch[self.position]


class TemporaryPlace(BatchPlace):
    """A sample's frames in a storage of their own, to be copied to ``position`` of its batch once
    the batch has a storage (see the module). ``batch`` holds this sample alone."""

    __slots__ = ()

    def tensor(self) -> torch.Tensor:
        return self.batch[0]


STORAGES_A_STEP_NEEDS = 2
"""Batch storages in use while nothing runs ahead: the batch a training step holds and the one the
batcher fills for its next ``next()``."""

TEMPORARIES_WORTH_IT = 4
"""Samples run ahead into temporary places only where a batch holds at least this many times the
samples that can run ahead: below that the temporaries would hold about a batch and cost copying it."""


class BatchSlots:
    """Hands out, for each submitted sample, views of its place in the batch's camera tensors.

    ``cameras`` maps each camera written in place to its frames per sample ``T``. Used from
    the thread that submits samples (the consumer); the views are written by the decode threads.
    With ``storages``, each batch's camera storage is taken from there (recycled shared memory).
    ``ahead_limit``: the samples the consumer's buffer pulls ahead of it; with storages in process
    memory, up to that many samples of a batch started ahead go to temporary places (:class:`TemporaryPlace`).
    ``ring``: in DataLoader worker ``ring_worker``, whose batches are parts joined across workers, each
    part's frames go in the worker's rows of a whole batch of the ring when it has them free
    (:mod:`~lerobot_nodes.batch_memory.batch_ring`), else in ``storages``.
    """

    def __init__(
        self,
        batch_size: int,
        cameras: Mapping[str, int],
        frame_size: FrameSize,
        *,
        return_uint8: bool,
        shared_memory: bool,
        storages: RecycledStorages | None = None,
        ahead_limit: int = 0,
        ring: BatchRing | None = None,
        ring_worker: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.cameras = dict(cameras)
        self.frame_size = frame_size
        self.dtype = torch.uint8 if return_uint8 else torch.float32
        self.shared_memory = shared_memory
        # Where a batch's camera storage comes from when it is recycled (DataLoader workers).
        self.storages = storages
        self._submitted = 0
        # Each camera's batch being filled: its collated view and the numpy array the places index.
        self._batches: dict[str, tuple[torch.Tensor, np.ndarray]] = {}
        self.ahead_limit = ahead_limit
        self.ring = ring
        self.ring_worker = ring_worker
        self._temporaries = (
            storages is not None
            and not storages.shared
            and ahead_limit > 0
            and ahead_limit * TEMPORARIES_WORTH_IT <= batch_size
        )
        # Whether the next sample is pulled ahead of the consumer (may_start_ahead() said yes to it).
        self._ahead = False
        # Temporary storages by the batch they were handed out for, and those free to write again.
        self._temporaries_of: dict[int, list[dict[str, torch.Tensor]]] = {}
        self._idle_temporaries: list[dict[str, torch.Tensor]] = []

    def may_start_ahead(self) -> bool:
        """Whether the next sample may be submitted before the consumer asks for it.

        With ``storages`` in shared memory (a DataLoader worker), a sample that starts a new batch
        is submitted ahead only when a segment the training process has released is there to
        reuse: a batch started ahead in a new segment would add a segment (a part or a whole
        batch of frames) to the worker's memory for a batch the DataLoader has not asked for yet.
        The consumer's own request always starts it (:class:`~lerobot_nodes.nodes.ordered_buffer.OrderedBuffer`
        pulls while it holds nothing), so this changes when a batch starts, never which samples it holds.
        """
        starts_storage = self._submitted % self.batch_size == 0 or not self._batches
        if self._temporaries:
            self._ahead = True  # the next sample is pulled ahead: it may wait in a temporary place
            return True
        if self.storages is None or not self.storages.shared or not starts_storage:
            return True
        if self.ring is not None and self.ring.region_free(self._submitted // self.batch_size, self.ring_worker):
            return True
        return self.storages.has_released()

    def reset(self) -> None:
        """Forget the batch being filled: the next sample starts a new one."""
        self._submitted = 0
        self._batches = {}
        self._ahead = False
        # A cancelled decode may still write into a temporary: none is handed out again.
        self._temporaries_of = {}
        self._idle_temporaries = []
        if self.ring is not None:
            self.ring.abandon_unsent(self.ring_worker)  # the decode threads were stopped before this reset

    def next_slot(self, episode: int) -> dict[str, BatchPlace]:
        """The place of each camera's frames for the next submitted sample (of ``episode``)."""
        ahead, self._ahead = self._ahead, False
        position = self._submitted % self.batch_size
        if position == 0:
            self._batches = {}
        if not self._batches:
            if ahead and self._temporaries and position < self.ahead_limit and self._storages_taken():
                tensors = self._temporary(episode, self._submitted // self.batch_size)
                self._submitted += 1
                return {
                    key: TemporaryPlace(batch, position, frames[0])
                    for key, (batch, frames) in self._collated(tensors).items()
                }
            self._batches = self._collated(self._allocate(episode))
        self._submitted += 1
        return {key: BatchPlace(batch, position, frames[position]) for key, (batch, frames) in self._batches.items()}

    def _temporary(self, episode: int, batch_number: int) -> dict[str, torch.Tensor]:
        """One sample's camera tensors in a storage of their own: a settled one written again, or a new one.

        The temporaries of batch ``n`` are free again from batch ``n + 2`` on: a sample runs at most
        ``ahead_limit`` samples ahead of the batcher and a batch holds at least four times that, so
        the batcher has collated batch ``n`` (copied its temporaries, whose decodes it waited for)
        before any sample of batch ``n + 2`` is submitted. Reusing them saves the page faults of a
        new storage per sample."""
        for number in [n for n in self._temporaries_of if n <= batch_number - 2]:
            self._idle_temporaries.extend(self._temporaries_of.pop(number))
        del self._idle_temporaries[2 * self.ahead_limit :]
        wanted = {key: shape for key, _, shape in self._specs(episode, 1)}
        reusable = next(
            (
                i
                for i, tensors in enumerate(self._idle_temporaries)
                if {key: tuple(tensor.shape) for key, tensor in tensors.items()} == wanted
            ),
            None,
        )
        tensors = self._idle_temporaries.pop(reusable) if reusable is not None else self._allocate(episode, rows=1)
        self._temporaries_of.setdefault(batch_number, []).append(tensors)
        return tensors

    def _storages_taken(self) -> bool:
        """Whether a new batch storage now would be one more than a training step needs."""
        assert self.storages is not None
        return self.storages.in_use() >= STORAGES_A_STEP_NEEDS

    def _collated(self, tensors: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, np.ndarray]]:
        """Each camera's tensor as a sample would be collated (``T`` dropped for one frame), and its numpy view."""
        return {
            key: (tensor.squeeze(1) if self.cameras[key] == 1 else tensor, tensor.numpy())
            for key, tensor in tensors.items()
        }

    def forget_place(self) -> None:
        """A sample handed a place was dropped (``streaming_bad_episodes=skip``): the next sample takes
        the position the dropped one would have been delivered at, so later batches are whole views again.

        The places already handed out keep their storage (their decode threads may still write
        there); the next sample starts a new one, so no place is handed out twice. The batch the
        dropped sample belonged to mixes two storages and is copied by the batcher.
        """
        self._submitted -= 1
        self._batches = {}

    def _specs(self, episode: int, rows: int) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """``(camera, dtype, shape)`` of ``rows`` samples of ``episode``, as their storage holds them."""
        specs: list[tuple[str, torch.dtype, tuple[int, ...]]] = []
        for key, frames in self.cameras.items():
            height, width = self.frame_size(key, episode)
            specs.append((key, self.dtype, (rows, frames, 3, height, width)))
        return specs

    def _allocate(self, episode: int, rows: int | None = None) -> dict[str, torch.Tensor]:
        """A batch's camera tensors in one storage (recycled where ``storages`` is given), or with
        ``rows``, that many samples' in a storage of their own."""
        specs = self._specs(episode, rows or self.batch_size)
        if rows is not None:
            return tensors_in_one_storage(specs, self.shared_memory)
        if self.ring is not None and self._submitted % self.batch_size == 0:
            in_ring = self._claim_in_ring(specs)
            if in_ring is not None:
                return in_ring
        return tensors_in_one_storage(specs, self.shared_memory, self.storages.take if self.storages else None)

    def _claim_in_ring(self, specs: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> dict[str, torch.Tensor] | None:
        """This part's camera tensors in the worker's rows of its ring slot, if free (see the module)."""
        assert self.ring is not None
        # The ring lays cameras out as a batch is collated: one frame per sample drops the T axis.
        collated = [(key, dtype, shape[2:] if self.cameras[key] == 1 else shape[1:]) for key, dtype, shape in specs]
        views = self.ring.claim(self._submitted // self.batch_size, self.ring_worker, collated, self.batch_size)
        if views is None:
            return None
        if self.storages is not None:
            self.storages.shed_released()  # parts written before the ring had slots: not needed again
            self.storages.metrics.add("batch_parts_in_ring", 1)
        return {key: views[key].view(shape) for key, _, shape in specs}
