"""The streaming graph as torchdata nodes, one node per module, and nothing but nodes.

::

    RankWorkerSharder -> EpisodePoolSampler -> BytePrefetcher -> DecodeMapper -> OrderedBuffer [-> SampleBatcher
    (sharder.py)         (pool_sampler.py)     (prefetcher.py)    (decode_mapper.py) (ordered_buffer.py)  (batcher.py)
        -> HeapTrimmer]
           (heap_trimmer.py)

What the nodes use lives a floor below: byte ranges and the byte budget in
:mod:`lerobot_nodes.fetch`, batch storage in :mod:`lerobot_nodes.batch_memory`, sample
assembly in :mod:`lerobot_nodes.sample.assemble`. :func:`lerobot_nodes.streaming_graph.build_streaming_graph`
composes the whole graph of one worker.
"""

from __future__ import annotations

from .batcher import SampleBatcher
from .decode_mapper import DecodeMapper, DecoderLRU, PendingSample, SampleAssembler, apply_image_transforms
from .heap_trimmer import HeapTrimmer
from .ordered_buffer import OrderedBuffer
from .pool_sampler import EpisodePoolSampler, ScheduleItem, frame_order
from .prefetcher import BytePrefetcher, SampleTask
from .sharder import (
    RankWorkerSharder,
    frame_balanced_assignment,
    max_workers_for_rank,
    rank_episodes,
    worker_episodes,
)

__all__ = [
    "BytePrefetcher",
    "DecodeMapper",
    "DecoderLRU",
    "EpisodePoolSampler",
    "HeapTrimmer",
    "OrderedBuffer",
    "PendingSample",
    "RankWorkerSharder",
    "SampleAssembler",
    "SampleBatcher",
    "SampleTask",
    "ScheduleItem",
    "apply_image_transforms",
    "frame_balanced_assignment",
    "frame_order",
    "max_workers_for_rank",
    "rank_episodes",
    "worker_episodes",
]
