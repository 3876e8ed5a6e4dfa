"""Writers of real LeRobot v3.0 datasets and MP4s for tests, benchmarks and the demo.

The test servers are imported from their own modules, not from here: the loopback Hugging Face
Hub from :mod:`~lerobot_nodes.testing.hub` (its routes in ``hub_routes``, its content in
``hub_store``), the static file server from :mod:`~lerobot_nodes.testing.static_http`, and the
HTTP plumbing both run on from :mod:`~lerobot_nodes.testing.http_server`.
"""

from __future__ import annotations

from lerobot_nodes.testing.dataset import ensure_demo_dataset, write_dataset
from lerobot_nodes.testing.many_files import write_files_dataset
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
    "write_files_dataset",
]
