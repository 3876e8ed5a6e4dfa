"""Where each DataLoader worker stands after ``step`` batches: LeRobot-style step-offset resume.

LeRobot checkpoints store only ``step``, ``batch_size`` and the world size. A map-style run
derives its sampler position from them; a streaming run must derive, per worker, how many
samples that worker had delivered. ``StatefulDataLoader`` (and ``DataLoader``) take batches
from the workers in turn (w0, w1, ..., skipping workers whose epoch is over), each batch
from one worker, so the count follows from every worker's batches per epoch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerOffset:
    """Worker ``worker_id`` is in ``epoch`` and has delivered ``samples`` of it."""

    epoch: int
    samples: int


def batches_per_epoch(samples: int, batch_size: int) -> int:
    """Batches a worker yields per epoch (``drop_last=False``: a short last batch counts)."""
    return math.ceil(samples / batch_size)


def worker_offsets(step: int, batch_size: int, worker_samples: Sequence[int]) -> list[WorkerOffset]:
    return resume_point(step, batch_size, worker_samples)[0]


def resume_point(step: int, batch_size: int, worker_samples: Sequence[int]) -> tuple[list[WorkerOffset], int]:
    """The position of every worker of one rank after the rank consumed ``step`` batches.

    ``worker_samples[w]`` is the number of samples worker ``w`` yields per epoch (one entry
    for ``num_workers=0``). Epochs restart from worker 0, as a new DataLoader iterator does.
    Also returns the worker that yields the next batch (batch number ``step``).
    """
    if step < 0 or batch_size < 1:
        raise ValueError(f"step must be >= 0 and batch_size >= 1, got step={step}, batch_size={batch_size}")
    if not worker_samples or any(n < 1 for n in worker_samples):
        raise ValueError(f"every worker needs at least one sample per epoch, got {list(worker_samples)}")
    per_worker = [batches_per_epoch(n, batch_size) for n in worker_samples]
    epoch, remainder = divmod(step, sum(per_worker))
    taken = [0] * len(per_worker)
    worker = 0
    for _ in range(remainder):
        while taken[worker] >= per_worker[worker]:
            worker = (worker + 1) % len(per_worker)
        taken[worker] += 1
        worker = (worker + 1) % len(per_worker)
    while taken[worker] >= per_worker[worker]:
        worker = (worker + 1) % len(per_worker)
    offsets = [
        WorkerOffset(epoch=epoch, samples=min(count * batch_size, samples))
        for count, samples in zip(taken, worker_samples, strict=True)
    ]
    return offsets, worker
