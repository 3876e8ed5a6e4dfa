"""The plain schedules a step resume is planned against: every old reader's, as its graph built it.

Planning replays old schedules (sharder and pool sampler only, with the real byte costs from
the MP4 indexes: metadata, no payload) to find what they delivered; :func:`plain_samplers`
builds them exactly as :func:`~lerobot_nodes.streaming_graph.build_streaming_graph` does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..config import StreamingConfig, resolve_seed
from ..fetch.mixture_fetch import open_episode_fetcher
from ..format.meta import DatasetMeta
from ..mp4.index import VideoIndex
from ..nodes.pool_sampler import EpisodePoolSampler
from ..nodes.sharder import CONTIGUOUS_SPLIT, max_workers_for_rank, rank_worker_split
from ..sources import ByteSource
from ..streaming_graph import (
    ReaderSlot,
    SampleOptions,
    SampleRuns,
    ScheduleStart,
    schedule_sampler,
    schedule_sharder,
)
from .planning import SamplerFactory, Topology


@dataclass(frozen=True)
class RankSchedule:
    """What planning needs of the rank's plain schedule: its episodes, topology, seed, samplers and worker split."""

    episodes: Sequence[int]
    lengths: Sequence[int]
    rank: int
    world_size: int
    seed: int
    samplers: Callable[[int], SamplerFactory]
    """``world_size -> (rank, worker_id, num_workers) -> sampler``: plain schedules as the graph builds them."""
    worker_split: str = CONTIGUOUS_SPLIT
    """How the run splits a rank's episodes over its workers (``nodes.sharder.WORKER_SPLITS``): the
    samplers replay it, and an elastic resume splits the remnant over the new workers the same way."""
    excluded: frozenset[int] | None = None
    """This rank's episodes skipped as bad (``streaming_bad_episodes=skip``; None: ``raise``). A rank
    knows only its own, so a resume in another topology (which replays every old rank) is refused."""
    weighted: bool = False
    """A weighted mixture (``streaming_weights``): every worker reads each dataset in its own epochs."""
    feedable_workers: Callable[[int, int], int] | None = None
    """``(rank, world_size) -> `` the workers that rank can feed (a weighted mixture: the fewest episodes
    it owns of any dataset); None: the episodes it owns."""

    def workers_of_rank(self, old: Topology) -> Callable[[int], int]:
        """Workers each old rank really had: ``streaming_dataloader`` clamps them to what it can feed."""

        def workers(rank: int) -> int:
            if self.feedable_workers is not None:
                return min(old.num_workers, self.feedable_workers(rank, old.world_size))
            excluded = self.excluded if self.excluded is not None and rank == self.rank else ()
            owned = max_workers_for_rank(self.episodes, self.lengths, rank, old.world_size, self.seed, excluded)
            return min(old.num_workers, owned)

        return workers


def plain_samplers(
    source: ByteSource,
    meta: DatasetMeta,
    episodes: Sequence[int],
    config: StreamingConfig,
    samples: SampleOptions,
    rules: ScheduleStart,
    opened_indexes: Mapping[str, VideoIndex] | None = None,
    excluded: Mapping[int, frozenset[int]] | None = None,
) -> Callable[[int], SamplerFactory]:
    """``world_size -> (rank, worker_id, num_workers) -> sampler``: the plain schedules of ``world_size``
    ranks over ``episodes`` as the graph builds them (``opened_indexes`` served as they are), under the
    checkpointed run's ``rules`` (its seed, worker split, default pool and open-runs rule, see
    :class:`ScheduleStart`), without the episodes ``excluded`` names for that rank (``{rank: skipped}``;
    a rank knows only its own)."""
    seed, worker_split = resolve_seed(rules.seed), rules.worker_split
    schedule = ScheduleStart(seed=seed, rank_pool=rules.rank_pool, open_runs_rule=rules.open_runs_rule)

    def samplers(world_size: int) -> SamplerFactory:
        runs = SampleRuns()
        if meta.video_keys:
            fetcher = open_episode_fetcher(
                source,
                meta,
                episodes=episodes,
                opened_indexes=opened_indexes,
                lock_timeout_s=config.streaming_sidecar_lock_timeout_s,
            )
            runs = SampleRuns.of(config, meta, samples.spec(meta), fetcher, schedule, len(episodes))
        lengths = [int(meta.episodes.length[e]) for e in episodes]

        @functools.cache
        def split(rank: int, num_workers: int) -> list[list[int]]:
            skipped = (excluded or {}).get(rank, frozenset())
            return rank_worker_split(episodes, lengths, rank, world_size, num_workers, seed, worker_split, skipped)

        def make(rank: int, worker_id: int, num_workers: int) -> EpisodePoolSampler:
            reader = ReaderSlot(rank, world_size, worker_id, num_workers)
            if config.streaming_weights is not None:  # a weighted mixture splits each dataset on its own
                weighted = ScheduleStart(seed=seed, worker_split=worker_split, weights=config.streaming_weights)
                sharder = schedule_sharder(meta, episodes, reader, weighted, config.streaming_prefetch_episodes)
                return schedule_sampler(sharder, reader, config, schedule, runs)
            # the worker's own split, computed once per rank
            assigned = ScheduleStart(seed=seed, assigned=split(rank, num_workers)[worker_id])
            return schedule_sampler(schedule_sharder(meta, episodes, reader, assigned), reader, config, schedule, runs)

        return make

    return samplers
