"""lerobot_nodes: stream LeRobotDataset v3.0 into PyTorch as a graph of torchdata.nodes.

The error classes and ``__version__`` are imported with the package; every other public name
(the datasets, the loader helpers, the byte sources, the metadata readers) is imported on first
use (PEP 562 ``__getattr__``), so a command that only parses its flags, or code that only catches
this package's errors, does not pay for importing torch. ``from lerobot_nodes import X`` works
the same either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._version import __version__ as __version__
from .errors import (
    ByteBudgetError,
    CacheFileError,
    ConfigError,
    DemoWriteError,
    EpisodeFetchError,
    FetchCancelled,
    ForkedChildError,
    ForkRefusedError,
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
from .lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .config import StreamingConfig
    from .dataset import StreamingLeRobotDataset
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
        S3Source,
        open_source,
    )

_LAZY: dict[str, str] = {
    "StreamingConfig": ".config",
    "StreamingLeRobotDataset": ".dataset",
    "DatasetMeta": ".format.meta",
    "load_meta": ".format.meta",
    "select_episodes": ".format.meta",
    "loader_batch_size": ".loader",
    "streaming_dataloader": ".loader",
    "MapStyleLeRobotDataset": ".map_style",
    "ByteSource": ".sources",
    "FsspecSource": ".sources",
    "HttpRootSource": ".sources",
    "HubBucketSource": ".sources",
    "HubRepoSource": ".sources",
    "LocalSource": ".sources",
    "S3Source": ".sources",
    "open_source": ".sources",
}
"""Public name -> the module it is imported from on first use."""


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)


__all__ = [
    "ByteBudgetError",
    "ByteSource",
    "CacheFileError",
    "ConfigError",
    "DatasetMeta",
    "DemoWriteError",
    "EpisodeFetchError",
    "FetchCancelled",
    "ForkedChildError",
    "ForkRefusedError",
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
    "S3Source",
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
