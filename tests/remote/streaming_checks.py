"""Checks shared by the remote-source tests: a whole epoch against the map-style reader."""

from __future__ import annotations

import collections
from typing import Any

import torch

from lerobot_nodes import MapStyleLeRobotDataset
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.loader import streaming_dataloader
from lerobot_nodes.testing.compare import assert_samples_equal

WINDOW = {"action": [0.0, 1 / 30, 2 / 30], "observation.images.top": [-1 / 30, 0.0], "observation.state": [-1 / 30, 0.0]}
CONFIG = StreamingConfig(streaming_episode_pool_size=2, streaming_prefetch_episodes=2, streaming_http_retries=8)


def streaming(root: Any = None, **kwargs: Any) -> StreamingLeRobotDataset:
    options: dict[str, Any] = {"delta_timestamps": WINDOW, "return_uint8": True, "seed": 3, "config": CONFIG}
    options.update(kwargs)
    return StreamingLeRobotDataset(root=root, **options)


def epoch_samples(dataset: StreamingLeRobotDataset, num_workers: int = 0, batch_size: int = 4) -> list[dict[str, Any]]:
    """Every sample of one epoch, in delivery order (batches split back into samples)."""
    loader = streaming_dataloader(dataset, batch_size=batch_size, num_workers=num_workers)
    samples = []
    for batch in loader:
        for i in range(len(batch["frame_index"])):
            samples.append({k: (v[i] if isinstance(v, (torch.Tensor, list)) else v) for k, v in batch.items()})
    return samples


def assert_epoch_matches_local(samples: list[dict[str, Any]], local_root: Any) -> None:
    """Each selected frame exactly once, and each sample equal to the map-style reader's on the local copy."""
    reference = MapStyleLeRobotDataset(root=local_root, delta_timestamps=WINDOW, return_uint8=True)
    starts = {e: reference.meta.episode_bounds(e)[0] for e in reference.episodes}
    seen = collections.Counter((int(s["episode_index"]), int(s["frame_index"])) for s in samples)
    assert len(seen) == reference.num_frames and set(seen.values()) == {1}
    for sample in samples:
        episode, frame = int(sample["episode_index"]), int(sample["frame_index"])
        expected = reference[starts[episode] + frame]
        assert set(expected) == set(sample), f"episode {episode} frame {frame}: keys differ"
        assert_samples_equal(expected, {k: sample[k] for k in expected}, where=f"episode {episode} frame {frame}")
