"""The streaming graph of one DataLoader worker of one rank, built in one call.

::

    RankWorkerSharder -> EpisodePoolSampler -> BytePrefetcher -> DecodeMapper -> OrderedBuffer
        [-> BadEpisodeFilter] [-> SampleBatcher -> HeapTrimmer]

(the filter with ``streaming_bad_episodes=skip`` only: graphs of ``raise`` keep their state layout).

:func:`build_streaming_graph` takes plain values only: source, metadata and selected episodes,
then a few grouped options (which reader, where its schedule starts, what a sample holds, how
batches are made, what the graph takes from outside), so an ``IterableDataset`` can call it
inside each worker with the rank and world size captured in the main process. ``graph.root`` is a ``BaseNode`` of
samples (or, with ``batch_size``, of collated batches), ready for ``torchdata.nodes.Loader`` or
further nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torchdata.nodes import BaseNode, Mapper

from .batch_memory.batch_ring import BatchRing, CameraSpec
from .batch_memory.batch_slots import BatchSlots
from .batch_memory.recycled_storage import DEFAULT_BATCHES_IN_FLIGHT, IN_PROCESS_KEEP, RecycledStorages
from .config import (
    BAD_EPISODES_SKIP,
    BYTES_PER_MB,
    DEFAULT_RANK_POOL_SIZE,
    OPEN_RUNS_FOR_BUDGET,
    OPEN_RUNS_STRANDED,
    POOL_BATCHES,
    StreamingConfig,
    resolve_seed,
)
from .errors import ConfigError
from .fetch.byte_cache import ByteBudget, EpisodeByteCache
from .fetch.episode_fetch import VideoIndexProvider
from .fetch.mixture_fetch import AnyEpisodeFetcher, open_episode_fetcher
from .format.depth import DEFAULT_DEPTH_UNIT
from .format.meta import DatasetMeta
from .format.mixture import MixtureMeta
from .metrics import MetricsSink, NullMetrics
from .mp4.decode import DEFAULT_FRAME_CACHE_SIZE, REORDER_FRAMES
from .mp4.index import VideoIndex
from .nodes.bad_episode_filter import BadEpisodeFilter
from .nodes.batcher import SampleBatcher
from .nodes.decode_mapper import ClipDecoderFactory, DecodeMapper, SampleAssembler, apply_image_transforms
from .nodes.heap_trimmer import HeapTrimmer
from .nodes.ordered_buffer import OrderedBuffer
from .nodes.pool_sampler import GOP_SKEW_FRAMES, EpisodePoolSampler, RunStrands, gop_run_starts
from .nodes.prefetcher import BytePrefetcher
from .nodes.sharder import CONTIGUOUS_SPLIT, RankWorkerSharder
from .nodes.weighted_sharder import ElasticLead, WeightedMixtureSharder
from .sample.assemble import SampleSpec
from .sources import ByteSource

HEAP_TRIM_EVERY_BATCHES = 4
"""Batches between two returns of free heap memory (``nodes.heap_trimmer`` has the measurements)."""


@dataclass
class StreamingGraph:
    """The nodes of one worker's graph; ``root`` yields samples (or batches of them) in schedule order."""

    root: BaseNode[dict[str, Any]]
    sharder: RankWorkerSharder | WeightedMixtureSharder
    sampler: EpisodePoolSampler
    prefetcher: BytePrefetcher
    decoder: DecodeMapper
    buffer: OrderedBuffer
    fetcher: AnyEpisodeFetcher
    batcher: SampleBatcher | None = None
    bad_filter: BadEpisodeFilter | None = None

    @property
    def cache(self) -> EpisodeByteCache:
        """The worker's byte cache: ``reserved_bytes``, ``resident_bytes``, ``stats()``."""
        return self.prefetcher.cache

    @property
    def num_frames(self) -> int:
        """Samples this worker yields per epoch."""
        return self.sharder.num_frames

    def state_after(self, num_samples: int, epoch: int | None = None) -> dict[str, Any]:
        """The ``root`` state after ``num_samples`` samples of ``epoch`` (default: the current one).

        Computed on the logical schedule alone, without fetching or decoding the skipped
        samples: ``root.reset(graph.state_after(n))`` (or ``Loader.load_state_dict`` of a loader
        state built from it) continues with sample ``n``. For step-offset resume.
        """
        sampler_state = self.sampler.state_after(num_samples, self.sharder.epoch if epoch is None else epoch)
        return self.state_from_sampler(sampler_state, num_samples)

    def state_from_sampler(self, sampler_state: dict[str, Any], num_samples: int) -> dict[str, Any]:
        """The ``root`` state that continues from ``sampler_state`` after ``num_samples`` delivered samples.

        The sampler state is all a position needs: the nodes after it hold no schedule. The bad
        episode filter's set is the one this process knows (found while decoding before: a step
        resume's schedule position cannot tell which episodes failed before it).
        """
        state: dict[str, Any] = {
            OrderedBuffer.SOURCE_KEY: {
                DecodeMapper.SOURCE_KEY: {BytePrefetcher.SOURCE_KEY: sampler_state},
            },
            OrderedBuffer.NUM_YIELDED_KEY: num_samples,
        }
        if self.bad_filter is not None:
            state = {BadEpisodeFilter.SOURCE_KEY: state, BadEpisodeFilter.BAD_KEY: sorted(self.bad_filter.bad)}
        # The batcher's state is its source's (at a batch boundary).
        below_batcher = self.batcher.source if self.batcher is not None else self.root
        if below_batcher is self.buffer or below_batcher is self.bad_filter:
            return state
        # torchdata's inline Mapper nests its source state this way (0.11).
        return {"it_state": {"source": state}}

    def close(self) -> None:
        """Join every thread of the graph and drop its payloads."""
        self.buffer.close()


def reporting_transfers(fetch: Callable[[int], Any], source: ByteSource, metrics: MetricsSink) -> Callable[[int], Any]:
    """``fetch``, followed by a report of the source's HTTP request and retry totals and its requests
    by the Hub's rate-limit classes (API, resolver, CDN, 429s waited out; remote sources) and of its disk byte cache (hits, misses, bytes served and stored, evictions)."""
    cache = source.byte_cache
    if not hasattr(source, "http_stats") and cache is None:
        return fetch

    def fetch_and_report(episode: int) -> Any:
        try:
            return fetch(episode)
        finally:
            if hasattr(source, "http_stats"):
                stats = source.http_stats
                metrics.set("http_requests", stats.requests)
                metrics.set("http_retries", stats.retries)
                metrics.set("hub_api_requests", stats.api_requests)
                metrics.set("hub_resolver_requests", stats.resolver_requests)
                metrics.set("hub_cdn_requests", stats.cdn_requests)
                metrics.set("hub_rate_limited", stats.rate_limited)
            if cache is not None:
                for name, value in cache.stats.as_dict().items():
                    metrics.set(f"disk_cache_{name}", value)

    return fetch_and_report


def _stale_index_hint(source: ByteSource, meta: DatasetMeta) -> Callable[[], str] | None:
    """The hint for decode errors when indexes come from the local cache (stores with stable identities)."""
    if not source.has_stable_identity:
        return None  # indexed afresh at every open: a stale index cannot be the cause
    from .sidecar.cache import stale_index_hint

    return lambda: stale_index_hint(source, meta.repo_id)


def camera_lookback(spec: SampleSpec) -> int:
    """Frames of history the camera windows read before their anchor (0 without windows)."""
    if spec.offsets is None:
        return 0
    lows = [int(spec.offsets[key].min()) for key in spec.video_keys if key in spec.offsets and len(spec.offsets[key])]
    return max(0, -min(lows)) if lows else 0


def anchor_runs(
    config: StreamingConfig, meta: DatasetMeta, spec: SampleSpec, gop_starts: Callable[[int], Any]
) -> tuple[Callable[[int], Any] | None, str]:
    """The sampler's run starts and run-rule name: GOP runs shifted by the camera lookback, or pairs.

    ``gop_starts(episode)``: per camera, the episode frames where a GOP starts
    (``EpisodeFetcher.gop_starts``; MP4 indexes only).
    """
    if not config.streaming_gop_runs or not meta.video_keys:
        return None, "pairs"
    lookback = camera_lookback(spec)

    def run_starts(episode: int) -> Any:
        return gop_run_starts(gop_starts(episode), lookback)

    return run_starts, f"gop-skew-{GOP_SKEW_FRAMES}-lookback-{lookback}"


MAX_OPEN_RUNS = 8
"""Anchor runs of one episode open at once at most (see :func:`open_anchor_runs`)."""

REORDERING_CODECS = frozenset({"h264", "hevc"})
"""Codecs whose streams may present frames out of decode order (B-frames): their decoders keep
the frames a drain outputs past its target (``mp4.decode.REORDER_FRAMES``)."""


def resident_episodes(config: StreamingConfig, rank_pool: int | None, selected: int) -> int:
    """Episodes of a rank the open runs are sized for (:func:`open_anchor_runs`): the explicit pool
    size, else the rank's default pool ``rank_pool`` (``config.default_rank_pool_size``) but never more
    than the ``selected`` episodes; ``rank_pool`` None (a run resumed from a checkpoint of the versions
    before the batch-sized pool, which sized them so): 32. Topology-independent, as the runs must be."""
    if config.streaming_episode_pool_size is not None:
        return config.streaming_episode_pool_size
    if rank_pool is None:
        return DEFAULT_RANK_POOL_SIZE
    return max(1, min(int(rank_pool), int(selected)))


def batch_draws(rank_pool: int | None, resident: int) -> int:
    """Anchors of one episode a batch takes: the samples of a batch (``rank_pool / POOL_BATCHES``, the
    batch the rank's default pool was sized for) over the ``resident`` episodes they are drawn from."""
    batch = max(1, int(rank_pool if rank_pool is not None else DEFAULT_RANK_POOL_SIZE) // POOL_BATCHES)
    return -(-batch // max(1, int(resident)))


def batch_open_runs(rank_pool: int | None, resident: int) -> int:
    """Open runs an episode needs so that its samples in one batch come from different runs, far apart:
    :func:`batch_draws`, plus one for an episode drawn at the end of one round robin round and at the
    start of the next. More runs mix a batch no better; each costs every resident episode's decoders
    their frames."""
    return batch_draws(rank_pool, resident) + 1


def open_runs_needed(config: StreamingConfig, schedule: ScheduleStart, resident: int) -> int | None:
    """The cap of :func:`open_anchor_runs` (None: the budget alone): :func:`batch_open_runs` of the rank's
    default pool under the batch rules (:data:`OPEN_RUNS_STRANDED`, ``config.OPEN_RUNS_FOR_BATCH``). A pool size the user sets
    (``streaming_episode_pool_size``) keeps the budget rule: its schedule must not depend on the batch
    size, which a step resume without the checkpoint's identity would take from the new run."""
    if schedule.open_runs_rule == OPEN_RUNS_FOR_BUDGET or config.streaming_episode_pool_size is not None:
        return None
    return batch_open_runs(schedule.rank_pool, resident)


def open_anchor_runs(
    config: StreamingConfig, meta: DatasetMeta, spec: SampleSpec, resident: int, needed: int | None = None
) -> int:
    """How many anchor runs of an episode the schedule keeps open at once (GOP runs only).

    Each open run has its own clip decoder per camera, which keeps up to ``window + 3`` frames
    (B-frame codecs; ``window`` otherwise, at most 5) of the camera's RGB size in the decoded-frame
    budget (on AV1 with GOPs of at most 2 frames one decoder serves all runs and keeps
    ``window + 1`` per run, see ``mp4.decode.reads_ahead``; the budget's eviction bounds it).
    The runs are as many as the rank's decoded-frame budget holds for every one of ``resident``
    episodes (:func:`resident_episodes`) and every camera, between 1 and
    :data:`MAX_OPEN_RUNS`, and at most ``needed`` when given (:func:`batch_open_runs`). A pure function
    of the settings and ``meta/info.json``, the same for every topology (elastic resume replays other
    topologies' schedules with it).
    """
    if not config.streaming_gop_runs:
        return 1
    frame_bytes, kept = decoded_frame_cost(meta, spec)
    per_run = resident * frame_bytes * kept
    if per_run <= 0:
        return 1
    budget = int(config.streaming_decoded_frame_budget_mb * BYTES_PER_MB)
    runs = int(min(MAX_OPEN_RUNS, max(1, budget // per_run)))
    return runs if needed is None else max(1, min(runs, int(needed)))


def decoded_frame_cost(meta: DatasetMeta, spec: SampleSpec) -> tuple[int, int]:
    """``(bytes, kept)``: the RGB bytes of one frame of every (non-depth) camera, and the frames a run's
    decoder keeps (``window + 3`` on B-frame codecs, ``window`` otherwise, at most 5); ``(0, 1)`` without
    cameras. What :func:`open_anchor_runs` and :func:`run_strands` size against the decoded-frame budget."""
    cameras = [key for key in meta.video_keys if key not in spec.depth_videos] or list(meta.video_keys)
    frame_bytes, kept = 0, 1
    for key in cameras:
        feature = meta.features[key]
        shape = [int(n) for n in feature.get("shape") or ()]
        pixels = int(np.prod(shape[:2])) if len(shape) >= 2 else 0
        frame_bytes += pixels * 3
        codec = str((feature.get("info") or {}).get("video.codec", ""))
        reorder = REORDER_FRAMES if codec in REORDERING_CODECS else 0
        kept = max(kept, min(DEFAULT_FRAME_CACHE_SIZE, spec.camera_window_frames() + reorder))
    return frame_bytes, kept


def run_strands(
    config: StreamingConfig, meta: DatasetMeta, spec: SampleSpec, schedule: ScheduleStart, resident: int
) -> RunStrands | None:
    """How runs are stranded (``nodes.pool_sampler.RunStrands``) under :data:`OPEN_RUNS_STRANDED` with the
    default pool: a batch takes :func:`batch_draws` anchors of each of the ``resident`` episodes, and the
    episode's runs may keep what the rank's decoded-frame budget holds per resident episode. None when a
    batch takes one anchor per episode at most (a pool of many episodes: nothing to spread), under the
    rules before strands, or without GOP runs. Topology-independent, as the open runs."""
    if (
        schedule.open_runs_rule != OPEN_RUNS_STRANDED
        or config.streaming_episode_pool_size is not None
        or not config.streaming_gop_runs
        or not meta.video_keys
    ):
        return None
    draws = batch_draws(schedule.rank_pool, resident)
    frame_bytes, kept = decoded_frame_cost(meta, spec)
    if draws <= 1 or frame_bytes <= 0:
        return None
    budget = int(config.streaming_decoded_frame_budget_mb * BYTES_PER_MB)
    return RunStrands(draws=draws, kept=kept, frames_per_episode=budget // (max(1, int(resident)) * frame_bytes))


@dataclass(frozen=True)
class ReaderSlot:
    """Which reader a graph is: worker ``worker_id`` of ``num_workers`` (0 = the training process) of ``rank``."""

    rank: int = 0
    world_size: int = 1
    worker_id: int = 0
    num_workers: int = 0


@dataclass(frozen=True)
class ScheduleStart:
    """Where the reader's schedule starts: ``seed`` (None: the streaming seed 42) and first ``epoch``
    (each ``reset(None)`` after an iteration moves to the next). ``assigned``/``carried``: the reader reads
    an elastic resume's remnant for this one epoch (see :class:`RankWorkerSharder` and
    :class:`EpisodePoolSampler`). ``worker_split``: how a rank's episodes are split over its workers
    (``nodes.sharder.WORKER_SPLITS``; a resumed run keeps its checkpoint's). ``excluded``: the rank's
    episodes skipped as bad (``streaming_bad_episodes=skip``), left out before the worker split."""

    seed: int | None = None
    epoch: int = 0
    assigned: Sequence[int] | None = None
    carried: Mapping[int, tuple[int, int]] | None = None
    worker_split: str = CONTIGUOUS_SPLIT
    excluded: frozenset[int] = frozenset()
    weights: Sequence[float] | None = None
    """A mixture's explicit weights (``--dataset.streaming_weights``): the reader's source is a
    :class:`WeightedMixtureSharder` (each dataset in its own epochs, an endless loader epoch)."""
    tails: Mapping[int, tuple[int, int]] | None = None
    """With weights and ``assigned`` (an elastic resume): the old visits of a previous dataset epoch this
    reader finishes first, ``episode -> (frames taken, order epoch)`` (:class:`ElasticLead`)."""
    rank_pool: int | None = DEFAULT_RANK_POOL_SIZE
    """The rank's pool when ``streaming_episode_pool_size`` is unset (``config.default_rank_pool_size`` of
    the batch size); None: the rule of the versions before the batch-sized pool (32, open runs sized for
    32 episodes), which a run resumed from their checkpoints keeps."""
    open_runs_rule: str = OPEN_RUNS_STRANDED
    """How many runs of an episode are open at once and whether they are stranded: :data:`OPEN_RUNS_STRANDED`,
    or the rule of the checkpoint a run resumes (``config.OPEN_RUNS_FOR_BATCH``, :data:`OPEN_RUNS_FOR_BUDGET`)."""


@dataclass(frozen=True)
class SampleOptions:
    """What a sample holds, as ``StreamingLeRobotDataset`` takes it. With ``transforms_on_consumer`` the
    image transforms run on the thread that iterates the root (for ``num_workers=0``), else on the
    decode threads."""

    delta_timestamps: Mapping[str, Sequence[float]] | None = None
    tolerance_s: float = 1e-4
    image_transforms: Callable[[Any], Any] | None = None
    transforms_on_consumer: bool = False
    return_uint8: bool = False
    depth_output_unit: str = DEFAULT_DEPTH_UNIT

    def spec(self, meta: DatasetMeta) -> SampleSpec:
        transforms = None if self.transforms_on_consumer else self.image_transforms
        return SampleSpec.from_meta(
            meta, self.delta_timestamps, self.tolerance_s, transforms, depth_output_unit=self.depth_output_unit
        )


@dataclass(frozen=True)
class BatchOptions:
    """``root`` yields batches of ``batch_size`` collated by a :class:`SampleBatcher`: in shared memory
    with ``shared_memory`` (DataLoader workers), whose camera segments are recycled (up to
    ``batches_in_flight`` + 1 kept; in this process up to ``IN_PROCESS_KEEP``, see
    :class:`~lerobot_nodes.batch_memory.recycled_storage.RecycledStorages`); a :class:`HeapTrimmer`
    hands free heap memory back every ``trim_heap_every`` batches (None: never). ``ring``: batches are
    parts joined across workers, and this is DataLoader worker ``ring_worker``: its parts' frames go in
    its rows of the ring's shared batches when they are free (:mod:`~lerobot_nodes.batch_memory.batch_ring`)."""

    batch_size: int
    shared_memory: bool = False
    batches_in_flight: int = DEFAULT_BATCHES_IN_FLIGHT
    trim_heap_every: int | None = HEAP_TRIM_EVERY_BATCHES
    ring: BatchRing | None = None
    ring_worker: int = 0


@dataclass(frozen=True)
class GraphServices:
    """What the graph takes from outside instead of making it: MP4 indexes (``index_provider``, default
    the sidecar or per-file indexes, serving ``opened_indexes``, opened by this process already, as
    they are), clip decoders (``decoder_factory``) and where nodes count (``metrics``). ``found_bad``:
    with ``streaming_bad_episodes=skip``, the set of episodes found bad while decoding that the graph
    adds to (the dataset's, so a graph rebuilt in the same process keeps them; None: the graph's own)."""

    index_provider: VideoIndexProvider | None = None
    opened_indexes: Mapping[str, VideoIndex] | None = None
    decoder_factory: ClipDecoderFactory | None = None
    metrics: MetricsSink | None = None
    found_bad: set[int] | None = None


def schedule_sharder(
    meta: DatasetMeta, episodes: Sequence[int], reader: ReaderSlot, schedule: ScheduleStart, lookahead: int = 8
) -> RankWorkerSharder | WeightedMixtureSharder:
    """The reader's share of ``episodes``, in epoch order (the first node of the graph); with weights, the
    weighted mixture of its share of each dataset (planning ``lookahead`` episodes ahead for the prefetcher)."""
    if schedule.weights is not None:
        return weighted_sharder(meta, episodes, reader, schedule, lookahead)
    return RankWorkerSharder(
        episodes,
        [int(meta.episodes.length[e]) for e in episodes],
        rank=reader.rank,
        world_size=reader.world_size,
        worker_id=reader.worker_id,
        num_workers=reader.num_workers,
        seed=resolve_seed(schedule.seed),
        initial_epoch=schedule.epoch,
        assigned=schedule.assigned,
        worker_split=schedule.worker_split,
        excluded=schedule.excluded,
    )


class EpisodeLengths(Mapping[int, int]):
    """``episode -> length`` of ``episodes``, read from the episodes table's length column: what a
    reader looks up, without a dict of every selected episode in every worker."""

    def __init__(self, lengths: Any, episodes: Sequence[int]) -> None:
        self._lengths = lengths
        self._episodes = episodes

    def __getitem__(self, episode: int) -> int:
        return int(self._lengths[episode])

    def __iter__(self) -> Iterator[int]:
        return (int(e) for e in self._episodes)

    def __len__(self) -> int:
        return len(self._episodes)


def weighted_sharder(
    meta: DatasetMeta, episodes: Sequence[int], reader: ReaderSlot, schedule: ScheduleStart, lookahead: int = 8
) -> WeightedMixtureSharder:
    """The :class:`WeightedMixtureSharder` of a mixture's ``episodes`` (global ids) for ``reader``; after an
    elastic resume (``schedule.assigned``) it reads its :class:`ElasticLead` first."""
    if not isinstance(meta, MixtureMeta) or schedule.weights is None:
        raise ConfigError("--dataset.streaming_weights weighs the datasets of a mixture: give repo_id (or root) as a list")
    lead = None
    if schedule.assigned is not None:
        lead = ElasticLead(
            tails=dict(schedule.tails or {}), rest=list(schedule.assigned), carried=dict(schedule.carried or {})
        )
    return WeightedMixtureSharder(
        meta.dataset_episodes(episodes),
        EpisodeLengths(meta.episodes.length, episodes),
        schedule.weights,
        rank=reader.rank,
        world_size=reader.world_size,
        worker_id=reader.worker_id,
        num_workers=reader.num_workers,
        seed=resolve_seed(schedule.seed),
        initial_epoch=schedule.epoch,
        worker_split=schedule.worker_split,
        lookahead=lookahead,
        names=meta.names,
        lead=lead,
    )


def schedule_sampler(
    sharder: RankWorkerSharder | WeightedMixtureSharder,
    reader: ReaderSlot,
    config: StreamingConfig,
    schedule: ScheduleStart,
    runs: SampleRuns,
) -> EpisodePoolSampler:
    """The logical schedule of one reader, exactly as :func:`build_streaming_graph` builds it.

    Sharder and pool sampler only: no fetch, no decode. Resume planning replays schedules of
    other topologies with it (``lerobot_nodes.resume.planning``).
    """
    return EpisodePoolSampler(
        sharder,
        pool_size=config.worker_pool_size(
            reader.worker_id, reader.num_workers, DEFAULT_RANK_POOL_SIZE if schedule.rank_pool is None else schedule.rank_pool
        ),
        strategy=config.sampling_strategy,
        seed=resolve_seed(schedule.seed),
        episode_cost=runs.episode_cost,
        budget=ByteBudget(
            worker_bytes=config.worker_byte_budget(reader.num_workers), rank_bytes=config.rank_byte_budget
        ),
        carried=schedule.carried,
        run_starts=runs.run_starts,
        runs=runs.rule,
        open_runs=runs.open_runs,
        strands=runs.strands,
    )


@dataclass(frozen=True)
class SampleRuns:
    """What the pool sampler knows of the episodes' bytes: ``episode_cost`` (exact clip bytes, from the
    MP4 indexes; None without video), the anchor runs (:func:`anchor_runs`) and how many of an
    episode's runs are open at once (:func:`open_anchor_runs`) and how each is read (:func:`run_strands`)."""

    episode_cost: Callable[[int], int] | None = None
    run_starts: Callable[[int], Any] | None = None
    rule: str = "pairs"
    open_runs: int = 1
    strands: RunStrands | None = None

    @classmethod
    def of(
        cls,
        config: StreamingConfig,
        meta: DatasetMeta,
        spec: SampleSpec,
        fetcher: AnyEpisodeFetcher,
        schedule: ScheduleStart,
        selected: int,
    ) -> SampleRuns:
        """The runs of the graph's schedule over ``selected`` episodes (:func:`resident_episodes`,
        ``schedule.open_runs_needed``)."""
        if not meta.video_keys:
            return cls()
        run_starts, rule = anchor_runs(config, meta, spec, fetcher.gop_starts)
        if run_starts is None:
            return cls(fetcher.cost, run_starts, rule, 1)
        resident = resident_episodes(config, schedule.rank_pool, selected)
        open_runs = open_anchor_runs(config, meta, spec, resident, open_runs_needed(config, schedule, resident))
        return cls(fetcher.cost, run_starts, rule, open_runs, run_strands(config, meta, spec, schedule, resident))


def build_streaming_graph(
    source: ByteSource,
    meta: DatasetMeta,
    episodes: Sequence[int],
    *,
    reader: ReaderSlot = ReaderSlot(),
    config: StreamingConfig | None = None,
    schedule: ScheduleStart = ScheduleStart(),
    samples: SampleOptions = SampleOptions(),
    batches: BatchOptions | None = None,
    services: GraphServices = GraphServices(),
) -> StreamingGraph:
    """The graph of one reader (:class:`ReaderSlot`) over the selected ``episodes``.

    Per-rank limits of ``config`` are split over the rank's workers. The sharder comes first (the
    reader's episodes), then the fetcher of those episodes, whose MP4 indexes give the pool sampler
    its byte costs and GOP runs, then the nodes after it.
    """
    config = config or StreamingConfig()
    metrics = services.metrics or NullMetrics()
    episodes = [int(e) for e in episodes]
    spec = samples.spec(meta)
    sharder = schedule_sharder(meta, episodes, reader, schedule, lookahead=config.streaming_prefetch_episodes)
    fetcher = open_episode_fetcher(
        source, meta, episodes=sharder.episodes, index_provider=services.index_provider,
        opened_indexes=services.opened_indexes, lock_timeout_s=config.streaming_sidecar_lock_timeout_s,
    )
    runs = SampleRuns.of(config, meta, spec, fetcher, schedule, len(episodes))
    sampler = schedule_sampler(sharder, reader, config, schedule, runs)
    metrics.set("budget_bytes", sampler.budget.worker_bytes)
    prefetcher = BytePrefetcher(
        sampler,
        reporting_transfers(fetcher.fetch, source, metrics),
        prefetch_episodes=config.streaming_prefetch_episodes,
        max_concurrent_fetches=config.max_num_shards,
        metrics=metrics,
    )
    image_transforms = samples.image_transforms
    in_batch = batches is not None and image_transforms is None
    skip_bad = config.streaming_bad_episodes == BAD_EPISODES_SKIP
    found_bad = (services.found_bad if services.found_bad is not None else set()) if skip_bad else None
    slots, recycled = None, None
    if batches is not None and in_batch:
        slots, recycled = _batch_slots(
            batches, spec, meta, fetcher, samples.return_uint8, metrics, config.streaming_decoded_queue_size
        )
    decoder = DecodeMapper(
        prefetcher,
        # Behind a batcher without transforms the rows are gathered per batch (lerobot_nodes.sample.batch_rows).
        SampleAssembler(spec, tolerance_s=samples.tolerance_s, return_uint8=samples.return_uint8, defer_rows=in_batch),
        num_threads=config.streaming_decode_threads,
        decoder_cache_size=config.worker_decoder_cache_size(
            sampler.pool_size, len(meta.video_keys) * sampler.open_runs, reader.num_workers
        ),
        decoder_factory=services.decoder_factory,
        decoded_frame_budget_bytes=config.worker_decoded_frame_budget(reader.num_workers),
        metrics=metrics,
        decode_error_hint=_stale_index_hint(source, meta) if services.index_provider is None else None,
        slots=slots,
        camera_window_frames=spec.camera_window_frames(),
        frames_asked_once=spec.camera_frames_asked_once(),
        decoders_per_clip=sampler.open_runs,
        skip_bad=found_bad,
    )
    # Behind a batcher the state is asked at batch boundaries only: snapshot there, not per sample.
    # Dropped samples move the batch boundaries off the buffer's count: then a snapshot per sample.
    snapshot_every = batches.batch_size if batches is not None and found_bad is None else 1
    buffer = OrderedBuffer(decoder, max_ahead=config.streaming_decoded_queue_size, snapshot_every=snapshot_every)
    root: BaseNode[Any] = buffer
    bad_filter = None
    if found_bad is not None:
        root = bad_filter = BadEpisodeFilter(buffer, found_bad, metrics=metrics, slots=slots)
    if samples.transforms_on_consumer and image_transforms is not None:
        root = Mapper(root, apply_image_transforms(spec, image_transforms))
    batcher = None
    if batches is not None:
        root = batcher = SampleBatcher(
            root,
            batches.batch_size,
            shared_memory=batches.shared_memory,
            recycled=recycled,
            ring=batches.ring if slots is not None else None,
            ring_worker=batches.ring_worker,
        )
        if batches.trim_heap_every is not None:
            root = HeapTrimmer(batcher, every=batches.trim_heap_every)
    return StreamingGraph(
        root=root,
        sharder=sharder,
        sampler=sampler,
        prefetcher=prefetcher,
        decoder=decoder,
        buffer=buffer,
        fetcher=fetcher,
        batcher=batcher,
        bad_filter=bad_filter,
    )


def cameras_in_batch(spec: SampleSpec) -> dict[str, int]:
    """The cameras whose frames are decoded straight into their batch (RGB; depth is dequantised
    after), each with its frames per sample."""
    return {
        key: len(spec.offsets[key]) if spec.offsets is not None and key in spec.offsets else 1
        for key in spec.video_keys
        if key not in spec.depth_videos
    }


def ring_cameras(samples: SampleOptions, meta: DatasetMeta) -> list[CameraSpec] | None:
    """``(key, dtype, sample shape)`` of each camera as the workers write it into a batch ring
    (:mod:`~lerobot_nodes.batch_memory.batch_ring`), from the frame sizes ``info.json`` declares;
    None where the graph does not decode into the batch (image transforms) or a size is not
    declared. A worker that finds other sizes in the MP4 files writes its parts apart (copied)."""
    if samples.image_transforms is not None:
        return None
    spec = samples.spec(meta)
    dtype = torch.uint8 if samples.return_uint8 else torch.float32
    cameras: list[CameraSpec] = []
    for key, frames in cameras_in_batch(spec).items():
        feature = meta.features.get(key, {})
        shape, names = list(feature.get("shape") or ()), list(feature.get("names") or ())
        if len(shape) != 3:
            return None
        if names[:2] == ["height", "width"] or not names:
            height, width = int(shape[0]), int(shape[1])
        elif names[1:] == ["height", "width"]:
            height, width = int(shape[1]), int(shape[2])
        else:
            return None
        cameras.append((key, dtype, (3, height, width) if frames == 1 else (frames, 3, height, width)))
    return cameras or None


def _batch_slots(
    batches: BatchOptions,
    spec: SampleSpec,
    meta: DatasetMeta,
    fetcher: AnyEpisodeFetcher,
    return_uint8: bool,
    metrics: MetricsSink,
    ahead_limit: int,
) -> tuple[BatchSlots | None, RecycledStorages | None]:
    """Camera frames decoded straight into their batch (RGB cameras; depth is dequantised after).
    ``ahead_limit``: the samples the ordered buffer pulls ahead of the batcher."""
    cameras = cameras_in_batch(spec)
    if not cameras:
        return None, None

    def frame_size(key: str, episode: int) -> tuple[int, int]:
        index = fetcher.index(meta.video_file(episode, key))
        return int(index.height), int(index.width)

    # In this process: see IN_PROCESS_KEEP.
    keep = batches.batches_in_flight + 1 if batches.shared_memory else IN_PROCESS_KEEP
    recycled = RecycledStorages(keep, metrics, shared=batches.shared_memory)
    slots = BatchSlots(
        batches.batch_size,
        cameras,
        frame_size,
        return_uint8=return_uint8,
        shared_memory=batches.shared_memory,
        storages=recycled,
        ahead_limit=ahead_limit,
        ring=batches.ring,
        ring_worker=batches.ring_worker,
    )
    return slots, recycled
