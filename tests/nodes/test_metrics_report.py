"""The metrics report: the delivered rate ends at the last batch, and sizes print as MB like the log line."""

from __future__ import annotations

import time

import torch

from lerobot_nodes.metrics import StreamingMetrics


def _batches(count: int, size: int):
    for step in range(count):
        yield {"index": torch.arange(step * size, (step + 1) * size)}


def test_a_report_after_the_last_batch_gives_the_rate_the_progress_bar_gave() -> None:
    metrics = StreamingMetrics(log_every_s=None)
    last = None
    for _ in metrics.timed(_batches(4, 8)):
        last = metrics.report()  # what the progress bar shows after each batch
    time.sleep(0.3)  # the loader shutting down, the run's teardown
    final = metrics.report()
    assert last is not None and final.samples == last.samples == 32
    assert final.seconds == last.seconds  # the wait after the last batch is not streaming time
    assert final.samples_per_second == last.samples_per_second


def test_the_report_table_prints_sizes_in_mb() -> None:
    metrics = StreamingMetrics(log_every_s=None)
    for _ in metrics.timed(_batches(1, 4)):
        pass
    table = metrics.report().table()
    assert "MB fetched / planned" in table and "byte budget (MB)" in table
    assert "bytes fetched" not in table
