"""Forkserver workers see the training process's environment as it is when they start, not as it
was when the forkserver started (``start_worker_context`` starts it early)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.loader import shutdown_dataloader, start_worker_context, streaming_dataloader

MARK = "LEROBOT_NODES_TEST_ENVIRONMENT_MARK"


class MarkIfEnvironmentSeen:
    """An image transform reporting, in the pixels, whether the worker sees ``MARK=expected``."""

    def __init__(self, expected: str) -> None:
        self.expected = expected

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return torch.full_like(image, 1 if os.environ.get(MARK) == self.expected else 0)


def test_workers_adopt_the_environment_of_the_process_that_starts_them(small_dataset, monkeypatch):
    monkeypatch.delenv(MARK, raising=False)
    start_worker_context()  # the forkserver runs (or already ran) without the mark
    monkeypatch.setenv(MARK, "set after the forkserver started")
    assert every_worker_batch_marked(small_dataset, MarkIfEnvironmentSeen("set after the forkserver started"))


def every_worker_batch_marked(root: Path, mark: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Whether 4 batches read by 2 workers, with ``mark`` as the image transform, are all 1s."""
    dataset = StreamingLeRobotDataset(
        root=root, delta_timestamps={"observation.images.top": [0.0]}, image_transforms=mark, return_uint8=True
    )
    loader = streaming_dataloader(dataset, batch_size=4, num_workers=2)
    try:
        batches = [batch for _, batch in zip(range(4), loader, strict=False)]
    finally:
        shutdown_dataloader(loader)
    return bool(batches) and all(bool((batch["observation.images.top"] == 1).all()) for batch in batches)


class MarkIfArrowUsesTheHeap:
    """An image transform reporting, in the pixels, whether pyarrow allocates from the C heap here."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        import pyarrow as pa

        return torch.full_like(image, 1 if pa.default_memory_pool().backend_name == "system" else 0)


def test_workers_read_parquet_into_the_c_heap_the_trimmer_hands_back(small_dataset):
    # pyarrow's bundled allocator keeps freed pages for itself (about 8 MB per worker); the
    # training process's own default is left alone.
    import pyarrow as pa

    trainers = pa.default_memory_pool().backend_name
    assert every_worker_batch_marked(small_dataset, MarkIfArrowUsesTheHeap())
    assert pa.default_memory_pool().backend_name == trainers
