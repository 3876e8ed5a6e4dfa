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
import logging
import multiprocessing
import multiprocessing.context
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info
from torchdata.nodes.samplers.utils import get_rank_and_world_size

from .config import StreamingConfig, resolve_seed
from .dataset_properties import LeRobotDatasetProperties
from .depth import DEFAULT_DEPTH_UNIT
from .errors import ConfigError
from .identity import check_identity, dataset_identity
from .lifeline import GuardedWorkerInit, guard_forkserver, guard_worker
from .meta import DatasetMeta, load_meta, select_episodes
from .metrics import StreamingMetrics, WorkerCounters, WorkerMetrics
from .mp4.index import VideoIndex
from .nodes.graph import StreamingGraph, build_streaming_graph
from .nodes.sharder import max_workers_for_rank, worker_episodes
from .resume import WorkerOffset, resume_point
from .sample import SampleSpec
from .sidecar import open_video_indexes
from .sources import ByteSource
from .sources.http_range import HttpOptions
from .sources.listed import ListedHttpSource
from .sources.resolve import open_source
from .video_checks import check_video_metadata

logger = logging.getLogger("lerobot_nodes.dataset")

# worker_context() has the forkserver preload this module: there (and only there) this ties
# the server's life to the training process that started it.
guard_forkserver()

STATE_VERSION = 1
GRAPH_KEY = "graph"
IDENTITY_KEY = "dataset"
SEED_KEY = "seed"
TOPOLOGY_KEY = "topology"
VERSION_KEY = "version"
MAX_METRIC_ROWS = 256
"""Workers per rank that report metrics (rows of the shared counter table)."""


def http_options(config: StreamingConfig, num_workers: int) -> HttpOptions:
    """The native HTTP reader settings of one worker of a rank with ``num_workers`` workers."""
    return HttpOptions(
        connections=config.worker_http_connections(num_workers),
        subranges=config.streaming_native_http_subranges,
        retries=config.streaming_http_retries,
        timeout_s=config.streaming_http_timeout_s,
    )


class StreamingLeRobotDataset(LeRobotDatasetProperties, IterableDataset):
    """Streams a LeRobot v3 dataset episode by episode, exact-coverage and resumable.

    Arguments follow LeRobot's own ``StreamingLeRobotDataset`` where the meaning matches;
    ``config`` holds every ``--dataset.streaming_*`` option. ``seed=None`` uses the fixed
    streaming seed 42. ``rank``/``world_size`` default to the distributed process group (or
    the ``RANK``/``WORLD_SIZE`` environment) at construction time.

    Guarantees: over one epoch the ranks and workers together yield every frame of the
    selected episodes exactly once; the same seed gives the same order; a state saved by
    ``StatefulDataLoader`` (or :meth:`state_dict`) resumes exactly where it was taken.
    Construction raises :class:`MetadataError` when the MP4s of the selected episodes
    contradict the metadata (``lerobot_nodes.video_checks``), before any worker starts.
    """

    def __init__(
        self,
        repo_id: str | None = None,
        root: str | os.PathLike[str] | ByteSource | None = None,
        episodes: Sequence[int] | None = None,
        image_transforms: Callable[[Any], Any] | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = 1e-4,
        revision: str | None = None,
        max_num_shards: int | None = None,
        seed: int | None = None,
        return_uint8: bool = False,
        *,
        repo_type: str = "dataset",
        token: str | bool | None = None,
        config: StreamingConfig | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        depth_output_unit: str = DEFAULT_DEPTH_UNIT,
    ) -> None:
        super().__init__()
        config = config or StreamingConfig()
        if max_num_shards is not None:
            config = dataclasses.replace(config, max_num_shards=max(1, int(max_num_shards)))
        self.config = config
        self.repo_id = repo_id
        self.source = open_source(
            root, repo_id=repo_id, revision=revision, repo_type=repo_type, token=token, http=http_options(config, 1)
        )
        self.meta: DatasetMeta = load_meta(self.source, repo_id=repo_id)
        self.episodes = select_episodes(self.meta, episodes)
        self.delta_timestamps = dict(delta_timestamps) if delta_timestamps is not None else None
        self.tolerance_s = tolerance_s
        self.image_transforms = image_transforms
        self.return_uint8 = return_uint8
        self.seed = resolve_seed(seed)
        detected_rank, detected_world = get_rank_and_world_size()
        self.rank = detected_rank if rank is None else int(rank)
        self.world_size = detected_world if world_size is None else int(world_size)
        # Validate now, in the main process, so errors do not surface inside workers.
        self.depth_output_unit = depth_output_unit
        SampleSpec.from_meta(self.meta, self.delta_timestamps, tolerance_s, depth_output_unit=depth_output_unit)
        # What a saved state is checked against on load: the dataset, the selection, the schedule settings.
        self.identity = dataset_identity(self.source.url, self.source.revision, self.meta, self.episodes, config)
        self.max_workers = max_workers_for_rank(self.episodes, self._lengths(), self.rank, self.world_size, self.seed)
        self._indexes: dict[str, VideoIndex] | None = self._open_indexes()
        self.counters = WorkerCounters(MAX_METRIC_ROWS)
        self.metrics = StreamingMetrics(self.counters)
        self._graph: StreamingGraph | None = None
        self._graph_topology: tuple[int, int] | None = None
        # After a step-offset resume, DataLoader worker p plays worker (p + shift) % n for the rest
        # of that epoch, because a new DataLoader asks worker 0 first (see _state_after_step).
        self._worker_shift = 0
        self._shifted_epoch: int | None = None
        self._pending_state: dict[str, Any] | None = None
        self._pending_step: tuple[int, int, int] | None = None
        self._iterated = False

    def _open_indexes(self) -> dict[str, VideoIndex]:
        """The MP4 indexes of the selected episodes, checked against the metadata.

        Opened here, in the main process, so that metadata the videos contradict (camera info,
        spans past the end of a file) fails the construction instead of a frame mid-epoch.
        Workers open their own share again, from the cache this open fills.
        """
        paths = self.meta.video_files(self.episodes)
        indexes = open_video_indexes(
            self.source, self.meta, paths, lock_timeout_s=self.config.streaming_sidecar_lock_timeout_s
        )
        check_video_metadata(self.meta, indexes, self.episodes, self.tolerance_s)
        return indexes

    def _lengths(self) -> list[int]:
        """Frame counts of the selected episodes, aligned with ``self.episodes``."""
        return [int(self.meta.episodes.length[e]) for e in self.episodes]

    def rank_num_frames(self) -> int:
        """Frames this rank yields per epoch."""
        owned = worker_episodes(self.episodes, self._lengths(), self.rank, self.world_size, 0, 1, self.seed)
        return int(sum(int(self.meta.episodes.length[e]) for e in owned))

    def clamp_num_workers(self, num_workers: int) -> int:
        """``num_workers`` limited to the episodes this rank owns (a warning when it is cut)."""
        if num_workers > self.max_workers:
            warnings.warn(
                f"--num_workers={num_workers} is more than rank {self.rank} can feed: it owns {self.max_workers} "
                f"episode(s) and a worker needs at least one whole episode; using {self.max_workers} worker(s)",
                stacklevel=2,
            )
            return self.max_workers
        return num_workers

    def __getstate__(self) -> dict[str, Any]:
        # A live graph holds threads and is never picklable; each worker builds its own.
        state = self.__dict__.copy()
        state["_graph"] = None
        state["_graph_topology"] = None
        state["_indexes"] = None  # a worker opens the indexes of its own episodes
        return state

    # -- iteration ------------------------------------------------------------------------
    def _physical_topology(self) -> tuple[int, int]:
        info = get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 0)

    def _topology(self) -> tuple[int, int]:
        """(the worker whose schedule this process reads, number of workers)."""
        worker_id, num_workers = self._physical_topology()
        if num_workers > 0 and self._worker_shift:
            return (worker_id + self._worker_shift) % num_workers, num_workers
        return worker_id, num_workers

    def _build_graph(self, worker_id: int, num_workers: int, epoch: int) -> StreamingGraph:
        if num_workers > 0:
            # A worker of any DataLoader (not only streaming_dataloader's) ends with the
            # training process; idempotent, and a no-op when worker_init_fn did it already.
            guard_worker()
        if isinstance(self.source, ListedHttpSource):
            self.source.set_http_options(http_options(self.config, num_workers))
        return build_streaming_graph(
            self.source,
            self.meta,
            self.episodes,
            rank=self.rank,
            world_size=self.world_size,
            worker_id=worker_id,
            num_workers=num_workers,
            config=self.config,
            seed=self.seed,
            epoch=epoch,
            delta_timestamps=self.delta_timestamps,
            tolerance_s=self.tolerance_s,
            image_transforms=self.image_transforms,
            transforms_on_consumer=num_workers == 0,
            return_uint8=self.return_uint8,
            depth_output_unit=self.depth_output_unit,
            opened_indexes=self._indexes,
            metrics=WorkerMetrics(self.counters, row=worker_id % MAX_METRIC_ROWS),
        )

    def _ensure_graph(self, epoch: int = 0) -> StreamingGraph:
        topology = self._topology()
        if self._graph is None or self._graph_topology != topology:
            if self._graph is not None:
                self._graph.close()
            worker_id, num_workers = topology
            if max(1, num_workers) > self.max_workers:
                raise ConfigError(
                    f"rank {self.rank} owns {self.max_workers} episode(s) but the DataLoader has {num_workers} workers; "
                    f"a worker needs at least one whole episode: use --num_workers={self.max_workers} or fewer "
                    "(StreamingLeRobotDataset.clamp_num_workers does this with a warning)"
                )
            self._graph = self._build_graph(worker_id, num_workers, epoch)
            self._graph_topology = topology
            self._iterated = False
        return self._graph

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._pending_step is not None:
            self._pending_state = self._state_after_step(*self._pending_step)
            self._pending_step = None
        if self._worker_shift and self._pending_state is None and self._iterated:
            # The epoch that a step-offset resume started ran with shifted workers; the next
            # epoch starts from worker 0 again, so every process reads its own worker's schedule.
            next_epoch = (self._shifted_epoch or 0) + 1
            self._worker_shift, self._shifted_epoch = 0, None
            self.close()
            graph = self._ensure_graph(epoch=next_epoch)
            graph.root.reset(None)
            self._iterated = True
            return self._samples(graph)
        graph = self._ensure_graph()
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            graph.root.reset(state)
        else:
            # A new iterator after a finished one is the next epoch (the sharder counts epochs).
            graph.root.reset(None)
        self._iterated = True
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
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "worker_id": worker_id,
            "num_workers": num_workers,
            "worker_shift": self._worker_shift,
            "shifted_epoch": -1 if self._shifted_epoch is None else self._shifted_epoch,
        }

    def state_dict(self) -> dict[str, Any]:
        """Small, plain state: the graph's schedule position, the seed, the topology and the dataset identity."""
        if self._pending_state is not None:
            graph_state = self._pending_state
        elif self._graph is not None and self._iterated:
            graph_state = self._graph.root.state_dict()
        else:
            graph_state = None
        return {
            VERSION_KEY: STATE_VERSION,
            SEED_KEY: self.seed,
            TOPOLOGY_KEY: self._topology_state(),
            IDENTITY_KEY: self.identity,
            GRAPH_KEY: graph_state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the seed is restored, another dataset, selection, schedule or
        topology is an error (a state without an identity, from an older version, is not checked)."""
        if not isinstance(state, dict) or state.get(VERSION_KEY) != STATE_VERSION:
            raise ConfigError(
                f"this is not a StreamingLeRobotDataset state of version {STATE_VERSION}: got keys "
                f"{sorted(state) if isinstance(state, dict) else type(state).__name__}; checkpoints of the older "
                "multi-worker sampler cannot be resumed exactly: start a new run from the saved policy weights"
            )
        check_identity(state.get(IDENTITY_KEY), self.identity)
        saved = state[TOPOLOGY_KEY]
        current = self._topology_state()
        changed = {k: (saved[k], current[k]) for k in ("rank", "world_size", "num_workers") if saved[k] != current[k]}
        if changed:
            details = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
            raise ConfigError(
                f"cannot resume exactly: {details}. Changing world size, batch size or --num_workers changes which "
                "worker owns which batch; resume with the same three, or use resume_from_step() to accept a new "
                "split of the remaining samples"
            )
        if int(state[SEED_KEY]) != self.seed:
            logger.info("restoring the streaming seed %s from the checkpoint (was %s)", state[SEED_KEY], self.seed)
            self.seed = int(state[SEED_KEY])
            self.close()
        shift = int(saved.get("worker_shift", 0))
        if shift != self._worker_shift:
            self._worker_shift = shift
            self.close()
        shifted_epoch = int(saved.get("shifted_epoch", -1))
        self._shifted_epoch = None if shifted_epoch < 0 else shifted_epoch
        self._pending_step = None
        self._pending_state = state[GRAPH_KEY]

    # -- LeRobot-style resume from a step ---------------------------------------------------
    def resume_from_step(
        self, step: int, batch_size: int, num_workers: int, world_size: int | None = None, seed: int | None = None
    ) -> None:
        """Continue after ``step`` batches of ``batch_size`` (a LeRobot ``training_step.json``).

        Each worker derives its own sample offset from the DataLoader's round-robin order and
        fast-forwards its schedule without fetching or decoding the skipped samples.
        ``seed`` is the checkpoint's seed (pass 42 for checkpoints made before the seed reached
        the dataset). A checkpoint from another world size cannot be continued exactly: it
        raises, because batch ownership changes between ranks.
        """
        if world_size is not None and int(world_size) != self.world_size:
            raise ConfigError(
                f"the checkpoint was made with world size {world_size}, this run has {self.world_size}: batch ownership "
                "changes with the world size, so the step offset does not say which samples each rank consumed. "
                "Resume with the same world size, batch size and --num_workers"
            )
        if seed is not None and resolve_seed(seed) != self.seed:
            self.seed = resolve_seed(seed)
            self.close()
        self._pending_state = None
        self._pending_step = (int(step), int(batch_size), int(num_workers))

    def worker_samples(self, num_workers: int) -> list[int]:
        """Samples each worker of this rank yields per epoch."""
        lengths = self._lengths()
        return [
            sum(
                int(self.meta.episodes.length[e])
                for e in worker_episodes(self.episodes, lengths, self.rank, self.world_size, w, num_workers, self.seed)
            )
            for w in range(max(1, num_workers))
        ]

    def worker_offset(self, step: int, batch_size: int, num_workers: int, worker_id: int) -> WorkerOffset:
        return resume_point(step, batch_size, self.worker_samples(num_workers))[0][worker_id]

    def _state_after_step(self, step: int, batch_size: int, num_workers: int) -> dict[str, Any]:
        _, current_workers = self._physical_topology()
        if current_workers != num_workers:
            warnings.warn(
                f"resuming a step offset computed for --num_workers={num_workers} with {current_workers} workers: "
                "batch ownership changes, so the continuation is not sample-exact",
                stacklevel=2,
            )
        offsets, next_worker = resume_point(step, batch_size, self.worker_samples(current_workers))
        # A new DataLoader takes its first batch from worker 0, the interrupted run's next batch
        # came from ``next_worker``: shift which schedule each process reads for this epoch.
        self._worker_shift = next_worker if current_workers > 0 else 0
        self._shifted_epoch = offsets[0].epoch if self._worker_shift else None
        self.close()
        logical_worker, _ = self._topology()
        offset = offsets[logical_worker]
        graph = self._ensure_graph(epoch=offset.epoch)
        return graph.state_after(offset.samples)


def streaming_dataloader(dataset: StreamingLeRobotDataset, batch_size: int, num_workers: int, **kwargs: Any) -> Any:
    """A ``StatefulDataLoader`` for ``dataset`` as LeRobot training builds it.

    ``num_workers`` is clamped to what the rank can feed (with a warning); workers persist
    across epochs so the streaming order moves on to the next epoch. Workers (and the
    forkserver) end within about a second of the training process, however it ends: the
    ``worker_init_fn`` is wrapped in :class:`~lerobot_nodes.lifeline.GuardedWorkerInit`,
    which still calls a ``worker_init_fn`` given here.
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    num_workers = dataset.clamp_num_workers(num_workers)
    options: dict[str, Any] = {"batch_size": batch_size, "num_workers": num_workers, "shuffle": False, "drop_last": False}
    if num_workers > 0:
        options.update(
            persistent_workers=True,
            prefetch_factor=kwargs.pop("prefetch_factor", 4),
            multiprocessing_context=kwargs.pop("multiprocessing_context", None) or worker_context(),
            worker_init_fn=GuardedWorkerInit(kwargs.pop("worker_init_fn", None)),
        )
    options.update(kwargs)
    return StatefulDataLoader(dataset, **options)


def shutdown_dataloader(loader: Any) -> None:
    """Stop ``loader``'s worker processes now and wait for them.

    Persistent workers otherwise live until the loader is garbage collected. This is the
    shutdown torch runs when an iterator is collected (``_shutdown_workers``: tell each
    worker to stop, join it for up to 5 s, terminate it if it has not stopped); idempotent,
    and a no-op without workers.
    """
    iterator = getattr(loader, "_iterator", None)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    if iterator is not None:
        loader._iterator = None


def worker_context() -> multiprocessing.context.BaseContext:
    """How DataLoader workers start: a clean process, never a fork of the training process.

    A forked worker inherits FFmpeg decoders whose threads stayed in the parent, and freeing
    them crashes the worker (LeRobot trains with ``spawn`` for this reason). ``forkserver``
    starts workers as clean as ``spawn`` but imports this package once, in the server; that
    import also makes the server end with the process that started it (``lerobot_nodes.lifeline``).
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["lerobot_nodes.dataset"])
        return context
    return multiprocessing.get_context("spawn")
