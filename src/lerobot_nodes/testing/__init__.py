"""Writers of real LeRobot v3.0 datasets and MP4s for tests, benchmarks and the demo."""

from __future__ import annotations

from lerobot_nodes.testing.dataset import ensure_demo_dataset, write_dataset
from lerobot_nodes.testing.video import (
    concatenate_videos,
    encode_video,
    synthetic_frames,
    video_duration_s,
)

__all__ = [
    "concatenate_videos",
    "encode_video",
    "ensure_demo_dataset",
    "synthetic_frames",
    "video_duration_s",
    "write_dataset",
]
