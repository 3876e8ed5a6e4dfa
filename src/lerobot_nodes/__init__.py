"""lerobot_nodes: stream LeRobotDataset v3.0 into PyTorch as a graph of torchdata.nodes."""

from __future__ import annotations

import os as _os

# SVT-AV1 (used by lerobot_nodes.testing to write AV1 as LeRobot does) prints its whole
# configuration at every encode; it reads this once, when FFmpeg is loaded: keep errors only.
_os.environ.setdefault("SVT_LOG", "1")

from .config import StreamingConfig
from .dataset import StreamingLeRobotDataset, streaming_dataloader
from .errors import (
    ConfigError,
    FrameTimestampError,
    LeRobotNodesError,
    MetadataError,
    SourceAuthError,
    SourceError,
    SourceFileNotFoundError,
    SourceUnavailableError,
    UnsupportedVersionError,
    VideoIndexError,
)
from .map_style import MapStyleLeRobotDataset
from .meta import DatasetMeta, load_meta, select_episodes
from .mp4.decode import VideoDecodeError
from .nodes.byte_cache import ByteBudgetError
from .nodes.episode_fetch import EpisodeFetchError
from .nodes.ordered_buffer import GraphFailedError
from .sidecar.errors import SidecarError, SidecarLockTimeoutError
from .sources import ByteSource, FsspecSource, HubBucketSource, HubRepoSource, LocalSource, open_source

__version__ = "0.1.0"

__all__ = [
    "ByteBudgetError",
    "ByteSource",
    "ConfigError",
    "DatasetMeta",
    "EpisodeFetchError",
    "FsspecSource",
    "FrameTimestampError",
    "GraphFailedError",
    "HubBucketSource",
    "HubRepoSource",
    "LeRobotNodesError",
    "LocalSource",
    "MapStyleLeRobotDataset",
    "MetadataError",
    "SidecarError",
    "SidecarLockTimeoutError",
    "SourceAuthError",
    "SourceError",
    "SourceFileNotFoundError",
    "SourceUnavailableError",
    "StreamingConfig",
    "StreamingLeRobotDataset",
    "UnsupportedVersionError",
    "VideoDecodeError",
    "VideoIndexError",
    "load_meta",
    "open_source",
    "select_episodes",
    "streaming_dataloader",
]
