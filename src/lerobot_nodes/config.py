"""Options of the streaming reader (SPEC section 5), their defaults and validation.

Field names are the LeRobot flag names without ``--dataset.`` (``max_num_shards`` is a
dataset parameter that training sets from ``--num_workers``). Every impossible value raises
:class:`~lerobot_nodes.errors.ConfigError` naming the flag, the value and what is allowed.

Per-rank limits (the byte budget, the decoded-frame budget, an explicit decoder cache size, the default pool) are split
over the rank's DataLoader workers by the ``worker_*`` helpers; the graph of one worker only
ever sees its share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from .errors import ConfigError

SAMPLING_STRATEGIES = ("remaining", "round_robin")
DEFAULT_SAMPLING_STRATEGY = "round_robin"
"""The strategy of a new run when ``streaming_sampling_strategy`` is unset: every batch draws on as many
resident episodes as it has samples (issue 24: ``remaining`` drew mostly on the fuller episodes of the pool,
0.8x the distinct episodes of a uniform shuffle). A resumed run keeps its checkpoint's strategy."""
BAD_EPISODES_RAISE = "raise"
BAD_EPISODES_SKIP = "skip"
BAD_EPISODE_POLICIES = (BAD_EPISODES_RAISE, BAD_EPISODES_SKIP)
"""What the open does with an episode whose files contradict the metadata (``streaming_bad_episodes``)."""
DEFAULT_RANK_POOL_SIZE = 32
"""Episodes a rank mixes when ``streaming_episode_pool_size`` is unset, split over its workers, at least."""
POOL_BATCHES = 4
"""Batches of episodes a rank's default pool holds (when the reader knows its batch size): a batch of B
samples drawn from a pool of 4B episodes holds ~0.9x the distinct episodes a uniform shuffle's does."""

OPEN_RUNS_FOR_BATCH = "batch"
"""The open-runs rule of the versions before strands: as many runs of an episode open at once as the decoded-frame budget
holds, but no more than a batch needs (``streaming_graph.batch_open_runs``)."""
OPEN_RUNS_STRANDED = "batch-strands"
"""The open-runs rule of new runs: :data:`OPEN_RUNS_FOR_BATCH`, and an episode with fewer open runs than
the anchors a batch takes of it reads each run in strands (``nodes.pool_sampler.RunStrands``)."""
OPEN_RUNS_FOR_BUDGET = "budget"
"""The open-runs rule of the versions before it (as many as the budget holds, at most 8), which a run
resumed from their checkpoints keeps."""


def default_rank_pool_size(batch_size: int | None) -> int:
    """Episodes a rank mixes when ``streaming_episode_pool_size`` is unset: :data:`POOL_BATCHES` batches
    of episodes, at least :data:`DEFAULT_RANK_POOL_SIZE` (that alone when the batch size is unknown)."""
    if batch_size is None:
        return DEFAULT_RANK_POOL_SIZE
    return max(DEFAULT_RANK_POOL_SIZE, POOL_BATCHES * int(batch_size))
BYTES_PER_GB = 1_000_000_000
BYTES_PER_MB = 1_000_000
DEFAULT_DECODED_FRAME_BUDGET_MB = 1024
"""Decoded video frames a rank's decoders keep between samples (MB), split over its workers:
about 32 episodes x 2 cameras x 8 frames of 640x480 RGB (0.92 MB each) fit in 512 MB."""
DEFAULT_STREAMING_SEED = 42
"""The seed of the streaming order when training passes ``--seed=null``."""


def resolve_seed(seed: int | None) -> int:
    """``seed`` itself, or the fixed streaming seed 42 for ``None``."""
    return DEFAULT_STREAMING_SEED if seed is None else int(seed)


def split_evenly(total: int, parts: int, part: int) -> int:
    """Share ``part`` of ``total`` split into ``parts`` near-equal integers summing to ``total``."""
    return total // parts + (1 if part < total % parts else 0)


@dataclass(frozen=True)
class StreamingConfig:
    """Every ``--dataset.streaming_*`` option with its default.

    ``streaming_episode_pool_size`` and ``streaming_prefetch_episodes`` are per worker;
    ``streaming_byte_budget_gb``, ``streaming_decoded_frame_budget_mb`` and an explicit
    ``video_decoder_cache_size`` are per rank and split over the rank's workers. Unset pool: the
    rank mixes 4 batches of episodes, at least 32 (:func:`default_rank_pool_size`), split over
    workers. Unset decoder cache: pool x cameras per worker.

    ``streaming_gop_runs`` (default on): each episode's anchors are visited in runs of
    consecutive frames that one key frame decodes forward (its GOP in presentation order,
    shifted by the cameras' history window), the runs in a seeded random order, interleaved
    with the other pool episodes as the strategy picks them. Off: runs of two frames (the
    order before GOP runs; the same order as GOP runs for LeRobot's ``g=2`` without history).
    ``streaming_decoded_frame_budget_mb`` bounds the decoded frames the video decoders keep
    between samples (least recently used dropped first); a smaller budget only costs decoding.

    ``streaming_batches_across_workers`` (default on): with two or more DataLoader workers, every
    batch holds a part from each worker (each worker assembles ``batch_size / num_workers``
    samples of its own pool, the training process joins one part of each), so a batch draws on
    all of the rank's resident episodes, as with ``num_workers=0``; off, a batch comes from one
    worker's pool (the order before). The workers decode their parts into their rows of shared whole
    batches, so the join copies no frames (``lerobot_nodes.batch_memory.batch_ring``).

    ``streaming_disk_cache_gb`` bounds the node-local disk cache of remote byte ranges
    (``lerobot_nodes.sources.range_cache``): unset, the smaller of 50 GB and a quarter of the
    free space where it lives; ``0`` turns it off. ``streaming_disk_cache_dir`` is where it lives
    (unset: ``$HF_LEROBOT_HOME/streaming-bytes``; a node-local NVMe is a good place). Local
    folders are never cached. Neither option is part of the resume identity.

    ``streaming_index_concurrency``: MP4 files whose sample index is built at once when a rank
    opens its files' indexes (each costs two round trips from a remote store, so the open is
    latency-bound): unset, ``streaming_native_http_connections`` when that is set, else 4 for a
    local folder (parsing is CPU work) and 32 for a remote store.

    ``streaming_sampling_strategy``: unset, ``round_robin`` for a new run (:data:`DEFAULT_SAMPLING_STRATEGY`)
    and the checkpoint's strategy for a resumed one (``remaining`` for checkpoints of the versions before);
    set, that strategy, and a resume from a checkpoint of another is refused.

    ``streaming_bad_episodes``: ``raise`` (default) stops the open at the first episode whose
    files are missing or contradict the metadata; ``skip`` leaves such episodes of this rank out
    of its schedule (``lerobot_nodes.bad_episodes``), logs each kind once and records the skipped
    set in the metrics report and the resume identity.
    ``streaming_weights`` (a mixture only, one per dataset, normalised): each dataset's share of the
    frames streamed. Unset, every frame of the union is equally likely (each dataset's share is its
    frames' share) and epochs cover the union. Set, every dataset is visited in its own epochs (each
    of its frames once per epoch, its next epoch in its own order when it runs out) and the stream
    does not end by itself: consume it by steps (``nodes.weighted_sharder``). Part of the resume identity.
    """

    streaming_episode_pool_size: int | None = None
    streaming_sampling_strategy: str | None = None
    streaming_prefetch_episodes: int = 8
    streaming_byte_budget_gb: float = 8.0
    streaming_decode_threads: int = 2
    streaming_decoded_queue_size: int = 8
    streaming_decoded_frame_budget_mb: float = DEFAULT_DECODED_FRAME_BUDGET_MB
    streaming_gop_runs: bool = True
    streaming_batches_across_workers: bool = True
    video_decoder_cache_size: int | None = None
    streaming_native_http_connections: int | None = None
    streaming_native_http_subranges: int = 1
    streaming_sidecar_lock_timeout_s: float = 1800.0
    streaming_http_retries: int = 8
    streaming_http_timeout_s: float = 30.0
    streaming_disk_cache_gb: float | None = None
    streaming_disk_cache_dir: str | None = None
    streaming_index_concurrency: int | None = None
    streaming_bad_episodes: str = BAD_EPISODES_RAISE
    streaming_weights: list[float] | None = None
    max_num_shards: int = 16

    def __post_init__(self) -> None:
        _check_int("streaming_episode_pool_size", self.streaming_episode_pool_size, minimum=1, optional=True)
        if self.streaming_sampling_strategy is not None and self.streaming_sampling_strategy not in SAMPLING_STRATEGIES:
            raise ConfigError(
                f"--dataset.streaming_sampling_strategy must be one of {', '.join(SAMPLING_STRATEGIES)}, "
                f"got {self.streaming_sampling_strategy!r}"
            )
        _check_int("streaming_prefetch_episodes", self.streaming_prefetch_episodes, minimum=0)
        _check_positive_float("streaming_byte_budget_gb", self.streaming_byte_budget_gb)
        _check_int("streaming_decode_threads", self.streaming_decode_threads, minimum=1)
        _check_int("streaming_decoded_queue_size", self.streaming_decoded_queue_size, minimum=1)
        _check_positive_float("streaming_decoded_frame_budget_mb", self.streaming_decoded_frame_budget_mb)
        if not isinstance(self.streaming_gop_runs, bool):
            raise ConfigError(f"--dataset.streaming_gop_runs must be true or false, got {self.streaming_gop_runs!r}")
        if not isinstance(self.streaming_batches_across_workers, bool):
            raise ConfigError(
                "--dataset.streaming_batches_across_workers must be true or false, "
                f"got {self.streaming_batches_across_workers!r}"
            )
        _check_int("video_decoder_cache_size", self.video_decoder_cache_size, minimum=1, optional=True)
        _check_int(
            "streaming_native_http_connections", self.streaming_native_http_connections, minimum=1, optional=True
        )
        _check_int("streaming_native_http_subranges", self.streaming_native_http_subranges, minimum=1)
        timeout = self.streaming_sidecar_lock_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise ConfigError(
                f"--dataset.streaming_sidecar_lock_timeout_s must be a number of seconds >= 0, got {timeout!r}"
            )
        _check_int("streaming_http_retries", self.streaming_http_retries, minimum=1)
        _check_positive_float("streaming_http_timeout_s", self.streaming_http_timeout_s)
        size = self.streaming_disk_cache_gb
        if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float)) or not math.isfinite(size)
                                 or size < 0):
            raise ConfigError(
                f"--dataset.streaming_disk_cache_gb must be a number of GB >= 0 (0 turns the disk cache off) or unset "
                f"for the default (the smaller of 50 GB and a quarter of the free space), got {size!r}"
            )
        folder = self.streaming_disk_cache_dir
        if folder is not None and (not isinstance(folder, str) or not folder.strip()):
            raise ConfigError(f"--dataset.streaming_disk_cache_dir must be a folder path or unset "
                              f"(default $HF_LEROBOT_HOME/streaming-bytes), got {folder!r}")
        _check_int("streaming_index_concurrency", self.streaming_index_concurrency, minimum=1, optional=True)
        if self.streaming_bad_episodes not in BAD_EPISODE_POLICIES:
            raise ConfigError(
                f"--dataset.streaming_bad_episodes must be one of {', '.join(BAD_EPISODE_POLICIES)}, "
                f"got {self.streaming_bad_episodes!r}"
            )
        _check_weights(self.streaming_weights)
        if self.streaming_weights is not None:
            # Normalised and rounded, so [7, 3] and [0.7, 0.3] are the same schedule and identity, and a
            # second normalisation (dataclasses.replace) changes nothing.
            total = float(sum(self.streaming_weights))
            object.__setattr__(self, "streaming_weights", [round(float(w) / total, 12) for w in self.streaming_weights])
        _check_int("max_num_shards", self.max_num_shards, minimum=1)

    # -- per-rank limits split over a rank's workers --------------------------------------
    @property
    def rank_byte_budget(self) -> int:
        """The byte budget of one rank, in bytes (1 GB = 10**9 bytes)."""
        return int(self.streaming_byte_budget_gb * BYTES_PER_GB)

    def worker_byte_budget(self, num_workers: int) -> int:
        """One worker's share of the rank budget (at least 1 byte)."""
        return max(1, self.rank_byte_budget // _workers(num_workers))

    def worker_decoded_frame_budget(self, num_workers: int) -> int:
        """One worker's share of the rank's decoded-frame budget, in bytes (1 MB = 10**6 bytes)."""
        return max(1, int(self.streaming_decoded_frame_budget_mb * BYTES_PER_MB) // _workers(num_workers))

    @property
    def sampling_strategy(self) -> str:
        """The pool sampler's strategy: ``streaming_sampling_strategy``, or :data:`DEFAULT_SAMPLING_STRATEGY` unset."""
        return self.streaming_sampling_strategy or DEFAULT_SAMPLING_STRATEGY

    def worker_pool_size(self, worker_id: int, num_workers: int, rank_pool: int = DEFAULT_RANK_POOL_SIZE) -> int:
        """Episodes worker ``worker_id`` mixes: the explicit option, else its share of the rank's default
        pool ``rank_pool`` (:func:`default_rank_pool_size`)."""
        if self.streaming_episode_pool_size is not None:
            return self.streaming_episode_pool_size
        return max(1, split_evenly(int(rank_pool), _workers(num_workers), worker_id))

    def worker_decoder_cache_size(self, pool_size: int, num_cameras: int, num_workers: int) -> int:
        """Open video decoders one worker keeps: its share of the explicit option, else pool x cameras."""
        if self.video_decoder_cache_size is not None:
            return max(1, self.video_decoder_cache_size // _workers(num_workers))
        return max(1, pool_size * max(1, num_cameras))

    def worker_http_connections(self, num_workers: int) -> int:
        """Native HTTP connections one worker may open: its share of the explicit per-rank option,
        else one per concurrent episode fetch and sub-range (``max_num_shards x subranges``)."""
        if self.streaming_native_http_connections is not None:
            return max(1, self.streaming_native_http_connections // _workers(num_workers))
        return self.max_num_shards * self.streaming_native_http_subranges

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _workers(num_workers: int) -> int:
    # num_workers=0 means "the training process": one reader.
    return max(1, int(num_workers))


def _check_weights(weights: Any) -> None:
    """A list of at least two positive finite numbers, or unset (the length is checked against the mixture)."""
    if weights is None:
        return
    if isinstance(weights, (str, bytes)) or not isinstance(weights, (list, tuple)) or len(weights) < 2 or any(
        isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0 for w in weights
    ):
        raise ConfigError(
            "--dataset.streaming_weights must be a JSON list of positive finite numbers, one per dataset of a mixture "
            f"('[0.7,0.3]'), or unset for every frame of the union equally likely; got {weights!r}"
        )


def _check_int(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        unset = " or unset" if optional else ""
        raise ConfigError(f"{_flag(name)} must be an integer{unset}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{_flag(name)} must be >= {minimum}, got {value}")


def _check_positive_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{_flag(name)} must be a finite number > 0, got {value!r}")


def _flag(name: str) -> str:
    return name if name == "max_num_shards" else f"--dataset.{name}"
