"""``StreamingLeRobotDataset``: the streaming graph behind a (Stateful)DataLoader.

The dataset object holds configuration, and in the training process the MP4 indexes of the
selected episodes, opened and checked against the metadata at construction (a worker opens
its own from the cache that open fills). Each DataLoader worker (or the training process
when ``num_workers=0``) builds its own graph on its first ``iter()``, from the rank and
world size captured here in the main process (spawned workers may not see
``torch.distributed``). The dataset is ``Stateful``: ``StatefulDataLoader`` saves every
worker's graph state with each snapshot and restores it exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import multiprocessing
import multiprocessing.context
import multiprocessing.util
import os
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

from torch.utils.data import IterableDataset, get_worker_info
from torchdata.nodes.samplers.utils import get_rank_and_world_size

from .batch_memory.batch_ring import BatchRing, CameraSpec
from .batch_memory.recycled_storage import DEFAULT_BATCHES_IN_FLIGHT
from .config import BAD_EPISODES_SKIP, StreamingConfig, default_rank_pool_size, resolve_seed, split_evenly
from .dataset_doctor import BadEpisodes, open_checked
from .errors import ConfigError
from .format.dataset_properties import LeRobotDatasetProperties
from .format.depth import DEFAULT_DEPTH_UNIT
from .format.meta import DatasetMeta, load_meta, select_episodes
from .format.mixture import MixtureMeta, part_prefix
from .format.mixture_open import MixtureRequest, RootArgument, is_mixture, open_mixture
from .heap import arrow_allocates_from_the_heap
from .metrics import BAD_EPISODES_FOUND, StreamingMetrics, WorkerCounters, WorkerMetrics
from .mp4.index import VideoIndex
from .nodes.sharder import max_workers_for_rank, rank_episodes, worker_episodes
from .nodes.weighted_sharder import normalized_weights, weighted_max_workers, weighted_rank_episodes
from .resume.identity import (
    SAMPLING_STRATEGY,
    batches_across_workers_of,
    check_identity,
    dataset_identity,
    open_runs_rule_of,
    rank_pool_of,
    refuse_step_resume_after_found_bad,
    sampling_strategy_of,
    with_found_bad,
    with_open_runs_rule,
    with_rank_pool,
    with_skipped,
    with_worker_split,
    worker_split_of,
)
from .resume.orchestrator import PlainEpochs, ResumeOrchestrator
from .resume.planning import StepCheckpoint, Topology, WorkerStart
from .resume.schedules import RankSchedule, plain_samplers
from .sample.assemble import SampleSpec
from .sidecar import default_build_workers, open_video_indexes
from .sources import ByteSource
from .sources.http_range import HttpOptions
from .sources.listed import ListedHttpSource
from .sources.mixture import MixtureSource
from .sources.range_cache import byte_cache_from_options
from .sources.resolve import open_source
from .streaming_graph import (
    BatchOptions,
    GraphServices,
    ReaderSlot,
    SampleOptions,
    ScheduleStart,
    StreamingGraph,
    build_streaming_graph,
    ring_cameras,
)
from .workers.lifeline import guard_forkserver, guard_worker
from .workers.main_guard import exit_if_reimporting_main
from .workers.server import filesystem_modules, retire_unused_server, spawning_elsewhere, start_before_threads

logger = logging.getLogger("lerobot_nodes.dataset")

# A workers' server started as a new interpreter preloads this module: there (and only there) this ties
# the server's life to the training process that started it.
guard_forkserver()

STATE_VERSION = 1
IDENTITY_KEY = "dataset"
SEED_KEY = "seed"
TOPOLOGY_KEY = "topology"
VERSION_KEY = "version"
PARENT_ENVIRON_KEY = "_parent_environ"
EXIT_CLOSE_KEY = "_closes_at_worker_exit"
MAX_METRIC_ROWS = 256
"""Workers per rank that report metrics (rows of the shared counter table)."""


def adopt_environment(environ: Mapping[str, str] | None) -> None:
    """Make this worker's environment the one the dataset was sent from (a no-op for ``None``).

    A worker forked by the forkserver inherits the server's environment, which is the training
    process's as it was when the server started (``start_worker_context`` starts it early), not
    as it is when the DataLoader starts its workers. Cache locations (``HF_LEROBOT_HOME``), Hub
    endpoints and tokens, and storage credentials (``AWS_*``) set in between would be missing;
    ``spawn`` workers get the current environment, and this gives forkserver workers the same.
    """
    if environ is None:
        return
    for key in [key for key in os.environ if key not in environ]:
        del os.environ[key]
    os.environ.update(environ)


def _weights_argument(weights: Sequence[float]) -> list[float]:
    """``weights=`` as a list (the checks are StreamingConfig's, naming the flag)."""
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ConfigError(f"weights must be a list of numbers, one per dataset of the mixture, got {weights!r}")
    return list(weights)


def _close_if_alive(dataset: weakref.ref[StreamingLeRobotDataset]) -> None:
    alive = dataset()
    if alive is not None:
        alive.close()


def http_options(config: StreamingConfig, num_workers: int) -> HttpOptions:
    """The native HTTP reader settings of one worker of a rank with ``num_workers`` workers."""
    return HttpOptions(
        connections=config.worker_http_connections(num_workers),
        subranges=config.streaming_native_http_subranges,
        retries=config.streaming_http_retries,
        timeout_s=config.streaming_http_timeout_s,
    )


def listed_sources(source: ByteSource) -> list[ListedHttpSource]:
    """The listed remote stores behind ``source`` (each dataset's, for a mixture): whose HTTP
    connections the dataset sets per reader."""
    sources = source.parts if isinstance(source, MixtureSource) else (source,)
    return [s for s in sources if isinstance(s, ListedHttpSource)]


class StreamingLeRobotDataset(LeRobotDatasetProperties, IterableDataset):
    """Streams a LeRobot v3 dataset episode by episode, exact-coverage and resumable.

    Arguments follow LeRobot's own ``StreamingLeRobotDataset`` where the meaning matches;
    ``config`` holds every ``--dataset.streaming_*`` option. ``seed=None`` uses the fixed
    streaming seed 42. ``rank``/``world_size`` default to the distributed process group (or
    the ``RANK``/``WORLD_SIZE`` environment) at construction time.

    Guarantees: over one epoch the ranks and workers together yield every frame of the
    selected episodes exactly once; the same seed gives the same order; a state saved by
    ``StatefulDataLoader`` (or :meth:`state_dict`) resumes exactly where it was taken.
    Construction raises :class:`MetadataError` when the MP4s of this rank's episodes
    contradict the metadata (``lerobot_nodes.video_checks``) or a file they need is missing
    (files only other episodes need do not matter), before any worker starts; every rank checks
    its own episodes, so the ranks together check every selected episode.

    ``bad_episodes`` (``config.streaming_bad_episodes``; this argument overrides it): ``"raise"``
    as above, or ``"skip"``: this rank runs ``inspect``'s checks on its own episodes
    (``dataset_doctor.open_checked``) and leaves the bad ones out of its schedule after the rank
    split, before the worker split (the other ranks' episodes do not change); :attr:`skipped`
    holds them by kind, the metrics report lists them, the resume identity records them. Every
    other selected frame is still yielded exactly once per epoch. An episode whose video fails to
    decode mid-epoch (:class:`VideoDecodeError`) is skipped from that sample on: its samples
    delivered before stay delivered, the failing one and every later one (this epoch and the next)
    are dropped, it is logged once and counted in the metrics report, and the reader's state holds it
    (``nodes.bad_episode_filter``), so a resume from a loader state drops the same samples. The
    schedule itself does not change, so every other frame is still yielded once, in the same order.

    ``batch_size``: iterating yields whole batches collated in the reader (a DataLoader worker:
    one shared-memory segment per batch) instead of samples; use it with ``batch_size=None``
    in the DataLoader. ``streaming_dataloader`` sets it. Batches are what a DataLoader with
    ``batch_size`` would build from the same reader: each worker's samples in order, the
    epoch's last batch of a worker shorter. ``batches_across_workers`` (``streaming_dataloader``
    sets it to the worker count when ``streaming_batches_across_workers`` is on): each worker
    yields parts of ``batch_size / batches_across_workers`` samples instead, which the loader
    joins one per worker into a batch (``lerobot_nodes.batch_memory.worker_parts``).
    """

    def __init__(
        self,
        repo_id: str | Sequence[str] | None = None,
        root: RootArgument | Sequence[RootArgument] | None = None,
        episodes: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
        image_transforms: Callable[[Any], Any] | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = 1e-4,
        revision: str | Sequence[str | None] | None = None,
        max_num_shards: int | None = None,
        seed: int | None = None,
        return_uint8: bool = False,
        *,
        repo_type: str | Sequence[str] = "dataset",
        token: str | bool | None = None,
        config: StreamingConfig | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        depth_output_unit: str = DEFAULT_DEPTH_UNIT,
        batch_size: int | None = None,
        rename_map: Mapping[str, Mapping[str, str]] | None = None,
        bad_episodes: str | None = None,
        weights: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        exit_if_reimporting_main()  # a worker running an unguarded training script again: one line, not a crash
        # The DataLoader workers' server, forked now while this process may be (before a file system's or our threads).
        start_before_threads(filesystem_modules(root))
        config = config or StreamingConfig()
        if bad_episodes is not None:
            config = dataclasses.replace(config, streaming_bad_episodes=bad_episodes)
        if max_num_shards is not None:
            config = dataclasses.replace(config, max_num_shards=max(1, int(max_num_shards)))
        if weights is not None:
            config = dataclasses.replace(config, streaming_weights=_weights_argument(weights))
        self.config = config
        # A strategy the user chose is compared with a checkpoint's; an unset one adopts it (_adopt_strategy_of).
        self._strategy_chosen = config.streaming_sampling_strategy is not None
        self.repo_id = repo_id if repo_id is None or isinstance(repo_id, str) else list(repo_id)
        self.source: ByteSource
        self.meta: DatasetMeta
        if is_mixture(repo_id, root):
            if config.streaming_bad_episodes == BAD_EPISODES_SKIP and config.streaming_weights is not None:
                raise ConfigError(
                    "--dataset.streaming_bad_episodes=skip and --dataset.streaming_weights do not go together: a "
                    "weighted mixture needs every worker to hold episodes of every dataset, which skipped ones could "
                    "break; leave the weights unset, or check each dataset with `lerobot-nodes inspect` and select "
                    "its good episodes with --dataset.episodes"
                )
            self.source, self.meta, self.episodes = open_mixture(
                MixtureRequest.of(repo_id, root, revision, repo_type), episodes, rename_map, token=token,
                http=http_options(config, 1),
                byte_cache=lambda: byte_cache_from_options(config.streaming_disk_cache_gb, config.streaming_disk_cache_dir),
            )
        else:
            if rename_map is not None:
                raise ConfigError("rename_map applies to a mixture: give repo_id (or root) as a list of datasets")
            if isinstance(episodes, Mapping):
                raise ConfigError("episodes as a {dataset: [episodes]} dict is for a mixture; give a list of episodes")
            if isinstance(revision, (list, tuple)) or isinstance(repo_type, (list, tuple)):
                raise ConfigError(
                    "revision or repo_type is a list but repo_id and root name one dataset: give repo_id "
                    "(or root) as a list to stream a mixture"
                )
            # Not a mixture: repo_id, root, revision and repo_type are single values (is_mixture and the checks above).
            single_repo = cast("str | None", repo_id)
            self.source = open_source(
                cast("RootArgument | None", root), repo_id=single_repo, revision=cast("str | None", revision),
                repo_type=cast(str, repo_type), token=token, http=http_options(config, 1),
            )
            if self.source.caches_bytes:  # remote bytes go through the node-local disk cache; a local folder never does
                self.source.use_byte_cache(
                    byte_cache_from_options(config.streaming_disk_cache_gb, config.streaming_disk_cache_dir)
                )
            # The files are checked for this rank's episodes only (_open_indexes), not for every episode.
            self.meta = load_meta(self.source, repo_id=single_repo, check_files=False)
            self.episodes = select_episodes(self.meta, episodes)
        self._weighted_parts = self._check_weights()
        self.delta_timestamps = dict(delta_timestamps) if delta_timestamps is not None else None
        self.tolerance_s = tolerance_s
        self.image_transforms = image_transforms
        self.return_uint8 = return_uint8
        if batch_size is not None and int(batch_size) < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = None if batch_size is None else int(batch_size)
        # Batches a DataLoader worker may have sent and the training process not yet released
        # (``prefetch_factor`` + 2; set by streaming_dataloader): how many camera segments a
        # worker keeps for reuse (lerobot_nodes.batch_memory.recycled_storage).
        self.batches_in_flight = DEFAULT_BATCHES_IN_FLIGHT
        # Workers whose parts the loader joins into each batch (1: a batch comes from one worker).
        self.batches_across_workers = 1
        # The shared batches the workers' parts are written into (streaming_dataloader sets it).
        self.batch_ring: BatchRing | None = None
        self.seed = resolve_seed(seed)
        detected_rank, detected_world = get_rank_and_world_size()
        self.rank = detected_rank if rank is None else int(rank)
        self.world_size = detected_world if world_size is None else int(world_size)
        # Validate now, in the main process, so errors do not surface inside workers.
        self.depth_output_unit = depth_output_unit
        SampleSpec.from_meta(self.meta, self.delta_timestamps, tolerance_s, depth_output_unit=depth_output_unit)
        # What a saved state is checked against on load: the dataset, the selection, the schedule settings.
        self.identity = dataset_identity(
            self.source.url, self.source.revision, self.meta, self.episodes, config,
            rank_pool=default_rank_pool_size(self.batch_size),
        )
        self._pool_from_checkpoint = False
        self.skipped = BadEpisodes()
        """This rank's episodes left out as bad (``bad_episodes="skip"``), by kind; empty with ``raise``."""
        self._indexes: dict[str, VideoIndex] | None = self._open_indexes()
        if self._weighted_parts is None:
            self.max_workers = max_workers_for_rank(
                self.episodes, self._lengths(), self.rank, self.world_size, self.seed, self.excluded
            )
        else:
            self.max_workers = weighted_max_workers(
                self._weighted_parts, self._length_map(), self.rank, self.world_size, self.seed, self._part_names()
            )
        self.counters = WorkerCounters(MAX_METRIC_ROWS)
        self.metrics = StreamingMetrics(self.counters)
        self.metrics.set_skipped(self.skipped.lines())
        self.found_bad: set[int] = set()
        """The episodes this reader found bad while decoding (``skip``): its graphs drop their samples
        from the failing one on; a checkpoint's worker state holds them (``nodes.bad_episode_filter``)."""
        self._graph: StreamingGraph | None = None
        self._graph_key: tuple[int, int, WorkerStart | None, int | None, int, int | None, str] | None = None
        # Where the next iter() starts after a resume (lerobot_nodes.resume.orchestrator).
        self._resume = ResumeOrchestrator()

    def _open_indexes(self) -> dict[str, VideoIndex]:
        """The MP4 indexes of this rank's episodes, checked against the metadata.

        Opened here, in the main process, so that metadata the videos contradict (camera info,
        spans past the end of a file) fails the construction instead of a frame mid-epoch. Only
        the files of the episodes this rank reads (``nodes.sharder.rank_episodes``) are opened
        and checked: every rank checks its own share, so the ranks together check every selected
        episode once, and no rank opens (or builds) the indexes of files it never reads. Workers
        open their own share again, from the cache this open fills. With ``bad_episodes="skip"``
        the bad ones of this share are left in :attr:`skipped` instead of raising.
        """
        if self._weighted_parts is None:
            episodes = rank_episodes(self.episodes, self._lengths(), self.rank, self.world_size, self.seed)
        else:  # each dataset split over the ranks on its own
            episodes = weighted_rank_episodes(
                self._weighted_parts, self._length_map(), self.rank, self.world_size, self.seed, self._part_names()
            )
        workers = self._index_build_workers()
        listed = listed_sources(self.source)
        if self.config.streaming_native_http_connections is not None:
            listed = []  # the user's connection budget stands
        for source in listed:  # one connection per file in flight while indexing (the reader's default is max_num_shards)
            source.set_http_options(dataclasses.replace(http_options(self.config, 1), connections=workers))
        skip = self.config.streaming_bad_episodes == BAD_EPISODES_SKIP
        try:
            if isinstance(self.meta, MixtureMeta) and isinstance(self.source, MixtureSource):
                indexes = self._open_mixture_indexes(self.source, self.meta, episodes, workers, skip)
            else:
                open_strict = functools.partial(self._open_video_files, self.source, self.meta, workers)
                indexes, self.skipped = open_checked(self.meta, episodes, self.tolerance_s, open_strict, skip=skip)
        finally:
            for source in listed:
                source.set_http_options(http_options(self.config, 1))
        if skip:
            self._note_skipped(len(episodes))
        return indexes

    def _note_skipped(self, owned: int) -> None:
        """Log the skipped episodes (one warning per kind), record them in the identity; refuse a rank left with none."""
        self.identity = with_skipped(self.identity, self.skipped.episodes.tolist())
        for line in self.skipped.lines():
            logger.warning("--dataset.streaming_bad_episodes=skip: rank %d leaves out %s", self.rank, line)
        if len(self.skipped) >= owned:
            raise ConfigError(
                f"--dataset.streaming_bad_episodes=skip left rank {self.rank} no episode: all {owned} of its episodes "
                f"are bad ({'; '.join(self.skipped.lines())}); `lerobot-nodes inspect` lists every problem"
            )

    def checkpoint_identity(self) -> dict[str, Any]:
        """:attr:`identity` as a checkpoint records it: with the count of episodes its readers found bad while
        decoding, when any (``streaming_bad_episodes=skip``), which a step offset cannot resume past."""
        return with_found_bad(self.identity, int(self.counters.totals()[BAD_EPISODES_FOUND]))

    @property
    def excluded(self) -> frozenset[int]:
        """The episodes this rank leaves out of its schedule (:attr:`skipped`)."""
        return frozenset(int(e) for e in self.skipped.episodes.tolist())

    def _open_mixture_indexes(
        self, source: MixtureSource, meta: MixtureMeta, episodes: Sequence[int], workers: int, skip: bool
    ) -> dict[str, VideoIndex]:
        """Each dataset's indexes of its share of ``episodes``, opened and checked as when it is read
        alone (its own source, sidecars and metadata, :func:`open_checked`: a missing file refuses only
        the episodes that need it), keyed by mixture path. With ``skip`` each dataset's bad episodes are
        left in :attr:`skipped` by their mixture ids, each kind's reason naming the dataset."""
        opened: dict[str, VideoIndex] = {}
        found: list[tuple[str, BadEpisodes]] = []
        for part, local in enumerate(meta.split_episodes(episodes)):
            if not len(local):
                continue
            chosen = local.tolist()
            part_meta = meta.parts[part]
            open_strict = functools.partial(self._open_video_files, source.parts[part], part_meta, workers)
            indexes, bad = open_checked(part_meta, chosen, self.tolerance_s, open_strict, skip=skip)
            found.append((meta.names[part], bad.shifted(int(meta.episode_offsets[part]))))
            opened.update((part_prefix(part) + path, index) for path, index in indexes.items())
        self.skipped = BadEpisodes.of_datasets(found)
        return opened

    def _open_video_files(
        self, source: ByteSource, meta: DatasetMeta, workers: int, paths: list[str]
    ) -> dict[str, VideoIndex]:
        """The MP4 indexes of ``paths`` of one dataset (its sidecar, its cache, or built ``workers`` at once)."""
        return open_video_indexes(
            source, meta, paths, lock_timeout_s=self.config.streaming_sidecar_lock_timeout_s, build_workers=workers
        )

    def _index_build_workers(self) -> int:
        """Video files indexed at once when indexes must be built: ``streaming_index_concurrency`` when
        set, else ``streaming_native_http_connections`` when set (the rank's connection budget), else
        ``sidecar.default_build_workers`` (4 local, 32 remote)."""
        explicit = self.config.streaming_index_concurrency
        if explicit is None:
            explicit = self.config.streaming_native_http_connections
        if explicit is not None:
            return int(explicit)
        sources = self.source.parts if isinstance(self.source, MixtureSource) else (self.source,)
        return max(default_build_workers(source) for source in sources)

    def _check_weights(self) -> list[list[int]] | None:
        """Per dataset its selected global episodes when ``--dataset.streaming_weights`` is set (checked
        against the datasets: one weight each), else None."""
        weights = self.config.streaming_weights
        if weights is None:
            return None
        if not isinstance(self.meta, MixtureMeta):
            raise ConfigError(
                "--dataset.streaming_weights (weights=) weighs the datasets of a mixture, but one dataset is streamed: "
                "give repo_id (or root) as a list of datasets, or leave the weights unset"
            )
        normalized_weights(weights, len(self.meta.parts))
        parts = self.meta.dataset_episodes(self.episodes)
        for name, part in zip(self.meta.names, parts, strict=True):
            if not part:
                raise ConfigError(
                    f"--dataset.streaming_weights gives dataset {name} a weight but none of its episodes is selected"
                )
        return parts

    def _part_names(self) -> tuple[str, ...] | None:
        return self.meta.names if isinstance(self.meta, MixtureMeta) else None

    def _length_map(self) -> dict[int, int]:
        return dict(zip(self.episodes, self._lengths(), strict=True))

    def _lengths(self) -> list[int]:
        """Frame counts of the selected episodes, aligned with ``self.episodes``."""
        return self.meta.episodes.length[self.episodes].tolist() if self.episodes else []

    def clamp_num_workers(self, num_workers: int) -> int:
        """``num_workers`` limited to the episodes this rank owns (a warning when it is cut)."""
        if num_workers > self.max_workers:
            owns = (
                f"it owns {self.max_workers} episode(s)" if self._weighted_parts is None
                else f"with --dataset.streaming_weights every worker reads every dataset, and it owns {self.max_workers} "
                "episode(s) of its smallest dataset share"
            )
            warnings.warn(
                f"--num_workers={num_workers} is more than rank {self.rank} can feed: {owns} and a worker needs at "
                f"least one whole episode; using {self.max_workers} worker(s)",
                stacklevel=2,
            )
            return self.max_workers
        return num_workers

    def __getstate__(self) -> dict[str, Any]:
        if spawning_elsewhere():  # a plain DataLoader's spawn/forkserver workers: the early server is not needed
            retire_unused_server()
        # A live graph holds threads and is never picklable; each worker builds its own.
        state = self.__dict__.copy()
        state["_graph"] = None
        state["_graph_key"] = None
        state["_indexes"] = None  # a worker opens the indexes of its own episodes
        # The environment of the process sending the dataset to a worker: a forkserver's children
        # inherit the server's environment, frozen when it started (see adopt_environment).
        state[PARENT_ENVIRON_KEY] = dict(os.environ)
        state.pop(EXIT_CLOSE_KEY, None)
        return state

    # -- iteration ------------------------------------------------------------------------
    def _physical_topology(self) -> tuple[int, int]:
        info = get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 0)

    def _build_graph(self, worker_id: int, num_workers: int, epoch: int, start: WorkerStart | None) -> StreamingGraph:
        if num_workers == 0:
            retire_unused_server()  # read without workers: the server the constructor started is not needed
        else:
            # A worker of any DataLoader (not only streaming_dataloader's) ends with the
            # training process; idempotent, and a no-op when worker_init_fn did it already.
            guard_worker()
            arrow_allocates_from_the_heap()
            adopt_environment(self.__dict__.pop(PARENT_ENVIRON_KEY, None))
            if not self.__dict__.get(EXIT_CLOSE_KEY):
                self.__dict__[EXIT_CLOSE_KEY] = True
                # multiprocessing runs exit finalizers before it joins the worker's threads: a decode
                # thread still waiting for a payload is cancelled first, so the worker exits when asked.
                multiprocessing.util.Finalize(None, _close_if_alive, args=(weakref.ref(self),), exitpriority=100)
        for source in listed_sources(self.source):
            source.set_http_options(http_options(self.config, num_workers))
        schedule_worker = worker_id if start is None else start.schedule_worker
        return build_streaming_graph(
            self.source,
            self.meta,
            self.episodes,
            reader=ReaderSlot(self.rank, self.world_size, schedule_worker, num_workers),
            config=self.config,
            schedule=ScheduleStart(
                seed=self.seed,
                epoch=epoch if start is None else start.epoch,
                assigned=None if start is None else start.assigned,
                carried=None if start is None else start.carried_map(),
                tails=None if start is None else start.tails_map(),
                worker_split=self.worker_split,
                excluded=self.excluded,
                weights=self.config.streaming_weights,
                rank_pool=self.rank_pool,
                open_runs_rule=open_runs_rule_of(self.identity),
            ),
            samples=self._sample_options(transforms_on_consumer=num_workers == 0),
            batches=None
            if self.batch_size is None
            else BatchOptions(
                self._part_size(schedule_worker, num_workers),
                shared_memory=num_workers > 0,
                batches_in_flight=self.batches_in_flight,
                # Worker w fills its rows of the ring's batches: rows by DataLoader worker, the order the
                # parts arrive in (the ring checks that the part's size is that worker's share).
                ring=self.batch_ring if num_workers > 1 and self.batches_across_workers == num_workers else None,
                ring_worker=worker_id,
            ),
            services=GraphServices(
                opened_indexes=self._indexes, metrics=WorkerMetrics(self.counters, row=worker_id % MAX_METRIC_ROWS),
                found_bad=self.found_bad,
            ),
        )

    def _part_size(self, schedule_worker: int, num_workers: int) -> int:
        """Samples per batch this worker assembles: the batch size, or its share of a batch joined across workers."""
        assert self.batch_size is not None
        if self.batches_across_workers <= 1 or num_workers <= 1:
            return self.batch_size
        return split_evenly(self.batch_size, self.batches_across_workers, schedule_worker)

    def ring_cameras(self) -> list[CameraSpec] | None:
        """The cameras as the workers write them into a batch ring (``streaming_graph.ring_cameras``);
        None where they are not known before the first batch (the ring then makes its slots from it)."""
        if self._weighted_parts is not None or not isinstance(self.meta, DatasetMeta):
            return None
        return ring_cameras(self._sample_options(), self.meta)

    def _sample_options(self, transforms_on_consumer: bool = False) -> SampleOptions:
        return SampleOptions(
            delta_timestamps=self.delta_timestamps,
            tolerance_s=self.tolerance_s,
            image_transforms=self.image_transforms,
            transforms_on_consumer=transforms_on_consumer,
            return_uint8=self.return_uint8,
            depth_output_unit=self.depth_output_unit,
        )

    def _ensure_graph(self, epoch: int = 0, start: WorkerStart | None = None) -> StreamingGraph:
        """The graph of this reader: its own schedule from ``epoch``, or ``start``'s first epoch."""
        worker_id, num_workers = self._physical_topology()
        key = (
            worker_id, num_workers, start, self.batch_size, self.batches_across_workers, self.rank_pool,
            open_runs_rule_of(self.identity),
        )  # fmt: skip
        if self._graph is None or self._graph_key != key:
            self.close()
            # An elastic start reads its remnant part alone (maybe none), but a weighted mixture's reader
            # continues with its plain share of every dataset in the same graph.
            plain_follows = start is None or not start.elastic or self._weighted_parts is not None
            if plain_follows and max(1, num_workers) > self.max_workers:
                raise ConfigError(
                    f"rank {self.rank} owns {self.max_workers} episode(s) but the DataLoader has {num_workers} workers; "
                    f"a worker needs at least one whole episode: use --num_workers={self.max_workers} or fewer "
                    "(StreamingLeRobotDataset.clamp_num_workers does this with a warning)"
                )
            self._graph = self._build_graph(worker_id, num_workers, epoch, start)
            self._graph_key = key
        return self._graph

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker_id, num_workers = self._physical_topology()
        begin = self._resume.begin(self._rank_schedule, worker_id, num_workers)
        if begin is None:
            # A new iterator after a finished one is the next epoch (the sharder counts epochs).
            graph = self._ensure_graph()
            graph.root.reset(None)
        elif isinstance(begin, PlainEpochs):
            # The resume's epoch is over: plain epochs of this reader's own schedule from here.
            self.close()
            graph = self._ensure_graph(epoch=begin.epoch)
            graph.root.reset(None)
        else:
            start, state = begin.start, begin.graph_state
            graph = self._ensure_graph(start=start)
            if state is None and start is not None and not start.elastic:
                # Exact continuation: the schedule fast-forwarded on the logical level, nothing fetched.
                state = graph.state_after(start.samples, start.epoch)
            graph.root.reset(state)
        return self._samples(graph)

    def _samples(self, graph: StreamingGraph) -> Iterator[dict[str, Any]]:
        root = graph.root
        while True:
            try:
                sample = root.next()
            except StopIteration:
                return
            yield sample

    def close(self) -> None:
        """Stop the graph's threads (the graph is rebuilt on the next ``iter()``)."""
        if self._graph is not None:
            self._graph.close()
            self._graph = None

    # -- state ----------------------------------------------------------------------------
    def _topology_state(self) -> dict[str, int]:
        worker_id, num_workers = self._physical_topology()
        return {"rank": self.rank, "world_size": self.world_size, "worker_id": worker_id, "num_workers": num_workers}

    def state_dict(self) -> dict[str, Any]:
        """Small, plain state: the graph's schedule position, the seed, the topology and the dataset identity.

        During the first epoch after a step resume it also records that epoch's start (which old
        worker's schedule, or which remnant episodes, this reader continues); before the first
        ``iter()`` of a step resume, the step checkpoint itself.
        """
        graph = self._graph
        return {
            VERSION_KEY: STATE_VERSION,
            SEED_KEY: self.seed,
            TOPOLOGY_KEY: self._topology_state(),
            IDENTITY_KEY: self.identity,
            **self._resume.saved(lambda: None if graph is None else graph.root.state_dict()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume exactly from :meth:`state_dict`, in the topology it was taken in.

        The seed is restored; another dataset, selection or schedule is a ``ConfigError``. A
        state from another rank count or worker count is a ``ConfigError`` too: it holds only
        its own rank's position, so it cannot say what the other ranks delivered. Resume such a
        run with :meth:`resume_from_step` and the training checkpoint's step: every rank then
        replays every old rank's schedule and the rest of the epoch is split over the new
        topology, each frame once. (A state without an identity, from an older version, is not checked.)
        """
        if not isinstance(state, dict) or state.get(VERSION_KEY) != STATE_VERSION:
            raise ConfigError(
                f"this is not a StreamingLeRobotDataset state of version {STATE_VERSION}: got keys "
                f"{sorted(state) if isinstance(state, dict) else type(state).__name__}; checkpoints of the older "
                "multi-worker sampler cannot be resumed exactly: start a new run from the saved policy weights"
            )
        self._adopt_strategy_of(state.get(IDENTITY_KEY))
        check_identity(state.get(IDENTITY_KEY), self.identity)
        # The run keeps splitting a rank's episodes over its workers, and sizing its pool, as the checkpoint did.
        self._adopt_schedule_of(state.get(IDENTITY_KEY))
        saved = state[TOPOLOGY_KEY]
        current = self._topology_state()
        changed = {k: (saved[k], current[k]) for k in ("rank", "world_size", "num_workers") if saved[k] != current[k]}
        if changed:
            details = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
            raise ConfigError(
                f"cannot resume this loader state: {details}. A loader state holds only its own rank's position and "
                "batch ownership changes with world size, batch size and --num_workers; resume with the same three, "
                f"or call resume_from_step(step, batch_size, num_workers={saved['num_workers']}, "
                f"world_size={saved['world_size']}, seed={state[SEED_KEY]}) with the training checkpoint's step and "
                "batch size: the rest of the epoch is then split over the new topology, every frame once"
            )
        if int(state[SEED_KEY]) != self.seed:
            logger.info("restoring the streaming seed %s from the checkpoint (was %s)", state[SEED_KEY], self.seed)
            self.seed = int(state[SEED_KEY])
        self.close()
        self._resume.restore(state, saved)

    # -- LeRobot-style resume from a step ---------------------------------------------------
    def resume_from_step(
        self,
        step: int,
        batch_size: int,
        num_workers: int,
        world_size: int | None = None,
        seed: int | None = None,
        *,
        identity: Mapping[str, Any] | None = None,
    ) -> None:
        """Continue after ``step`` batches of ``batch_size`` (a LeRobot ``training_step.json``).

        ``num_workers``, ``world_size`` (default: this run's) and ``seed`` are the checkpointed
        run's (pass ``seed=42`` for checkpoints made before the seed reached the dataset); this
        run's topology comes from the environment and the DataLoader as usual.

        Guarantees (``lerobot_nodes.resume.planning``): the skipped samples are never fetched or decoded.
        Same world size and worker count: every worker continues its own schedule, sample-exact
        when the batch size is unchanged. Another world size or worker count: every rank replays
        the old schedules of all ranks, and the frames not yet delivered in the current epoch are
        split frame-balanced over the new ranks and workers, each delivered exactly once; the
        order differs from an uninterrupted run; later epochs use the new topology from scratch. A
        weighted mixture's are each dataset's own epochs: per dataset, what no old worker delivered of
        its current epoch (and the old visits of its previous one still open) is split over the new
        readers and read first, then that dataset's plain epochs, weighed as before.
        Deterministic: the same checkpoint and new topology give the same samples. Logged once.
        ``identity`` (the checkpointed dataset's :attr:`identity`, when the checkpoint has it) is
        checked first: another dataset, episode selection, sampling strategy, pool size or byte
        budget cannot be honoured (the replay would not be the old schedule) and is a ``ConfigError``;
        its worker split is adopted (:attr:`worker_split`), and whether its batches joined a part of
        every worker tells how its steps map to each worker's samples. Without ``identity`` the step
        is replayed with this version's worker split and this run's ``streaming_batches_across_workers``.
        """
        if identity is not None:
            refuse_step_resume_after_found_bad(identity)
            self._adopt_strategy_of(identity)
            check_identity(dict(identity), self.identity)
            self._adopt_schedule_of(identity)
        old_world = self.world_size if world_size is None else int(world_size)
        if seed is not None and resolve_seed(seed) != self.seed:
            self.seed = resolve_seed(seed)
        across = (
            batches_across_workers_of(identity) if identity is not None else self.config.streaming_batches_across_workers
        )
        checkpoint = StepCheckpoint(
            int(step), int(batch_size), Topology(old_world, int(num_workers)), across_workers=across
        )
        self.close()
        self._resume.from_step(checkpoint)

    def _adopt_strategy_of(self, identity: Mapping[str, Any] | None) -> None:
        """Take the checkpointed run's sampling strategy when this run leaves it unset (a set one is compared)."""
        saved = sampling_strategy_of(identity)
        if saved is None or self._strategy_chosen or saved == self.config.sampling_strategy:
            return
        self.config = dataclasses.replace(self.config, streaming_sampling_strategy=saved)
        self.identity = {**self.identity, SAMPLING_STRATEGY: self.config.sampling_strategy}
        self.close()  # a graph built with the other strategy is stale

    def _adopt_schedule_of(self, identity: Mapping[str, Any] | None) -> None:
        """Keep the checkpointed run's worker split, default rank pool (see :attr:`rank_pool`) and open-runs rule."""
        self.identity = with_open_runs_rule(
            with_rank_pool(with_worker_split(self.identity, worker_split_of(identity)), rank_pool_of(identity)),
            open_runs_rule_of(identity),
        )
        self._pool_from_checkpoint = True

    def size_pool_for(self, batch_size: int) -> None:
        """Size the default pool for batches of ``batch_size`` (``streaming_dataloader`` calls it), unless a
        checkpoint's pool was adopted: a resumed run keeps the pool its schedule was made with."""
        if not self._pool_from_checkpoint:
            self.identity = with_rank_pool(self.identity, default_rank_pool_size(int(batch_size)))

    @property
    def rank_pool(self) -> int | None:
        """Episodes this rank mixes when ``streaming_episode_pool_size`` is unset: 4 batches of episodes, at
        least 32 (``config.default_rank_pool_size``; 32 until a loader gives the batch size), recorded in
        :attr:`identity`. A resumed run keeps its checkpoint's; None for checkpoints of the versions before
        the batch-sized pool, whose rule (32, open runs sized for 32 episodes) the run then keeps."""
        return rank_pool_of(self.identity)

    def plan_resume(self, num_workers: int, batch_size: int | None = None) -> None:
        """Plan a pending step resume for a DataLoader of ``num_workers`` workers (as requested, before
        clamping: every rank must take the same decision) and ``batch_size`` (for the log line), in this process.

        ``streaming_dataloader`` calls it, so another topology's replay runs once per rank
        (before the workers start) and the change is logged in the training process; without
        it every reader plans on its first ``iter()``. A no-op without a pending step resume.
        """
        self._resume.plan(self._rank_schedule, Topology(self.world_size, int(num_workers)), batch_size)

    def _rank_schedule(self) -> RankSchedule:
        """This rank's plain schedules, what a step resume is planned against."""
        skip = self.config.streaming_bad_episodes == BAD_EPISODES_SKIP
        rules = ScheduleStart(
            seed=self.seed, worker_split=self.worker_split, rank_pool=self.rank_pool,
            open_runs_rule=open_runs_rule_of(self.identity),
        )  # fmt: skip
        samplers = plain_samplers(
            self.source, self.meta, self.episodes, self.config, self._sample_options(), rules, self._indexes,
            excluded={self.rank: self.excluded} if skip else None,
        )
        parts, names, lengths = self._weighted_parts, self._part_names(), self._length_map()
        feedable = None
        if parts is not None:  # every worker reads every dataset (see clamp_num_workers)

            def feedable(rank: int, world_size: int) -> int:
                return weighted_max_workers(parts, lengths, rank, world_size, self.seed, names)

        return RankSchedule(
            self.episodes, self._lengths(), self.rank, self.world_size, self.seed, samplers, self.worker_split,
            excluded=self.excluded if skip else None, weighted=parts is not None, feedable_workers=feedable,
        )

    @property
    def worker_split(self) -> str:
        """How this rank's episodes are split over its DataLoader workers (``nodes.sharder.WORKER_SPLITS``):
        ``contiguous`` for a new run; a resumed run keeps its checkpoint's, recorded in :attr:`identity`
        (``scattered`` for checkpoints of the versions before the contiguous split)."""
        return worker_split_of(self.identity)

    def worker_samples(self, num_workers: int) -> list[int]:
        """Samples each worker of this rank yields per epoch."""
        lengths = self._lengths()
        return [
            sum(
                int(self.meta.episodes.length[e])
                for e in worker_episodes(
                    self.episodes, lengths, self.rank, self.world_size, w, num_workers, self.seed, self.worker_split,
                    self.excluded,
                )
            )
            for w in range(max(1, num_workers))
        ]
