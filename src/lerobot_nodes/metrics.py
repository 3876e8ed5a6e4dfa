"""Streaming metrics: batch wait percentiles, refill stalls, bytes, budget use, decode time.

Worker processes count into a small shared-memory table (one row per worker), so the
training process reads every worker's figures without messages or files. Batch wait time is
measured where it is felt: in the training process, around ``next(loader)``.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from typing import Any, Protocol, TypeVar

import numpy as np

from .batch_mixing import BatchMixing, MixingTally
from .workers.shared_segments import attach_untracked, release

logger = logging.getLogger("lerobot_nodes.metrics")


# -- the protocol nodes count into ---------------------------------------------------------
Recorder = Callable[[Mapping[str, float], Mapping[str, float]], None]
"""``(counter amounts, gauge values) -> None``: several ``add`` and ``set`` calls at once."""


class MetricsSink(Protocol):
    """``add`` grows a counter; ``set`` overwrites a gauge (reserved/resident bytes).

    A sink may also have ``update(amounts, gauges)``, doing both for several names at once
    (:func:`recorder` uses it when present: one lock per decoded sample instead of eight).
    """

    def add(self, name: str, amount: float = 1.0) -> None: ...

    def set(self, name: str, value: float) -> None: ...


def recorder(sink: MetricsSink) -> Recorder:
    """``sink.update`` when the sink has it, else the same through ``add`` and ``set``."""
    update = getattr(sink, "update", None)
    if update is not None:
        return update  # type: ignore[no-any-return]

    def record_each(amounts: Mapping[str, float], gauges: Mapping[str, float]) -> None:
        for name, amount in amounts.items():
            sink.add(name, amount)
        for name, value in gauges.items():
            sink.set(name, value)

    return record_each


class NullMetrics:
    """Counts nothing."""

    def add(self, name: str, amount: float = 1.0) -> None:
        pass

    def set(self, name: str, value: float) -> None:
        pass

    def update(self, amounts: Mapping[str, float], gauges: Mapping[str, float]) -> None:
        pass


# -- the shared counter table and the report ----------------------------------------------

DATASET_INDEX = "dataset_index"
"""The batch column of a mixture's samples: which dataset each came from."""
SPELLED_OUT_DATASETS = 8
"""Up to this many datasets, the report gives each dataset's samples; above, their spread."""

T = TypeVar("T")

BAD_EPISODES_FOUND = "bad_episodes_found"
"""A worker's episodes found bad while decoding (``streaming_bad_episodes=skip``; ``nodes.bad_episode_filter``)."""
BAD_SAMPLES_DROPPED = "bad_samples_dropped"
"""Samples a worker dropped because their episode was found bad while decoding (the failing ones included)."""

GAUGE_NAMES = (
    "reserved_bytes",
    "resident_bytes",
    "budget_bytes",
    "http_requests",
    "http_retries",
    "hub_api_requests",
    "hub_resolver_requests",
    "hub_cdn_requests",
    "hub_rate_limited",
    "disk_cache_hits",
    "disk_cache_misses",
    "disk_cache_bytes_served",
    "disk_cache_bytes_stored",
    "disk_cache_evictions",
    "decoded_resident_bytes",
    "decoded_resident_frames",
    "peak_decoded_bytes",
    "peak_decoded_frames",
    "decoded_budget_bytes",
    "gop_frames",
    BAD_EPISODES_FOUND,
)
"""Per-worker gauges (set, not added): reserved/resident bytes, the budget, the HTTP request and
retry totals of the worker's remote source and its requests by the Hub's rate-limit classes (``hub_api_requests``:
``/api/...``; ``hub_resolver_requests``: ``/resolve/...`` and bucket file URLs, or a plain HTTP root's files;
``hub_cdn_requests``: reads of redirect targets; ``hub_rate_limited``: 429 answers waited out), its disk byte cache totals (blocks found and fetched,
bytes served from disk and stored, blocks evicted; lerobot_nodes.sources.range_cache), and the decoded frames its video decoders keep
(bytes and frames now, their peaks, and the decoded-frame budget); ``gop_frames``: the GOP size of
the worker's video (frames between key frames, the median over its first clip), read as the maximum
over workers, not the sum; ``bad_episodes_found``: the worker's episodes found bad while decoding (each
episode is one worker's, so the sum is the rank's)."""

COUNTER_NAMES = (
    "samples",
    "frames_decoded",
    "frames_delivered",
    "decode_seconds",
    "refill_stalls",
    "refill_stall_seconds",
    "bytes_fetched",
    "bytes_planned",
    "peak_reserved_bytes",
    "episodes_fetched",
    "batch_segments_created",
    "batch_segments_reused",
    "batch_parts_in_ring",
    BAD_SAMPLES_DROPPED,
    *GAUGE_NAMES,
)
"""Per-worker counters: sums, then the gauges. ``batch_segments_*``: the shared-memory camera
segments a worker's batches were written into, new or recycled (lerobot_nodes.batch_memory.recycled_storage);
``batch_parts_in_ring``: parts written into a shared batch instead (lerobot_nodes.batch_memory.batch_ring)."""

_GAUGES = frozenset(GAUGE_NAMES)
_COLUMN = {name: column for column, name in enumerate(COUNTER_NAMES)}
_PEAKS = frozenset({"peak_reserved_bytes"})


class WorkerCounters:
    """One row of counters per worker in shared memory (or in a plain array when local).

    Pickling sends only the shared-memory name, so DataLoader workers started with spawn
    attach to the same table. Each worker writes only its own row.
    """

    def __init__(self, num_rows: int, shared: bool = True) -> None:
        self.num_rows = max(1, num_rows)
        self._shape = (self.num_rows, len(COUNTER_NAMES))
        nbytes = int(np.prod(self._shape)) * 8
        self._memory: shared_memory.SharedMemory | None = None
        self._owner = shared
        if shared:
            self._memory = shared_memory.SharedMemory(create=True, size=nbytes)
            self._table = np.ndarray(self._shape, dtype=np.float64, buffer=self._memory.buf)
            self._table[:] = 0
            # The creator unlinks the segment when it is collected or the process exits.
            weakref.finalize(self, release, self._memory, self._table)
        else:
            self._table = np.zeros(self._shape, dtype=np.float64)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"num_rows": self.num_rows, "name": self._memory.name if self._memory else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.num_rows = state["num_rows"]
        self._shape = (self.num_rows, len(COUNTER_NAMES))
        self._owner = False
        self._lock = threading.Lock()
        if state["name"] is None:
            self._memory = None
            self._table = np.zeros(self._shape, dtype=np.float64)
            return
        self._memory = attach_untracked(state["name"])
        self._table = np.ndarray(self._shape, dtype=np.float64, buffer=self._memory.buf)

    def add(self, row: int, name: str, amount: float = 1.0) -> None:
        column = _COLUMN[name]
        with self._lock:
            if name in _GAUGES:
                self._table[row, column] = amount
            else:
                self._table[row, column] += amount
            if name == "reserved_bytes":
                peak = _COLUMN["peak_reserved_bytes"]
                self._table[row, peak] = max(self._table[row, peak], amount)

    def update(self, row: int, amounts: Mapping[str, float], gauges: Mapping[str, float]) -> None:
        """What :meth:`add` does for each of ``amounts`` (counters) and ``gauges``, under one lock."""
        with self._lock:
            line = self._table[row]
            for name, amount in amounts.items():
                line[_COLUMN[name]] += amount
            for name, value in gauges.items():
                line[_COLUMN[name]] = value
                if name == "reserved_bytes":
                    peak = _COLUMN["peak_reserved_bytes"]
                    line[peak] = max(line[peak], value)

    def totals(self) -> dict[str, float]:
        return {name: float(self._table[:, i].sum()) for i, name in enumerate(COUNTER_NAMES)}

    def maximum(self, name: str) -> float:
        """The largest value of ``name`` over the workers' rows (for gauges that are not amounts)."""
        return float(self._table[:, _COLUMN[name]].max())

    def close(self) -> None:
        """Detach (and, in the creating process, remove) the shared table; totals read 0 after."""
        if self._memory is not None:
            memory, self._memory = self._memory, None
            self._table = np.zeros(self._shape, dtype=np.float64)
            if self._owner:
                release(memory, None)
            else:
                memory.close()


class WorkerMetrics:
    """The view of :class:`WorkerCounters` that nodes of one worker write to."""

    def __init__(self, counters: WorkerCounters | None = None, row: int = 0) -> None:
        self.counters = counters or WorkerCounters(1, shared=False)
        self.row = row

    def add(self, name: str, amount: float = 1.0) -> None:
        self.counters.add(self.row, name, amount)

    def set(self, name: str, value: float) -> None:
        self.counters.add(self.row, name, value)

    def update(self, amounts: Mapping[str, float], gauges: Mapping[str, float]) -> None:
        """Several :meth:`add` and :meth:`set` at once (one lock for a decoded sample's counts)."""
        self.counters.update(self.row, amounts, gauges)


def collated_batch_size(batch: Any) -> int:
    """Samples in a batch collated from dicts: the length of its first tensor or list."""
    if isinstance(batch, dict):
        for value in batch.values():
            if hasattr(value, "shape") and len(value.shape):
                return int(value.shape[0])
            if isinstance(value, list):
                return len(value)
    return 0


def percentiles(values: Iterable[float], points: Iterable[float] = (50, 95, 99)) -> dict[str, float]:
    array = np.fromiter(values, dtype=np.float64)
    if array.size == 0:
        return {f"p{int(p)}": float("nan") for p in points}
    return {f"p{int(p)}": float(np.percentile(array, p)) for p in points}


@dataclass
class MetricsReport:
    """Everything the SPEC's troubleshooting table asks for, at one moment."""

    batches: int
    samples: int
    seconds: float
    batch_wait_s: dict[str, float]
    refill_stalls: int
    refill_stall_seconds: float
    bytes_fetched: int
    bytes_planned: int
    reserved_bytes: int
    resident_bytes: int
    peak_reserved_bytes: int
    budget_bytes: int
    decode_ms_per_frame: float
    frames_decoded: int
    frames_delivered: int
    http_requests: int = 0
    http_retries: int = 0
    hub_api_requests: int = 0
    hub_resolver_requests: int = 0
    hub_cdn_requests: int = 0
    hub_rate_limited: int = 0
    disk_cache_hits: int = 0
    disk_cache_misses: int = 0
    disk_cache_bytes_served: int = 0
    disk_cache_bytes_stored: int = 0
    disk_cache_evictions: int = 0
    decoded_resident_bytes: int = 0
    decoded_resident_frames: int = 0
    peak_decoded_bytes: int = 0
    peak_decoded_frames: int = 0
    decoded_budget_bytes: int = 0
    batch_segments_created: int = 0
    batch_segments_reused: int = 0
    batch_parts_in_ring: int = 0
    mixing: BatchMixing = field(default_factory=BatchMixing)
    """Distinct episodes per batch and same-episode near pairs, next to a uniform shuffle (:mod:`lerobot_nodes.batch_mixing`)."""
    samples_per_dataset: tuple[int, ...] = ()
    """A mixture's delivered samples by ``dataset_index`` (empty for one dataset)."""
    dataset_names: tuple[str, ...] = ()
    """The mixture's dataset names, in ``dataset_index`` order (what the report labels its counts with)."""
    skipped_episodes: tuple[str, ...] = ()
    """The episodes this rank left out as bad (``streaming_bad_episodes=skip``), one line per kind."""
    bad_episodes_found: int = 0
    """Episodes found bad while decoding (``skip``), from their failing sample on (the log names each)."""
    bad_samples_dropped: int = 0
    """Samples of those episodes dropped (the failing ones and every later one)."""

    def skipped_lines(self) -> list[str]:
        """The skipped episodes, one line per kind: those left out at open, then those found while decoding."""
        lines = list(self.skipped_episodes)
        if self.bad_episodes_found:
            lines.append(
                f"found while decoding: {self.bad_episodes_found} episode{'s' if self.bad_episodes_found != 1 else ''}, "
                f"{self.bad_samples_dropped} sample{'s' if self.bad_samples_dropped != 1 else ''} dropped "
                "(the log names each episode, file and frame)"
            )
        return lines

    def dataset_counts(self, limit: int = SPELLED_OUT_DATASETS) -> str:
        """The samples per dataset in words: each dataset's count up to ``limit`` datasets, else the
        least, median and most over them (a mixture of hundreds stays one short line)."""
        counts = self.samples_per_dataset
        if len(counts) <= limit:
            names = self.dataset_names if len(self.dataset_names) == len(counts) else [str(i) for i in range(len(counts))]
            return ", ".join(f"{name} {count}" for name, count in zip(names, counts, strict=True))
        least, median, most = np.percentile(np.asarray(counts), [0, 50, 100])
        return f"min/median/max {least:.0f}/{median:.0f}/{most:.0f} over {len(counts)} datasets"

    @property
    def decoded_per_delivered(self) -> float:
        """Video frames the codecs decoded per video frame returned in samples (1.0 is ideal)."""
        return self.frames_decoded / self.frames_delivered if self.frames_delivered else float("nan")

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")

    def line(self) -> str:
        wait = self.batch_wait_s
        return (
            f"{self.batches} batches, {self.samples_per_second:.1f} samples/s | batch wait p50/p95/p99 "
            f"{wait['p50'] * 1e3:.1f}/{wait['p95'] * 1e3:.1f}/{wait['p99'] * 1e3:.1f} ms | refill stalls "
            f"{self.refill_stalls} ({self.refill_stall_seconds:.2f} s) | fetched/planned "
            f"{self.bytes_fetched / 1e6:.1f}/{self.bytes_planned / 1e6:.1f} MB | reserved/resident "
            f"{self.reserved_bytes / 1e6:.1f}/{self.resident_bytes / 1e6:.1f} MB (peak "
            f"{self.peak_reserved_bytes / 1e6:.1f} of {self.budget_bytes / 1e6:.1f} MB) | decode "
            f"{self.decode_ms_per_frame:.2f} ms/frame, {self.decoded_per_delivered:.2f} decoded per delivered, "
            f"{self.decoded_resident_bytes / 1e6:.1f} MB decoded frames kept (peak {self.peak_decoded_bytes / 1e6:.1f} of "
            f"{self.decoded_budget_bytes / 1e6:.1f} MB)"
            + (f" | http requests/retries {self.http_requests}/{self.http_retries}" if self.http_requests else "")
            + (
                f" | hub api/resolver/cdn {self.hub_api_requests}/{self.hub_resolver_requests}/{self.hub_cdn_requests}"
                + (f", {self.hub_rate_limited} rate-limited" if self.hub_rate_limited else "")
                if self.hub_api_requests or self.hub_resolver_requests or self.hub_cdn_requests
                else ""
            )
            + (
                f" | disk cache hits/misses {self.disk_cache_hits}/{self.disk_cache_misses} blocks, "
                f"{self.disk_cache_bytes_served / 1e6:.1f} MB served, {self.disk_cache_bytes_stored / 1e6:.1f} MB stored, "
                f"{self.disk_cache_evictions} evicted"
                if self.disk_cache_hits or self.disk_cache_misses
                else ""
            )
            + (f" | {self.mixing.line()}" if self.mixing.batches else "")
            + (f" | samples per dataset: {self.dataset_counts()}" if self.samples_per_dataset else "")
            + (f" | skipped as bad: {'; '.join(self.skipped_lines())}" if self.skipped_lines() else "")
        )

    def table(self) -> str:
        rows = [
            ("batches", self.batches),
            ("samples", self.samples),
            ("samples/s", f"{self.samples_per_second:.1f}"),
            *((f"batch wait {k} (ms)", f"{v * 1e3:.2f}") for k, v in self.batch_wait_s.items()),
            ("refill stalls", self.refill_stalls),
            ("refill stall time (s)", f"{self.refill_stall_seconds:.3f}"),
            ("MB fetched / planned", f"{_mb(self.bytes_fetched)} / {_mb(self.bytes_planned)}"),
            ("reserved MB (now / peak)", f"{_mb(self.reserved_bytes)} / {_mb(self.peak_reserved_bytes)}"),
            ("resident MB", _mb(self.resident_bytes)),
            ("byte budget (MB)", _mb(self.budget_bytes)),
            ("decode ms per frame", f"{self.decode_ms_per_frame:.3f}"),
            ("decoded frames per delivered frame", f"{self.frames_decoded / max(1, self.frames_delivered):.3f}"),
            (
                "decoded frames kept (now / peak)",
                f"{self.decoded_resident_frames} / {self.peak_decoded_frames} frames, "
                f"{_mb(self.decoded_resident_bytes)} / {_mb(self.peak_decoded_bytes)} MB",
            ),
            ("decoded frame budget (MB)", _mb(self.decoded_budget_bytes)),
            ("HTTP requests (remote sources)", self.http_requests),
            ("HTTP retries (transient faults survived)", self.http_retries),
            (
                "Hub requests: API / resolver / CDN",
                f"{self.hub_api_requests} / {self.hub_resolver_requests} / {self.hub_cdn_requests}",
            ),
            ("Hub 429s waited out (rate limits)", self.hub_rate_limited),
            ("disk cache hits / misses (blocks)", f"{self.disk_cache_hits} / {self.disk_cache_misses}"),
            ("disk cache MB served / stored", f"{_mb(self.disk_cache_bytes_served)} / {_mb(self.disk_cache_bytes_stored)}"),
            ("disk cache blocks evicted", self.disk_cache_evictions),
            *self.mixing.rows(),
            *self._dataset_rows(),
            *(("skipped as bad", line) for line in self.skipped_lines()),
        ]
        width = max(len(str(name)) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)

    def _dataset_rows(self) -> list[tuple[str, Any]]:
        counts = self.samples_per_dataset
        if not counts:
            return []
        if len(counts) > SPELLED_OUT_DATASETS:
            return [("samples per dataset", self.dataset_counts())]
        names = self.dataset_names if len(self.dataset_names) == len(counts) else [str(i) for i in range(len(counts))]
        return [(f"samples from [{i}] {name}", count) for i, (name, count) in enumerate(zip(names, counts, strict=True))]


def _mb(nbytes: int) -> str:
    """Bytes as the log line prints them: MB (10**6 bytes) with one decimal."""
    return f"{nbytes / 1e6:.1f}"


class StreamingMetrics:
    """Reads worker counters and times batch waits; logs a line every ``log_every_s``."""

    def __init__(self, counters: WorkerCounters | None = None, log_every_s: float | None = 30.0) -> None:
        self.counters = counters or WorkerCounters(1, shared=False)
        self.batch_waits: list[float] = []
        self.samples = 0
        self.log_every_s = log_every_s
        self._started = time.perf_counter()
        self._last_log = self._started
        self._last_batch_at: float | None = None  # the delivered rate ends at the last batch, not at a later report
        self.mixing = MixingTally()
        self.selection_lengths: np.ndarray | None = None
        self.gop_frames: int | None = None
        self.samples_per_dataset = np.zeros(0, dtype=np.int64)
        self.dataset_names: tuple[str, ...] = ()
        self.skipped_episodes: tuple[str, ...] = ()

    def set_skipped(self, lines: Iterable[str]) -> None:
        """The episodes the dataset left out as bad, one line per kind (reported as they are)."""
        self.skipped_episodes = tuple(lines)

    def set_selection(self, lengths: Iterable[int], gop_frames: int | None = None) -> None:
        """The selected episodes' lengths (and the GOP size, if known), for the uniform baseline of the
        batch-mixing figures; :meth:`timed` finds them itself on a loader of a dataset with ``meta`` and
        ``episodes`` (a ``StreamingLeRobotDataset``)."""
        self.selection_lengths = np.fromiter((int(n) for n in lengths), dtype=np.int64)
        if gop_frames is not None:
            self.gop_frames = int(gop_frames)

    def observe_datasets(self, batch: Any) -> None:
        """Count a mixture's batch by its ``dataset_index`` column (a batch without one counts nothing)."""
        column = batch.get(DATASET_INDEX) if isinstance(batch, dict) else None
        if column is None or not hasattr(column, "shape"):
            return
        found = np.bincount(np.asarray(column, dtype=np.int64).reshape(-1))
        if len(found) > len(self.samples_per_dataset):
            grown = np.zeros(len(found), dtype=np.int64)
            grown[: len(self.samples_per_dataset)] = self.samples_per_dataset
            self.samples_per_dataset = grown
        self.samples_per_dataset[: len(found)] += found

    def _find_datasets(self, batches: object) -> None:
        """A mixture's dataset names (a ``MixtureMeta``'s ``names``), so every dataset is counted, even at 0."""
        dataset = getattr(batches, "dataset", batches)
        names = getattr(getattr(dataset, "meta", None), "names", None)
        if not isinstance(names, tuple):
            return
        self.dataset_names = tuple(str(name) for name in names)
        if len(self.samples_per_dataset) < len(names):
            grown = np.zeros(len(names), dtype=np.int64)
            grown[: len(self.samples_per_dataset)] = self.samples_per_dataset
            self.samples_per_dataset = grown

    def _find_selection(self, batches: object) -> None:
        dataset = getattr(batches, "dataset", batches)
        meta, episodes = getattr(dataset, "meta", None), getattr(dataset, "episodes", None)
        table = getattr(getattr(meta, "episodes", None), "length", None)
        if table is None or episodes is None:
            return
        try:
            self.selection_lengths = np.asarray(table, dtype=np.int64)[np.asarray(list(episodes), dtype=np.int64)]
        except (IndexError, TypeError, ValueError):
            self.selection_lengths = None

    def timed(self, batches: Iterable[T], batch_size_of=None) -> Iterator[T]:  # type: ignore[no-untyped-def]
        """Yield from ``batches``, recording how long each ``next()`` waited and how many samples
        reached the training loop (``batch_size_of(batch)``, by default the length of a collated
        batch), so the report counts delivered samples, not samples workers decoded ahead."""
        batch_size_of = batch_size_of or collated_batch_size
        if self.selection_lengths is None:
            self._find_selection(batches)
        if not self.dataset_names:
            self._find_datasets(batches)
        iterator = iter(batches)
        if not self.batch_waits:
            self._started = time.perf_counter()
        while True:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.mixing.observe_batch(batch)
            self.observe_datasets(batch)
            self.record_batch(time.perf_counter() - started, batch_size_of(batch))
            yield batch

    def record_batch(self, wait_s: float, samples: int) -> None:
        self.batch_waits.append(wait_s)
        self.samples += samples
        now = time.perf_counter()
        self._last_batch_at = now
        if self.log_every_s is not None and now - self._last_log >= self.log_every_s:
            self._last_log = now
            logger.info("streaming: %s", self.report().line())

    def report(self) -> MetricsReport:
        totals = self.counters.totals()
        decoded = totals["frames_decoded"]
        return MetricsReport(
            batches=len(self.batch_waits),
            samples=self.samples if self.batch_waits else int(totals["samples"]),
            seconds=(self._last_batch_at if self._last_batch_at is not None else time.perf_counter()) - self._started,
            batch_wait_s=percentiles(self.batch_waits),
            refill_stalls=int(totals["refill_stalls"]),
            refill_stall_seconds=totals["refill_stall_seconds"],
            bytes_fetched=int(totals["bytes_fetched"]),
            bytes_planned=int(totals["bytes_planned"]),
            reserved_bytes=int(totals["reserved_bytes"]),
            resident_bytes=int(totals["resident_bytes"]),
            peak_reserved_bytes=int(totals["peak_reserved_bytes"]),
            budget_bytes=int(totals["budget_bytes"]),
            decode_ms_per_frame=1e3 * totals["decode_seconds"] / decoded if decoded else float("nan"),
            frames_decoded=int(decoded),
            frames_delivered=int(totals["frames_delivered"]),
            http_requests=int(totals["http_requests"]),
            http_retries=int(totals["http_retries"]),
            hub_api_requests=int(totals["hub_api_requests"]),
            hub_resolver_requests=int(totals["hub_resolver_requests"]),
            hub_cdn_requests=int(totals["hub_cdn_requests"]),
            hub_rate_limited=int(totals["hub_rate_limited"]),
            disk_cache_hits=int(totals["disk_cache_hits"]),
            disk_cache_misses=int(totals["disk_cache_misses"]),
            disk_cache_bytes_served=int(totals["disk_cache_bytes_served"]),
            disk_cache_bytes_stored=int(totals["disk_cache_bytes_stored"]),
            disk_cache_evictions=int(totals["disk_cache_evictions"]),
            decoded_resident_bytes=int(totals["decoded_resident_bytes"]),
            decoded_resident_frames=int(totals["decoded_resident_frames"]),
            peak_decoded_bytes=int(totals["peak_decoded_bytes"]),
            peak_decoded_frames=int(totals["peak_decoded_frames"]),
            decoded_budget_bytes=int(totals["decoded_budget_bytes"]),
            batch_segments_created=int(totals["batch_segments_created"]),
            batch_segments_reused=int(totals["batch_segments_reused"]),
            batch_parts_in_ring=int(totals["batch_parts_in_ring"]),
            mixing=self.mixing.figures(
                self.selection_lengths, self.gop_frames or int(self.counters.maximum("gop_frames")) or None
            ),
            samples_per_dataset=tuple(int(count) for count in self.samples_per_dataset),
            dataset_names=self.dataset_names,
            skipped_episodes=self.skipped_episodes,
            bad_episodes_found=int(totals[BAD_EPISODES_FOUND]),
            bad_samples_dropped=int(totals[BAD_SAMPLES_DROPPED]),
        )
