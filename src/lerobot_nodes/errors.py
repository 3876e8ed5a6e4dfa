"""Exceptions raised by lerobot_nodes.

Every error names what it concerns (file, episode, option) so a user can act on it
without reading a traceback.
"""

from __future__ import annotations


class LeRobotNodesError(Exception):
    """Base class of every error this package raises on purpose."""


class SourceError(LeRobotNodesError):
    """A dataset file could not be listed or read from its byte source."""


class SourceFileNotFoundError(SourceError, FileNotFoundError):
    """A file the dataset needs is missing from its byte source."""


class SourceAuthError(SourceError, PermissionError):
    """The store refused the credentials (HTTP 401/403, a gated repo, fsspec permission errors)."""

    hint = (
        "make the HF token (HF_TOKEN or `hf auth login`), the AWS credentials (AWS_ACCESS_KEY_ID... or a profile) "
        "or the fsspec credentials available to every worker"
    )


class SourceUnavailableError(SourceError, ConnectionError):
    """The store kept failing (connection errors, 5xx, stalls) after every retry of a read."""


class MetadataError(LeRobotNodesError, ValueError):
    """LeRobot v3 metadata is missing, malformed or inconsistent."""


class UnsupportedVersionError(MetadataError):
    """The dataset is not a LeRobotDataset v3.x (for example a v2.1 dataset)."""


class VideoIndexError(LeRobotNodesError, ValueError):
    """An MP4 file cannot be indexed: unsupported layout, truncated or inconsistent tables."""


class FrameTimestampError(LeRobotNodesError, ValueError):
    """A query timestamp has no decoded frame within `tolerance_s` (LeRobot's FrameTimestampError)."""


class ConfigError(LeRobotNodesError, ValueError):
    """An option has an impossible value."""


class GraphFailedError(LeRobotNodesError):
    """The graph already raised an error; it must be reset before it yields again."""


class ByteBudgetError(LeRobotNodesError):
    """An episode's payload cannot fit in the per-rank byte budget."""


class FetchCancelled(LeRobotNodesError):
    """A wait on an episode payload ended because the graph was reset or closed."""


class EpisodeFetchError(LeRobotNodesError):
    """Fetching or decoding the payload of an episode failed; names the episode, file and ranges."""


class VideoDecodeError(LeRobotNodesError, RuntimeError):
    """A clip's samples could not be decoded into the frames its tables promise."""


class SidecarError(LeRobotNodesError):
    """A sidecar archive or derived index cannot be built, read or used."""


class SidecarFormatError(SidecarError, ValueError):
    """An archive or derived index file is malformed, truncated or of an unknown layout."""


class SidecarLockTimeoutError(SidecarError, TimeoutError):
    """Another process held a sidecar lock longer than the lock timeout."""


class PublishNotSupportedError(SidecarError):
    """Publishing a sidecar (``--push``) was asked for but is not possible here."""


class LeRobotIncompatibleError(LeRobotNodesError):
    """LeRobot is missing, or its trainer no longer has what ``lerobot-nodes train`` patches."""


class CacheFileError(LeRobotNodesError, ValueError):
    """A local cache file that cannot be used as it is (its message says why); the cache rebuilds it."""


class DemoWriteError(LeRobotNodesError, OSError):
    """The built-in demo dataset could not be written (a full or read-only disk); nothing partial is left."""


class ForkedChildError(LeRobotNodesError, RuntimeError):
    """A forked child process (``workers.forked_map``) died without sending all its results, or raised an
    exception that does not pickle; the message names its items and how it ended."""


class ForkRefusedError(LeRobotNodesError, OSError):
    """No forked child could be started (``fork`` or ``pipe`` failed under a process, memory or open-file
    limit); nothing ran and the children already forked are gone, so the caller may do the work another way."""
