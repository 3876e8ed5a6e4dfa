"""The metrics report of a mixture: delivered samples counted by ``dataset_index``, spelled out or summarised."""

from __future__ import annotations

import re

import torch

from lerobot_nodes.metrics import SPELLED_OUT_DATASETS, StreamingMetrics


def test_samples_are_counted_per_dataset_index_of_the_batches_delivered():
    metrics = StreamingMetrics(log_every_s=None)
    batches = [{"dataset_index": torch.tensor([0, 2, 2, 0])}, {"dataset_index": torch.tensor([2, 2])}]
    assert list(metrics.timed(batches)) == batches
    report = metrics.report()
    assert report.samples == 6 and report.samples_per_dataset == (2, 0, 4)
    assert re.search(r"^samples from \[1\] 1 +0$", report.table(), re.MULTILINE)
    assert report.line().endswith("samples per dataset: 0 2, 1 0, 2 4")


def test_one_dataset_has_no_per_dataset_rows():
    metrics = StreamingMetrics(log_every_s=None)
    list(metrics.timed([{"episode_index": torch.tensor([0, 1])}]))
    report = metrics.report()
    assert report.samples_per_dataset == () and "per dataset" not in report.table() + report.line()


def test_many_datasets_are_one_row_of_their_spread():
    metrics = StreamingMetrics(log_every_s=None)
    count = SPELLED_OUT_DATASETS * 10
    list(
        metrics.timed([{"dataset_index": torch.arange(count).repeat_interleave(torch.arange(1, count + 1))}])
    )
    report = metrics.report()
    assert re.search(
        rf"^samples per dataset +min/median/max 1/40/{count} over {count} datasets$", report.table(), re.M
    )
    assert "samples from [" not in report.table()
