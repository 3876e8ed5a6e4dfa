"""Whole batches assembled where the samples are made: in the DataLoader worker.

:class:`SampleBatcher` pulls ``batch_size`` samples in schedule order and collates them as
``torch.utils.data.default_collate`` does (tensors stacked, strings listed), into tensors that
are views of one storage allocated per batch: in shared memory inside a DataLoader worker,
so a batch crosses to the training process as shared-memory segments and the training
process does no per-sample work. Camera frames are normally decoded straight into their batch
(:class:`~lerobot_nodes.batch_memory.batch_slots.BatchSlots`) and not copied again: a batch is then
two segments, the cameras' and the other keys'. With ``recycled``, the cameras' storage is one
written again once the training process has released it
(:mod:`~lerobot_nodes.batch_memory.recycled_storage`): in a worker the batch is a
:class:`~lerobot_nodes.batch_memory.recycled_storage.RecycledBatch`, a plain ``dict`` once received;
in the training process itself it is that plain ``dict`` already.
The last batch of an epoch holds what is left (no sample is dropped).

State is transparent: the state of its source at the last batch boundary, in the source's
own layout, so states taken with and without batching are interchangeable and a restore
starts the next batch where the saved one ended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate
from torchdata.nodes import BaseNode

from ..batch_memory.batch_ring import BatchRing
from ..batch_memory.batch_slots import BatchPlace, TemporaryPlace
from ..batch_memory.recycled_storage import RecycledBatch, RecycledStorages
from ..batch_memory.storage_views import tensors_in_one_storage, view_of
from ..batch_memory.worker_parts import RingPart
from ..sample.batch_rows import PartialSample, dataset_indexes, gather_rows, row_layout


def assembled_in_place(column: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The batch of ``column`` as one view, when its tensors already lie back to back in one
    storage starting at its first element (cameras decoded into their batch by
    :class:`~lerobot_nodes.batch_memory.batch_slots.BatchSlots`); else None."""
    first = column[0]
    if not first.is_contiguous():
        return None
    storage = first.untyped_storage()
    base, start, step = storage.data_ptr(), first.storage_offset(), first.numel()
    for position, tensor in enumerate(column):
        if (
            tensor.untyped_storage().data_ptr() != base
            or tensor.storage_offset() != start + position * step
            or tensor.shape != first.shape
            or tensor.dtype != first.dtype
            or not tensor.is_contiguous()
        ):
            return None
    return view_of(storage, int(start) * first.element_size(), first.dtype, (len(column), *first.shape))


def collate_into_one_storage(samples: Sequence[dict[str, Any]], shared: bool) -> dict[str, Any]:
    """``default_collate(samples)`` for flat sample dicts, every tensor a view of one new storage.

    ``shared``: the storage is created in shared memory (what a DataLoader worker sends).
    Keys keep their order; samples must have the keys, dtypes and shapes of the first. A key
    whose tensors are already in place (:func:`assembled_in_place`) is not copied: the batch
    holds that view (the cameras' own storage, a second segment).
    """
    first = samples[0]
    count = len(samples)
    in_place: dict[str, torch.Tensor] = {}
    for key, value in first.items():
        if isinstance(value, torch.Tensor):
            view = assembled_in_place([sample[key] for sample in samples])
            if view is not None:
                in_place[key] = view
    views = tensors_in_one_storage(
        [
            (key, value.dtype, (count, *value.shape))
            for key, value in first.items()
            if isinstance(value, torch.Tensor) and key not in in_place
        ],
        shared,
    )
    batch: dict[str, Any] = {}
    for key, value in first.items():
        if key in in_place:
            batch[key] = in_place[key]
            continue
        column = [sample[key] for sample in samples]
        if key in views:
            try:
                batch[key] = torch.stack(column, out=views[key])
            except RuntimeError as error:
                shapes = sorted({tuple(v.shape) for v in column})
                raise RuntimeError(f"cannot batch {key!r}: samples hold shapes {shapes}: {error}") from None
        elif isinstance(value, str):
            batch[key] = column
        else:
            batch[key] = default_collate(column)
    return batch


def batch_of_places(column: Sequence[Any]) -> torch.Tensor | None:
    """The batch of ``column`` as one view when it holds the places of one batch in order from
    its first (:class:`~lerobot_nodes.batch_memory.batch_slots.BatchPlace`, frames written in place); else None."""
    first = column[0]
    if not isinstance(first, BatchPlace):
        return None
    batch = first.batch
    for position, place in enumerate(column):
        if not isinstance(place, BatchPlace) or place.batch is not batch or place.position != position:
            return None
    return batch if len(column) == len(batch) else batch[: len(column)]


def settle_temporary_places(column: Sequence[Any]) -> torch.Tensor | None:
    """The batch of ``column`` as one view when its places are those of one batch in order from its
    first, some of them temporary (:class:`~lerobot_nodes.batch_memory.batch_slots.TemporaryPlace`): their
    frames are copied into their positions of the batch first. None when the column is anything
    else (no place in a batch storage, two storages, another order): the caller copies it whole."""
    batch = next((place.batch for place in column if type(place) is BatchPlace), None)
    if batch is None:
        return None
    for position, place in enumerate(column):
        if not isinstance(place, BatchPlace) or place.position != position:
            return None
        if type(place) is BatchPlace and place.batch is not batch:
            return None
    for place in column:
        if isinstance(place, TemporaryPlace):
            np.copyto(batch[place.position].numpy(), place.tensor().numpy())
    return batch if len(column) == len(batch) else batch[: len(column)]


def _completed(sample: PartialSample) -> dict[str, Any]:
    """The whole sample, its cameras written in place as views of their batch (which the collate recognises);
    frames in a temporary storage, which is written again for a later batch, as a copy."""
    cameras = {
        key: (value.tensor().clone() if isinstance(value, TemporaryPlace) else value.tensor())
        if isinstance(value, BatchPlace)
        else value
        for key, value in sample.cameras.items()
    }
    return dataclasses.replace(sample, cameras=cameras).complete()


DATASET_INDEX_KEY = "dataset_index"


def collate_partial_samples(samples: Sequence[PartialSample], shared: bool) -> dict[str, Any]:
    """:func:`collate_into_one_storage` of the completed samples, with the rows gathered per
    episode straight into the batch's storage (:mod:`lerobot_nodes.sample.batch_rows`); cameras
    decoded in place are not copied, others (depth) are stacked into the same storage."""
    first = samples[0]
    count = len(samples)
    layout = row_layout(first.spec, [sample.episode for sample in samples], count)
    if layout is None:
        return collate_into_one_storage([_completed(sample) for sample in samples], shared)
    cameras: dict[str, torch.Tensor | None] = {}
    copied: dict[str, list[torch.Tensor]] = {}
    for key in first.cameras:
        column = [sample.cameras[key] for sample in samples]
        cameras[key] = batch_of_places(column)
        if cameras[key] is None:
            cameras[key] = settle_temporary_places(column)
        if cameras[key] is None:
            tensors = [value.tensor() if isinstance(value, BatchPlace) else value for value in column]
            # A temporary storage is written again for a later batch: never a batch's own.
            temporary = any(isinstance(value, TemporaryPlace) for value in column)
            cameras[key] = None if temporary else assembled_in_place(tensors)
            if cameras[key] is None:
                copied[key] = tensors
    specs = [(key, tensors[0].dtype, (count, *tensors[0].shape)) for key, tensors in copied.items()]
    specs += [(key, torch.from_numpy(np.empty(0, dtype)).dtype, shape) for key, dtype, shape in layout]
    picks = [(sample.episode, sample.frame) for sample in samples]
    datasets = dataset_indexes(picks)
    if datasets is not None:
        specs.append((DATASET_INDEX_KEY, torch.int64, (count,)))
    views = tensors_in_one_storage(specs, shared)
    batch: dict[str, Any] = {}
    for key, view in cameras.items():
        batch[key] = view if view is not None else torch.stack(copied[key], out=views[key])
    arrays = {key: views[key].numpy() for key, _, _ in layout}
    tasks = gather_rows(first.spec, picks, arrays)
    for key, _, _ in layout:
        batch[key] = views[key]
    batch["task"] = tasks
    if datasets is not None:  # a mixture's batch: each sample's dataset_index, stacked as default_collate does
        batch[DATASET_INDEX_KEY] = views[DATASET_INDEX_KEY].copy_(torch.tensor(datasets, dtype=torch.int64))
    return batch


class SampleBatcher(BaseNode[dict[str, Any]]):
    """Batches of ``batch_size`` samples of ``source``, collated into one storage per batch.

    Guarantees: samples keep the source's order and each is in exactly one batch; every batch
    but an epoch's last has ``batch_size`` samples. An error of the source is raised as it is;
    the state still points at the start of the failed batch.
    """

    def __init__(
        self,
        source: BaseNode[dict[str, Any]],
        batch_size: int,
        *,
        shared_memory: bool = False,
        recycled: RecycledStorages | None = None,
        ring: BatchRing | None = None,
        ring_worker: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.source = source
        self.batch_size = batch_size
        self.shared_memory = shared_memory
        # The storages camera frames were decoded into (BatchSlots'), recycled once released.
        self.recycled = recycled
        # The shared batches this worker's parts were decoded into when they were free (BatchSlots' ring).
        self.ring = ring
        self.ring_worker = ring_worker
        self._parts = 0  # parts assembled since the last reset: the ring numbers them the same way
        self._boundary: dict[str, Any] | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state)
        self._parts = 0
        self._boundary = initial_state if initial_state is not None else self.source.state_dict()

    def next(self) -> dict[str, Any]:
        samples: list[dict[str, Any]] = []
        while len(samples) < self.batch_size:
            try:
                samples.append(next(self.source))
            except StopIteration:
                break
        if not samples:
            raise StopIteration
        if isinstance(samples[0], PartialSample):
            batch = collate_partial_samples(samples, self.shared_memory)  # type: ignore[arg-type]
        else:
            batch = collate_into_one_storage(samples, self.shared_memory)
        self._boundary = self.source.state_dict()
        if self.ring is not None:
            part, self._parts = self._parts, self._parts + 1
            slot = next(
                (
                    found
                    for value in batch.values()
                    if isinstance(value, torch.Tensor)
                    and (found := self.ring.holding(value.untyped_storage().data_ptr())) is not None
                ),
                None,
            )
            # A part whose frames ended in a storage of its own (a dropped sample) gives its region back.
            self.ring.part_done(part, self.ring_worker, sent=slot is not None)
            if slot is not None:
                return RingPart(batch, self.ring, slot, self.ring_worker)
        if self.recycled is not None:
            for value in batch.values():
                if isinstance(value, torch.Tensor):
                    storage = self.recycled.holding(value.untyped_storage().data_ptr())
                    if storage is not None:
                        recycled = RecycledBatch(batch, storage)
                        # Shared storages cross to the training process; others are handed out here.
                        return recycled if self.recycled.shared else recycled.delivered()
        return batch

    def get_state(self) -> dict[str, Any]:
        assert self._boundary is not None, "reset() first"
        return self._boundary

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
