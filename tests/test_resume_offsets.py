"""The step-offset arithmetic matches what a real StatefulDataLoader does with several workers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from lerobot_nodes.batch_memory.worker_parts import JoinedParts, part_size
from lerobot_nodes.resume.planning import resume_point, worker_offsets


class _CountingDataset(IterableDataset):
    """Worker w yields ``samples[w]`` items tagged with the worker id."""

    def __init__(self, samples):
        self.samples = samples

    def __iter__(self):
        info = get_worker_info()
        worker = info.id if info is not None else 0
        for i in range(self.samples[worker]):
            yield torch.tensor([worker, i])


@pytest.mark.parametrize("samples,batch_size", [([10, 7], 4), ([5, 13, 3], 2), ([9], 4)])
def test_offsets_match_the_dataloader_round_robin(samples, batch_size):
    num_workers = len(samples) if len(samples) > 1 else 0
    loader = StatefulDataLoader(_CountingDataset(samples), batch_size=batch_size, num_workers=num_workers)
    batches = [(epoch, int(batch[0, 0]), len(batch)) for epoch in range(2) for batch in loader]
    delivered = {0: [0] * len(samples), 1: [0] * len(samples)}
    for step, (epoch, worker, size) in enumerate(batches):
        offsets = worker_offsets(step, batch_size, samples)
        assert [(o.epoch, o.samples) for o in offsets] == [(epoch, n) for n in delivered[epoch]], step
        delivered[epoch][worker] += size
    assert delivered[1] == samples


class _PartsDataset(IterableDataset):
    """Worker w yields ``samples[w]`` rows tagged with the worker id, in parts of its share of ``batch_size``."""

    def __init__(self, samples, batch_size):
        self.samples, self.batch_size = samples, batch_size

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        size = part_size(self.batch_size, workers, worker)
        rows = [torch.tensor([worker, i]) for i in range(self.samples[worker])]
        for start in range(0, len(rows), size):
            yield {"rows": torch.stack(rows[start : start + size])}


@pytest.mark.parametrize("samples,batch_size", [([10, 7], 4), ([5, 13, 3], 5), ([4, 9], 3), ([30, 2, 11], 7)])
def test_offsets_across_workers_match_joined_parts_of_the_dataloader(samples, batch_size):
    # Each batch joins one part of each worker, in the DataLoader's round-robin order.
    loader = StatefulDataLoader(_PartsDataset(samples, batch_size), batch_size=None, num_workers=len(samples))
    delivered = {0: [0] * len(samples), 1: [0] * len(samples)}
    step = 0
    for epoch in range(2):
        for batch in JoinedParts(iter(loader), len(samples)):
            offsets, _ = resume_point(step, batch_size, samples, across_workers=True)
            assert [(o.epoch, o.samples) for o in offsets] == [(epoch, n) for n in delivered[epoch]], step
            for worker in batch["rows"][:, 0].tolist():
                delivered[epoch][worker] += 1
            step += 1
    assert delivered[1] == samples


@settings(max_examples=200, deadline=None)
@given(
    samples=st.lists(st.integers(1, 40), min_size=1, max_size=5),
    batch_size=st.integers(1, 9),
    step=st.integers(0, 200),
)
def test_offsets_are_consistent(samples, batch_size, step):
    offsets = worker_offsets(step, batch_size, samples)
    per_epoch = sum(-(-n // batch_size) for n in samples)
    assert all(o.epoch == step // per_epoch for o in offsets)
    assert all(0 <= o.samples <= n for o, n in zip(offsets, samples, strict=False))
    consumed = sum(-(-o.samples // batch_size) for o in offsets)
    assert consumed == step % per_epoch
