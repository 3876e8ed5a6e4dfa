"""MP4 index sidecars: schema v3 archives, the derived memory-mapped index, and its cache.

- :func:`open_video_indexes`: what the streaming graph calls at dataset open; the index of
  each needed video file, from the local cache, a published sidecar, or a locked local build.
- :func:`build_archive` / ``lerobot-build-mp4-sidecar``: write a dataset's schema v3 archive.
- :class:`SidecarCache`: the same lookup with a report of what was reused, converted or built.
- :data:`SCHEMA_DOC`: the archive format, embedded verbatim in ``docs/sidecar-schema.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import PublishNotSupportedError, SidecarError, SidecarFormatError, SidecarLockTimeoutError
from ..lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .builder import BuildSummary, build_archive
    from .cache import (
        DEFAULT_LOCK_TIMEOUT_S,
        OpenReport,
        SidecarCache,
        default_build_workers,
        default_cache_root,
        open_video_indexes,
    )
    from .derived import DERIVED_GENERATION, MappedRecord, MappedVideoIndex, smallest_exact_dtype
    from .schema import SCHEMA_DOC, SCHEMA_VERSION, SidecarArchive, SourceIdentity

# Imported on first use: ``cache list`` needs only the cache layout and its locks.
__getattr__, __dir__ = lazy_exports(
    __name__,
    globals(),
    {
        **dict.fromkeys(("BuildSummary", "build_archive"), ".builder"),
        **dict.fromkeys(
            ("DEFAULT_LOCK_TIMEOUT_S", "OpenReport", "SidecarCache", "default_build_workers", "default_cache_root",
             "open_video_indexes"),
            ".cache",
        ),
        **dict.fromkeys(("DERIVED_GENERATION", "MappedRecord", "MappedVideoIndex", "smallest_exact_dtype"), ".derived"),
        **dict.fromkeys(("SCHEMA_DOC", "SCHEMA_VERSION", "SidecarArchive", "SourceIdentity"), ".schema"),
    },
)

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_S",
    "DERIVED_GENERATION",
    "SCHEMA_DOC",
    "SCHEMA_VERSION",
    "BuildSummary",
    "MappedRecord",
    "MappedVideoIndex",
    "OpenReport",
    "PublishNotSupportedError",
    "SidecarArchive",
    "SidecarCache",
    "SidecarError",
    "SidecarFormatError",
    "SidecarLockTimeoutError",
    "SourceIdentity",
    "build_archive",
    "default_build_workers",
    "default_cache_root",
    "open_video_indexes",
    "smallest_exact_dtype",
]
