"""Batches that hold samples of every DataLoader worker: each worker assembles a part, the training
process joins one part of each (issue 24).

A DataLoader batch otherwise comes from one worker, and a worker reads only its share of the
rank's episodes: with two workers a batch saw half the episodes a shuffle's would. Here worker
``w`` of ``W`` assembles parts of :func:`part_size` samples (the batch size split as evenly as
integers allow), the DataLoader hands the parts over in its usual round-robin order, and
:class:`JoinedParts` joins every ``W`` consecutive parts into one batch, so each batch is drawn
from every worker's pool. An epoch's last batches join what is left (workers whose epoch ended
are skipped by the DataLoader, as before), so every sample is still in exactly one batch.

The join is one copy of each part into one new storage per batch, on the training thread alone
(:func:`copy_rows`; about 20-30 ms for the 88 MB of 3 cameras at 480x640 and batch 32 on this
2-core VM). With ``pin_memory`` that storage is pinned
and the DataLoader's own pinning copy is not made, so on a GPU machine the join replaces a copy
rather than adding one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .recycled_storage import IN_PROCESS_KEEP, RecycledBatch, RecycledStorages
from .storage_views import tensors_in_one_storage


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
) -> dict[str, Any]:
    """One batch holding the samples of ``parts`` in order, every tensor a view of one storage:
    a new one (pinned with ``pin_memory``), or ``allocate(nbytes)``'s.

    Parts are batches with the same keys, each tensor's trailing shape and dtype equal across
    parts (what workers of one dataset assemble); lists (``task``) are concatenated. One part is
    returned as it is (nothing to join)."""
    if len(parts) == 1 and not pin_memory:
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


class JoinedParts(Iterator[dict[str, Any]]):
    """The batches of ``parts`` (a DataLoader iterator of worker parts), ``num_parts`` parts each.

    Guarantee: every part is in exactly one batch, in the order the parts arrive; a batch is cut
    short only where ``parts`` ends (the epoch's last). Called between batches, the DataLoader's
    ``state_dict()`` is at a batch boundary, so a resumed loader joins the same parts again.

    Unpinned batches are written into storages recycled once the training step has let go of the
    batch (:class:`~lerobot_nodes.batch_memory.recycled_storage.RecycledStorages` in process
    memory, :data:`IN_PROCESS_KEEP` kept): a fresh storage would cost a page fault per 4 KiB
    written, about as much as the copy. A batch you keep is never written to.
    """

    def __init__(self, parts: Iterator[dict[str, Any]], num_parts: int, *, pin_memory: bool = False) -> None:
        self.parts = parts
        self.num_parts = max(1, int(num_parts))
        self.pin_memory = pin_memory
        self.storages = RecycledStorages(IN_PROCESS_KEEP, shared=False)

    def __iter__(self) -> JoinedParts:
        return self

    def __next__(self) -> dict[str, Any]:
        taken: list[dict[str, Any]] = []
        while len(taken) < self.num_parts:
            try:
                taken.append(next(self.parts))
            except StopIteration:
                break
        if not taken:
            raise StopIteration
        if self.pin_memory or len(taken) == 1:
            return join_parts(taken, pin_memory=self.pin_memory)
        held: list[torch.UntypedStorage] = []

        def allocate(nbytes: int) -> torch.UntypedStorage:
            held.append(self.storages.take(nbytes))
            return held[0]

        batch = join_parts(taken, allocate=allocate)
        return RecycledBatch(batch, held[0]).delivered()

    def __getattr__(self, name: str) -> Any:
        # The DataLoader iterator's own attributes (``_num_yielded``, ``state_dict``, ...).
        return getattr(self.parts, name)
