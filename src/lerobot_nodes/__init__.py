"""lerobot_nodes: stream LeRobotDataset v3.0 into PyTorch as a graph of torchdata.nodes."""

from __future__ import annotations

from ._version import __version__ as __version__
from .config import StreamingConfig
from .dataset import StreamingLeRobotDataset
from .errors import (
    ByteBudgetError,
    ConfigError,
    EpisodeFetchError,
    FetchCancelled,
    FrameTimestampError,
    GraphFailedError,
    LeRobotIncompatibleError,
    LeRobotNodesError,
    MetadataError,
    PublishNotSupportedError,
    SidecarError,
    SidecarFormatError,
    SidecarLockTimeoutError,
    SourceAuthError,
    SourceError,
    SourceFileNotFoundError,
    SourceUnavailableError,
    UnsupportedVersionError,
    VideoDecodeError,
    VideoIndexError,
)
from .format.meta import DatasetMeta, load_meta, select_episodes
from .loader import loader_batch_size, streaming_dataloader
from .map_style import MapStyleLeRobotDataset
from .sources import (
    ByteSource,
    FsspecSource,
    HttpRootSource,
    HubBucketSource,
    HubRepoSource,
    LocalSource,
    open_source,
)

__all__ = [
    "ByteBudgetError",
    "ByteSource",
    "ConfigError",
    "DatasetMeta",
    "EpisodeFetchError",
    "FetchCancelled",
    "FsspecSource",
    "FrameTimestampError",
    "GraphFailedError",
    "HttpRootSource",
    "HubBucketSource",
    "HubRepoSource",
    "LeRobotIncompatibleError",
    "LeRobotNodesError",
    "LocalSource",
    "MapStyleLeRobotDataset",
    "MetadataError",
    "PublishNotSupportedError",
    "SidecarError",
    "SidecarFormatError",
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
    "loader_batch_size",
    "open_source",
    "select_episodes",
    "streaming_dataloader",
]
