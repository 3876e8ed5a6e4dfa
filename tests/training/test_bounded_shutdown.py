"""``shutdown_dataloader(loader, within_s=...)`` ends workers that do not stop when told to:
what a stop signal needs (``lerobot-nodes stream`` on SIGTERM/SIGINT), where torch alone waits
5 s for each worker before it terminates it."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.loader import shutdown_dataloader, streaming_dataloader


class HangInWorker:
    """An image transform that never returns once the file ``hang_when`` exists (the test makes it after its
    first batch: the workers then hang in the samples they prefetch, whatever order they assemble them in)."""

    def __init__(self, hang_when: Path) -> None:
        self.hang_when = str(hang_when)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if os.path.exists(self.hang_when):
            time.sleep(600)
        return image


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_stuck_in_a_sample_are_terminated_within_the_bound(small_dataset, caplog, tmp_path):
    hang_when = tmp_path / "hang"
    dataset = StreamingLeRobotDataset(
        root=small_dataset,
        delta_timestamps={"observation.images.top": [0.0]},
        image_transforms=HangInWorker(hang_when),
        return_uint8=True,
    )
    loader = streaming_dataloader(dataset, batch_size=4, num_workers=2)
    batches = iter(loader)
    first = next(batches)  # then each worker goes on prefetching, into a sample that hangs
    hang_when.touch()
    assert first["observation.images.top"].shape[0] == 4
    pids = [worker.pid for worker in batches._workers]  # type: ignore[attr-defined]
    time.sleep(1.0)
    caplog.set_level(logging.WARNING, logger="lerobot_nodes.dataset")
    started = time.monotonic()
    shutdown_dataloader(loader, within_s=0.5)
    elapsed = time.monotonic() - started
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)]
    assert elapsed < 4.0, elapsed  # torch alone: 5 s of join before it terminates a stuck worker
    warned = [record.getMessage() for record in caplog.records if "still running" in record.getMessage()]
    assert warned and all(any(f"pid {pid})" in line for pid in pids) for line in warned), warned
    dataset.close()


def test_workers_that_stop_when_told_are_not_terminated(small_dataset, caplog):
    dataset = StreamingLeRobotDataset(root=small_dataset, delta_timestamps=None, return_uint8=True)
    loader = streaming_dataloader(dataset, batch_size=4, num_workers=2)
    batches = iter(loader)
    next(batches)
    pids = [worker.pid for worker in batches._workers]  # type: ignore[attr-defined]
    exits = batches._workers  # type: ignore[attr-defined]
    caplog.set_level(logging.WARNING, logger="lerobot_nodes.dataset")
    shutdown_dataloader(loader, within_s=5.0)
    assert not [pid for pid in pids if _alive(pid)]
    assert [worker.exitcode for worker in exits] == [0, 0]  # each ended by itself, not by SIGTERM
    assert not [record for record in caplog.records if "still running" in record.getMessage()]
    dataset.close()
