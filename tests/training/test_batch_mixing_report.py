"""A real streamed epoch reports its batch-mixing figures next to the uniform baseline."""

from __future__ import annotations

import math

import pytest

from lerobot_nodes.batch_mixing import uniform_mixing
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.loader import streaming_dataloader


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_streamed_epoch_reports_batch_mixing(small_dataset, num_workers):
    dataset = StreamingLeRobotDataset(root=small_dataset, return_uint8=True, seed=5)
    loader = streaming_dataloader(dataset, batch_size=8, num_workers=num_workers)
    pairs = []
    for batch in dataset.metrics.timed(loader):
        pairs += list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))
    lengths = [int(dataset.meta.episodes.length[e]) for e in dataset.episodes]
    assert len(pairs) == sum(lengths) and len(set(pairs)) == len(pairs)
    report = dataset.metrics.report()
    mixing = report.mixing
    assert mixing.batches == report.batches > 0 and mixing.batch_size == 8
    assert 1 <= mixing.distinct_episodes <= 8 and 0 <= mixing.near_pairs <= 1
    assert mixing.gop_frames == 2  # LeRobot's AV1, a key frame every 2 frames
    assert mixing.uniform_near_pairs == pytest.approx(uniform_mixing(lengths, 8).near_pairs)
    assert not math.isnan(mixing.uniform_distinct_episodes) and not math.isnan(mixing.gop_pairs)
    assert "batch mixing" in report.line()
