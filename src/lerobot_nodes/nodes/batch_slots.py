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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from .recycled_storage import RecycledStorages
from .storage_views import tensors_in_one_storage

FrameSize = Callable[[str, int], tuple[int, int]]
"""``(camera, episode) -> (height, width)`` of that camera's frames (from the MP4 index)."""


class BatchSlots:
    """Hands out, for each submitted sample, views of its place in the batch's camera tensors.

    ``cameras`` maps each camera written in place to its frames per sample ``T``. Used from
    the thread that submits samples (the consumer); the views are written by the decode threads.
    With ``storages``, each batch's camera storage is taken from there (recycled shared memory).
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
        # Each camera's per-sample views of the batch being filled, made in one call per camera.
        self._places: dict[str, tuple[torch.Tensor, ...]] = {}

    def reset(self) -> None:
        """Forget the batch being filled: the next sample starts a new one."""
        self._submitted = 0
        self._places = {}

    def next_slot(self, episode: int) -> dict[str, torch.Tensor]:
        """The ``(T, 3, H, W)`` destination of each camera for the next submitted sample (of ``episode``)."""
        position = self._submitted % self.batch_size
        if position == 0:
            self._places = {key: tensor.unbind(0) for key, tensor in self._allocate(episode).items()}
        self._submitted += 1
        return {key: places[position] for key, places in self._places.items()}

    def _allocate(self, episode: int) -> dict[str, torch.Tensor]:
        specs = []
        for key, frames in self.cameras.items():
            height, width = self.frame_size(key, episode)
            specs.append((key, self.dtype, (self.batch_size, frames, 3, height, width)))
        return tensors_in_one_storage(specs, self.shared_memory, self.storages.take if self.storages else None)
