"""The streaming graph as torchdata nodes, one node per module.

::

    RankWorkerSharder -> EpisodePoolSampler -> BytePrefetcher -> DecodeMapper -> OrderedBuffer [-> SampleBatcher
    (sharder.py)         (pool_sampler.py)     (prefetcher.py,    (decode_mapper.py, (ordered_buffer.py)  (batcher.py)
                                                byte_cache.py)     batch_slots.py)
        -> HeapTrimmer]
           (heap_trimmer.py)

In a DataLoader worker, a batch's camera storage comes from ``RecycledStorages``
(recycled_storage.py): shared memory written again once the training process released it.

:func:`build_streaming_graph` builds the whole graph of one worker from plain values.
"""

from __future__ import annotations

from ..errors import ByteBudgetError, EpisodeFetchError, FetchCancelled, GraphFailedError
from .batch_slots import BatchSlots
from .batcher import SampleBatcher
from .byte_cache import ByteBudget, ByteCacheStats, EpisodeByteCache
from .decode_mapper import DecodeMapper, DecoderLRU, PendingSample, SampleAssembler, apply_image_transforms
from .episode_fetch import (
    EpisodeFetcher,
    EpisodePayload,
    VideoIndexProvider,
    default_index_provider,
    direct_index_provider,
)
from .graph import StreamingGraph, build_streaming_graph
from .heap_trimmer import HeapTrimmer
from .metrics_sink import MetricsSink, NullMetrics
from .ordered_buffer import OrderedBuffer
from .pool_sampler import EpisodePoolSampler, ScheduleItem, frame_order
from .prefetcher import BytePrefetcher, SampleTask
from .recycled_storage import RecycledBatch, RecycledStorages
from .sharder import (
    RankWorkerSharder,
    frame_balanced_assignment,
    max_workers_for_rank,
    rank_episodes,
    worker_episodes,
)

__all__ = [
    "HeapTrimmer",
    "RecycledBatch",
    "RecycledStorages",
    "BatchSlots",
    "ByteBudget",
    "ByteBudgetError",
    "ByteCacheStats",
    "BytePrefetcher",
    "DecodeMapper",
    "DecoderLRU",
    "EpisodeByteCache",
    "EpisodeFetchError",
    "EpisodeFetcher",
    "EpisodePayload",
    "EpisodePoolSampler",
    "FetchCancelled",
    "GraphFailedError",
    "MetricsSink",
    "NullMetrics",
    "OrderedBuffer",
    "PendingSample",
    "RankWorkerSharder",
    "SampleAssembler",
    "SampleBatcher",
    "SampleTask",
    "ScheduleItem",
    "StreamingGraph",
    "VideoIndexProvider",
    "apply_image_transforms",
    "build_streaming_graph",
    "default_index_provider",
    "direct_index_provider",
    "frame_balanced_assignment",
    "frame_order",
    "max_workers_for_rank",
    "rank_episodes",
    "worker_episodes",
]
