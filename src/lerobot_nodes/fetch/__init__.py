"""What bytes an episode needs and the budget they are held under.

``episode_fetch`` turns an episode into byte ranges (data Parquet rows, MP4 clip ranges from
the video indexes) and reads them; ``byte_cache`` holds the fetched payloads under the
per-worker and per-rank byte budget the pool sampler plans with.
"""

from __future__ import annotations

from .byte_cache import ByteBudget, ByteCacheStats, EpisodeByteCache
from .episode_fetch import (
    EpisodeFetcher,
    EpisodePayload,
    VideoIndexProvider,
    default_index_provider,
    direct_index_provider,
)

__all__ = [
    "ByteBudget",
    "ByteCacheStats",
    "EpisodeByteCache",
    "EpisodeFetcher",
    "EpisodePayload",
    "VideoIndexProvider",
    "default_index_provider",
    "direct_index_provider",
]
