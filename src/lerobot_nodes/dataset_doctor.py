"""``lerobot-nodes inspect``'s dataset checks: everything ``stream`` would reject, found without reading the payload.

:func:`check_dataset` compares ``meta/episodes`` with the files it names and returns every
disagreement as a :class:`Finding` (a level, a kind, one line, the episodes it affects):

- **files**: every data Parquet and MP4 an episode names is listed by the store (one listing of
  ``data/`` and one of ``videos/``); a file under them that no episode names is a warning
  (a converter would copy it), checked only when every episode is selected.
- **data Parquet footers**: each file's footer is read once (its tail, then the rest of the
  footer only if it is longer than the tail) and parsed; a truncated file (no ``PAR1`` magic), a
  malformed footer or a file without ``index``/``episode_index`` columns is an error. Its row
  count must be the sum of the ``length`` of the episodes ``meta/episodes`` places in it, and the
  row-group statistics of ``index``, ``episode_index``, ``frame_index`` and ``timestamp`` must span
  exactly those episodes' ``[dataset_from_index, dataset_to_index)``, episode numbers, frame
  numbers and times (``timestamp`` within ``tolerance_s`` of ``[0, (length - 1) / fps]``). A file
  without statistics for a column is a warning (that range is not checked).
- **MP4 frame counts**: each episode's ``[from_timestamp, to_timestamp)`` in its MP4 must hold
  ``length`` frames (presentation times from the MP4 index, half a frame of slack at each end).
  The camera info and span-end checks are :mod:`lerobot_nodes.video_checks`'.
- **stats**: ``meta/stats.json`` is present and has an entry for every numeric feature (warnings:
  LeRobot training normalises with them, streaming does not need them).

**Bad episodes** (:func:`episodes_to_skip`): the episodes an error-level finding names, and those
whose video span ends past their MP4 (``video_checks``), by kind: what
``--dataset.streaming_bad_episodes=skip`` leaves out of a rank's schedule, from the same checks
``inspect`` prints. :func:`missing_file_error` is the check ``raise`` runs at open: the first file
the given episodes need that the store does not list, with the episodes that need it.

Scale: per file, one footer read through the dataset's :class:`ByteSource` (remote stores too),
a few files at once, each parsed footer dropped once its numbers are taken; every per-episode
comparison is a numpy expression over the episode columns, so 20,000 files and millions of rows
cost 20,000 footer reads and no Python loop over episodes or rows. Only the findings that are
printed are formatted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from .arrays import sorted_difference, sorted_union, sorted_unique
from .errors import LeRobotNodesError, MetadataError
from .format.meta import STATS_PATH, DatasetMeta
from .format.parquet_columns import read_footer_tail
from .mp4.index import VideoIndex
from .sources import ByteSource
from .video_checks import check_video_metadata, span_overflow, span_overflows, stream_infos

ERROR = "error"
WARNING = "warning"
FOOTER_TAIL = 64 * 1024
"""Tail bytes read per data file: the whole footer of a typical LeRobot data file in one read."""
FOOTER_READERS = 8
"""Footers read at once (each holds at most its footer in memory)."""
LINES_PER_KIND = 20
"""Findings of one kind printed before ``... and N more``."""
EPISODE_RUNS_SHOWN = 6
RANGE_COLUMNS = ("index", "episode_index", "frame_index", "timestamp")
NO_STATS_DTYPES = ("string", "language")


@dataclass(frozen=True)
class Finding:
    """One problem: its level (``error`` or ``warning``), its kind (the group it is listed in),
    one line saying what is wrong, and the episodes it affects (positions in ``meta/episodes``)."""

    level: str
    kind: str
    message: str
    episodes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def line(self) -> str:
        if len(self.episodes) == 0:
            return self.message
        return f"{self.message} [{describe_episodes(self.episodes)}]"


def describe_episodes(episodes: np.ndarray) -> str:
    """``episodes 0-3, 7 (5 episodes)``: consecutive runs joined, at most a few runs shown."""
    episodes = sorted_unique(np.asarray(episodes, dtype=np.int64))
    if len(episodes) == 1:
        return f"episode {int(episodes[0])}"
    breaks = np.flatnonzero(np.diff(episodes) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(episodes)]]) - 1
    runs = [
        f"{int(episodes[s])}" if s == e else f"{int(episodes[s])}-{int(episodes[e])}"
        for s, e in zip(starts[:EPISODE_RUNS_SHOWN].tolist(), ends[:EPISODE_RUNS_SHOWN].tolist(), strict=True)
    ]
    more = ", ..." if len(starts) > EPISODE_RUNS_SHOWN else ""
    return f"episodes {', '.join(runs)}{more} ({len(episodes)} episodes)"


class Findings:
    """Findings grouped by kind, in the order kinds first appear; only the first
    :data:`LINES_PER_KIND` of a kind are kept as findings, the rest are counted. The episodes of
    every error (kept or counted) are kept per kind (:attr:`affected`): what ``skip`` leaves out."""

    def __init__(self) -> None:
        self.kinds: dict[str, tuple[str, list[Finding], list[int]]] = {}
        self.affected: dict[str, list[np.ndarray]] = {}

    def add(self, finding: Finding) -> None:
        level, kept, more = self.kinds.setdefault(finding.kind, (finding.level, [], [0]))
        if level == ERROR and len(finding.episodes):
            self.affected.setdefault(finding.kind, []).append(np.asarray(finding.episodes, dtype=np.int64))
        if len(kept) < LINES_PER_KIND:
            kept.append(finding)
        else:
            more[0] += 1

    def room(self, kind: str) -> int:
        """How many more findings of ``kind`` would be kept."""
        return LINES_PER_KIND - len(self.kinds.get(kind, (ERROR, [], [0]))[1])

    def add_counted(self, level: str, kind: str, count: int, episodes: np.ndarray | None = None) -> None:
        """``count`` findings of ``kind`` past the kept ones: counted, never made (``episodes``: the ones
        they affect, recorded as :meth:`add` records them)."""
        if count > 0:
            self.kinds.setdefault(kind, (level, [], [0]))[2][0] += count
            if level == ERROR and episodes is not None and len(episodes):
                self.affected.setdefault(kind, []).append(np.asarray(episodes, dtype=np.int64))

    def first_message(self, kind: str) -> str:
        """The first kept finding of ``kind`` (its message, without the episodes)."""
        kept = self.kinds.get(kind, (ERROR, [], [0]))[1]
        return kept[0].message if kept else kind

    def count(self, level: str) -> int:
        return sum(len(kept) + more[0] for lvl, kept, more in self.kinds.values() if lvl == level)

    @property
    def errors(self) -> int:
        return self.count(ERROR)

    @property
    def warnings(self) -> int:
        return self.count(WARNING)

    def lines(self) -> list[str]:
        out: list[str] = []
        for kind, (level, kept, more) in self.kinds.items():
            out.append(f"  {level}: {kind} ({len(kept) + more[0]})")
            out += [f"    {finding.line()}" for finding in kept]
            if more[0]:
                out.append(f"    ... and {more[0]} more")
        return out


# -- data Parquet footers ------------------------------------------------------------------


@dataclass(frozen=True)
class FooterFacts:
    """What the checks need of one data file's footer (the parsed footer itself is not kept)."""

    num_rows: int
    columns: frozenset[str]
    ranges: dict[str, tuple[float, float] | None]
    """Per :data:`RANGE_COLUMNS` column the file has: (min, max) over its row groups, ``None``
    when a row group has no statistics for it."""


def read_footer_facts(source: ByteSource, path: str, size: int) -> FooterFacts:
    """Read and parse the footer of ``path`` (``size`` bytes, from the listing); raise
    :class:`ValueError` saying what is wrong with it."""
    metadata, _, _ = read_footer_tail(source, path, size, FOOTER_TAIL)
    return footer_facts(metadata)


def footer_facts(metadata: pq.FileMetaData) -> FooterFacts:
    positions = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    ranges: dict[str, tuple[float, float] | None] = {}
    for name in RANGE_COLUMNS:
        column = positions.get(name)
        if column is None:
            continue
        low, high = math.inf, -math.inf
        for group in range(metadata.num_row_groups):
            chunk = metadata.row_group(group)
            if chunk.num_rows == 0:
                continue
            stats = chunk.column(column).statistics
            if stats is None or not stats.has_min_max:
                low = math.nan
                break
            low, high = min(low, float(stats.min)), max(high, float(stats.max))
        ranges[name] = None if math.isnan(low) else (low, high)
    return FooterFacts(num_rows=int(metadata.num_rows), columns=frozenset(positions), ranges=ranges)


@dataclass(frozen=True)
class _FileGroups:
    """Episodes grouped by the file they name: file ``f`` of ``paths`` holds ``members(f)``."""

    keys: np.ndarray
    inverse: np.ndarray
    first: np.ndarray

    @classmethod
    def of(cls, chunks: np.ndarray, files: np.ndarray) -> _FileGroups:
        key = chunks.astype(np.int64) * (1 << 32) + files.astype(np.int64)
        keys, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        return cls(keys=keys, inverse=inverse.reshape(-1), first=first)


def _members(groups: _FileGroups, episodes: np.ndarray) -> Callable[[int], np.ndarray]:
    """``members(f)``: the ``episodes`` in file ``f``, by one sort (no scan per file)."""
    files = groups.inverse[episodes]
    order = np.argsort(files, kind="stable")
    sorted_files = files[order]

    def members(f: int) -> np.ndarray:
        lo, hi = np.searchsorted(sorted_files, [f, f + 1])
        return episodes[order[lo:hi]]

    return members


def _reduce(inverse: np.ndarray, values: np.ndarray, count: int, how: np.ufunc, start: float) -> np.ndarray:
    out = np.full(count, start, dtype=np.float64)
    how.at(out, inverse, values.astype(np.float64))
    return out


def check_data_files(
    meta: DatasetMeta, episodes: np.ndarray, listed: Mapping[str, int], tolerance_s: float, findings: Findings
) -> np.ndarray:
    """The data Parquet checks of the files ``episodes`` use; returns the episodes with an error."""
    table = meta.episodes
    groups = _FileGroups.of(table.data_chunk_index, table.data_file_index)
    n = len(groups.keys)
    inverse = groups.inverse
    rows = np.bincount(inverse, weights=table.length, minlength=n).astype(np.int64)
    expected = {
        "index": (_reduce(inverse, table.dataset_from_index, n, np.minimum, math.inf),
                  _reduce(inverse, table.dataset_to_index - 1, n, np.maximum, -math.inf)),
        "episode_index": (_reduce(inverse, table.episode_index, n, np.minimum, math.inf),
                          _reduce(inverse, table.episode_index, n, np.maximum, -math.inf)),
        "frame_index": (np.zeros(n), _reduce(inverse, table.length - 1, n, np.maximum, -math.inf)),
        "timestamp": (np.zeros(n), _reduce(inverse, (table.length - 1) / meta.fps, n, np.maximum, -math.inf)),
    }  # fmt: skip
    used = sorted_unique(inverse[episodes])
    members = _members(groups, episodes)
    paths = {int(f): meta.data_file(int(groups.first[f])) for f in used.tolist()}
    bad = np.zeros(len(table), dtype=bool)

    def error(kind: str, f: int, message: str) -> None:
        affected = members(f)
        bad[affected] = True
        findings.add(Finding(ERROR, kind, message, affected))

    present = [f for f in used.tolist() if paths[f] in listed]
    for f in used.tolist():
        if paths[f] not in listed:
            error("data file missing", f, f"{paths[f]} is not in {meta.source.url}")

    def read(f: int) -> FooterFacts | str:
        try:
            return read_footer_facts(meta.source, paths[f], listed[paths[f]])
        except (ValueError, OSError, LeRobotNodesError) as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=FOOTER_READERS, thread_name_prefix="footer") as pool:
        for f, facts in zip(present, pool.map(read, present), strict=True):
            path = paths[f]
            if isinstance(facts, str):
                error("data file unreadable", f, facts)
                continue
            absent = [c for c in ("index", "episode_index") if c not in facts.columns]
            if absent:
                error("data file columns", f, f"{path} has no column {', '.join(map(repr, absent))}")
            if facts.num_rows != rows[f]:
                error(
                    "data row count", f,
                    f"{path} holds {facts.num_rows} rows; meta/episodes places {int(rows[f])} rows "
                    f"(the length of its episodes) in it",
                )  # fmt: skip
            for name, (low, high) in expected.items():
                if name not in facts.ranges:
                    continue
                found = facts.ranges[name]
                if found is None:
                    findings.add(Finding(WARNING, "data file statistics", f"{path}: no min/max statistics for "
                                         f"{name!r} in every row group; its range is not checked"))  # fmt: skip
                    continue
                slack = tolerance_s if name == "timestamp" else 0.0
                if abs(found[0] - low[f]) > slack or abs(found[1] - high[f]) > slack:
                    error(f"data {name} range", f, f"{path}: {name} spans {_range(name, found)}; meta/episodes "
                          f"says {_range(name, (low[f], high[f]))}")  # fmt: skip
    return np.flatnonzero(bad)


def _range(name: str, bounds: tuple[float, float]) -> str:
    if name == "timestamp":
        return f"[{bounds[0] + 0.0:.6f}, {bounds[1] + 0.0:.6f}] s"  # + 0.0: no "-0.000000"
    return f"[{int(bounds[0])}, {int(bounds[1])}]"


# -- videos --------------------------------------------------------------------------------


def video_files_by_episode(meta: DatasetMeta, episodes: np.ndarray) -> dict[str, tuple[_FileGroups, dict[int, str]]]:
    """Per camera: its episodes grouped by MP4, and the path of each MP4 ``episodes`` use."""
    out = {}
    for key in meta.video_keys:
        spans = meta.episodes.videos[key]
        groups = _FileGroups.of(spans.chunk_index, spans.file_index)
        used = sorted_unique(groups.inverse[episodes]).tolist()
        out[key] = (groups, {f: meta.video_file(int(groups.first[f]), key) for f in used})
    return out


def check_video_files(
    meta: DatasetMeta,
    episodes: np.ndarray,
    by_key: Mapping[str, tuple[_FileGroups, dict[int, str]]],
    listed: Mapping[str, int],
    indexes: Mapping[str, VideoIndex],
    failures: Mapping[str, str],
    findings: Findings,
) -> np.ndarray:
    """Missing and unreadable MP4s of ``episodes``; returns a mask over ``episodes``: every MP4
    of the episode has an index."""
    readable = np.ones(len(episodes), dtype=bool)
    for groups, paths in by_key.values():
        members = _members(groups, episodes)
        for f, path in paths.items():
            if path in indexes:
                continue
            affected = members(f)
            if path not in listed:
                findings.add(Finding(ERROR, "video file missing", f"{path} is not in {meta.source.url}", affected))
            else:
                why = failures.get(path, "no index")
                findings.add(Finding(ERROR, "video file unreadable", f"{path}: {why}", affected))
        has = np.zeros(len(groups.keys), dtype=bool)
        has[[f for f, path in paths.items() if path in indexes]] = True
        readable &= has[groups.inverse[episodes]]
    return readable


def check_frame_counts(
    meta: DatasetMeta,
    episodes: np.ndarray,
    by_key: Mapping[str, tuple[_FileGroups, dict[int, str]]],
    indexes: Mapping[str, VideoIndex],
    findings: Findings,
) -> None:
    """Each of ``episodes`` (whose MP4s all have indexes) holds ``length`` frames in its span of every camera."""
    kind = "video frame count"
    for key, (groups, paths) in by_key.items():
        spans = meta.episodes.videos[key]
        members = _members(groups, episodes)
        for f, path in paths.items():
            chosen = members(f)
            if len(chosen) == 0 or path not in indexes:
                continue
            index = indexes[path]
            times = np.asarray(index.presentation_pts, dtype=np.float64) / index.timescale
            half = index.frame_duration / index.timescale / 2
            counts = np.searchsorted(times, spans.to_timestamp[chosen] - half) - np.searchsorted(
                times, spans.from_timestamp[chosen] - half
            )
            wrong = np.flatnonzero(counts != meta.episodes.length[chosen])
            shown = min(len(wrong), findings.room(kind))
            for i in wrong[:shown].tolist():
                e = int(chosen[i])
                findings.add(Finding(
                    ERROR, kind,
                    f"episode {e} (camera {key}): [{spans.from_timestamp[e]:.6f}, {spans.to_timestamp[e]:.6f}) s of "
                    f"{path} holds {int(counts[i])} frames; meta/episodes says length {int(meta.episodes.length[e])}",
                    np.array([e]),
                ))  # fmt: skip
            findings.add_counted(ERROR, kind, len(wrong) - shown, chosen[wrong[shown:]])


# -- stats, orphans --------------------------------------------------------------------------


def check_stats(meta: DatasetMeta, findings: Findings) -> None:
    if meta.stats is None:
        findings.add(Finding(WARNING, "stats", f"{STATS_PATH} is missing (LeRobot training normalises with it)"))
        return
    absent = [k for k, f in meta.features.items() if f.get("dtype") not in NO_STATS_DTYPES and k not in meta.stats]
    if absent:
        findings.add(Finding(WARNING, "stats", f"{STATS_PATH} has no entry for {', '.join(absent)}"))


def check_orphans(meta: DatasetMeta, listed: Mapping[str, int], findings: Findings) -> None:
    """Files under ``data/`` and ``videos/`` that no episode names (warnings)."""
    named = set(meta.data_files()) | set(meta.video_files())
    for path in sorted(p for p in listed if p not in named):
        findings.add(Finding(WARNING, "files no episode refers to", f"{path} ({listed[path]} bytes)"))


def listing(source: ByteSource, has_videos: bool) -> dict[str, int]:
    """Path -> size of every file under ``data/`` (and ``videos/``): one listing call each."""
    files = list(source.list_files("data/"))
    if has_videos:
        files += source.list_files("videos/")
    return {f.path: int(f.size) for f in files}


# -- decoding --------------------------------------------------------------------------------


def decode_problems(
    dataset: Any, episodes: Sequence[int], findings: Findings, progress: Callable[[int], None] | None = None
) -> int:
    """Read every sample of ``dataset`` (a map-style reader of ``episodes``, in that order),
    decoding every frame; the first error of each episode is a finding and the rest of that
    episode is skipped. Returns the number of samples read."""
    lengths = np.asarray(dataset.meta.episodes.length)[np.asarray(episodes, dtype=np.int64)]
    starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    read = 0
    for k, episode in enumerate(episodes):
        for position in range(int(starts[k]), int(starts[k + 1])):
            try:
                dataset[position]
            except (LeRobotNodesError, OSError, ValueError, RuntimeError) as exc:
                frame = position - int(starts[k])
                message = f"episode {episode}, frame {frame}: {type(exc).__name__}: {exc}".splitlines()[0]
                findings.add(Finding(ERROR, "decode error", message, np.array([episode])))
                break
            read += 1
        if progress is not None:
            progress(k + 1)
    return read


@dataclass
class DoctorReport:
    findings: Findings
    indexes: dict[str, VideoIndex]
    """The MP4 indexes that opened."""
    video_checkable: np.ndarray
    """The selected episodes whose MP4s all opened (what ``video_checks`` can check)."""
    broken: np.ndarray
    """The selected episodes with an error-level finding of their data or video files."""


def check_dataset(
    meta: DatasetMeta,
    episodes: Iterable[int] | None,
    tolerance_s: float,
    open_indexes: Callable[[list[str]], tuple[dict[str, VideoIndex], dict[str, str]]],
    span_overflows: Callable[[Mapping[str, VideoIndex], np.ndarray], np.ndarray] | None = None,
) -> DoctorReport:
    """Every check but the camera-info and span-end ones (``video_checks``) and decoding.

    ``episodes``: the selection (``None``: all, and files no episode names are looked for).
    ``open_indexes(paths)``: the MP4 indexes that opened and why each other path did not.
    ``span_overflows(indexes, episodes)``: those of ``episodes`` whose span ends past their MP4
    (``video_checks`` reports them; their frame counts are not reported again).
    """
    everything = episodes is None
    chosen = np.arange(len(meta.episodes)) if episodes is None else np.fromiter(episodes, dtype=np.int64)
    listed = listing(meta.source, bool(meta.video_keys))
    findings = Findings()
    bad_data = check_data_files(meta, chosen, listed, tolerance_s, findings)
    by_key = video_files_by_episode(meta, chosen)
    wanted = sorted({p for _, paths in by_key.values() for p in paths.values() if p in listed})
    indexes, failures = open_indexes(wanted) if wanted else ({}, {})
    readable = check_video_files(meta, chosen, by_key, listed, indexes, failures, findings)
    checkable = chosen[readable]
    counted = checkable
    if span_overflows is not None and len(checkable):
        counted = sorted_difference(checkable, span_overflows(indexes, checkable))
    check_frame_counts(meta, counted, by_key, indexes, findings)
    check_stats(meta, findings)
    if everything:
        check_orphans(meta, listed, findings)
    return DoctorReport(findings, dict(indexes), checkable, sorted_union(bad_data, chosen[~readable]))


# -- bad episodes: what ``--dataset.streaming_bad_episodes`` acts on -------------------------------

SPAN_PAST_END = "video span past the end of its MP4"
"""The kind of the episodes ``video_checks.span_overflows`` finds (metadata lists frames the video does not have)."""
SHOWN_SKIPPED = 5
"""Episodes of one kind a skip line spells out before ``... (N episodes)``."""


@dataclass(frozen=True)
class BadEpisodes:
    """Episodes found bad, by kind: ``kinds[kind] = (episodes, reason)`` (sorted, distinct episodes; the
    reason is the first finding of the kind). An episode with problems of several kinds is in each."""

    kinds: dict[str, tuple[np.ndarray, str]] = field(default_factory=dict)

    @property
    def episodes(self) -> np.ndarray:
        """Every bad episode, sorted and distinct."""
        if not self.kinds:
            return np.zeros(0, dtype=np.int64)
        return sorted_unique(np.concatenate([episodes for episodes, _ in self.kinds.values()]))

    def __len__(self) -> int:
        return len(self.episodes)

    def lines(self) -> list[str]:
        """One line per kind: the kind, the first few episodes and their count, and the first reason."""
        return [f"{kind}: {shown_episodes(episodes)}: {reason}" for kind, (episodes, reason) in self.kinds.items()]

    def shifted(self, offset: int) -> BadEpisodes:
        """The same findings with every episode id moved by ``offset`` (a dataset's ids in a mixture)."""
        return BadEpisodes({kind: (episodes + offset, reason) for kind, (episodes, reason) in self.kinds.items()})

    @staticmethod
    def of_datasets(found: Sequence[tuple[str, BadEpisodes]]) -> BadEpisodes:
        """Several datasets' findings (``(name, findings)``, episode ids already the mixture's) as one: a
        kind's episodes joined, its reason the first dataset's, named (``NAME: reason``)."""
        kinds: dict[str, tuple[np.ndarray, str]] = {}
        for name, bad in found:
            for kind, (episodes, reason) in bad.kinds.items():
                if kind in kinds:
                    kinds[kind] = (sorted_union(kinds[kind][0], episodes), kinds[kind][1])
                else:
                    kinds[kind] = (episodes, f"{name}: {reason}")
        return BadEpisodes(kinds)


def shown_episodes(episodes: np.ndarray) -> str:
    """``episodes 3, 8, 11, 12, 20, ... (40 episodes)``: the first :data:`SHOWN_SKIPPED` and the count."""
    chosen = sorted_unique(np.asarray(episodes, dtype=np.int64))
    if len(chosen) == 1:
        return f"episode {int(chosen[0])}"
    head = ", ".join(str(int(e)) for e in chosen[:SHOWN_SKIPPED])
    return f"episodes {head}{', ...' if len(chosen) > SHOWN_SKIPPED else ''} ({len(chosen)} episodes)"


def episodes_to_skip(meta: DatasetMeta, report: DoctorReport, tolerance_s: float) -> BadEpisodes:
    """The episodes of ``report``'s selection that ``--dataset.streaming_bad_episodes=skip`` leaves out:
    every episode an error-level finding names (missing, unreadable or inconsistent data and MP4
    files, frame counts) and those of the video-checkable ones whose span ends past their MP4 (the
    ``video_checks`` problem ``inspect`` lists under "video metadata"). Camera info problems are not
    episodes' problems (they concern ``meta/info.json``) and stay errors. Reads nothing."""
    findings = report.findings
    kinds = {kind: (sorted_unique(np.concatenate(found)), findings.first_message(kind)) for kind, found in findings.affected.items()}
    if meta.video_keys and len(report.video_checkable):
        past = span_overflows(meta, report.indexes, report.video_checkable, tolerance_s)
        if len(past):
            first = int(past[0])
            streams = stream_infos(meta, report.indexes, past[:1])
            reasons = (span_overflow(meta, first, key, streams[meta.video_file(first, key)], tolerance_s)
                       for key in meta.video_keys)  # fmt: skip
            kinds[SPAN_PAST_END] = (past, next(r for r in reasons if r is not None))
    return BadEpisodes(kinds)


def missing_file_error(meta: DatasetMeta, episodes: np.ndarray, listed: Mapping[str, int] | set[str]) -> str | None:
    """The first data Parquet or MP4 that ``episodes`` need and the store does not list, with the
    episodes of ``episodes`` that need it (``None``: all there). One numpy grouping per file kind."""
    kinds: list[tuple[np.ndarray, np.ndarray, str | None]] = [
        (meta.episodes.data_chunk_index, meta.episodes.data_file_index, None)
    ]
    kinds += [(meta.episodes.videos[k].chunk_index, meta.episodes.videos[k].file_index, k) for k in meta.video_keys]
    for chunks, files, key in kinds:
        groups = _FileGroups.of(chunks, files)
        members = _members(groups, episodes)
        for f in sorted_unique(groups.inverse[episodes]).tolist():
            first = int(groups.first[f])
            path = meta.data_file(first) if key is None else meta.video_file(first, key)
            if path not in listed:
                needing = members(f)
                verb = "needs" if len(needing) == 1 else "need"
                return (
                    f"{path} is missing from {meta.source.url}; {describe_episodes(needing)} of the selection {verb} "
                    "it (select episodes that do not use it, or --dataset.streaming_bad_episodes=skip to leave out "
                    "the episodes whose files are missing or damaged)"
                )
    return None


def tolerant_open(
    open_strict: Callable[[list[str]], Mapping[str, VideoIndex]],
) -> Callable[[list[str]], tuple[dict[str, VideoIndex], dict[str, str]]]:
    """``open_indexes`` for :func:`check_dataset` from an open that raises on the first bad MP4: all
    files at once, and only when that fails, one by one, to name each file that does not open."""

    def open_indexes(paths: list[str]) -> tuple[dict[str, VideoIndex], dict[str, str]]:
        try:
            return dict(open_strict(paths)), {}
        except (LeRobotNodesError, OSError, ValueError):
            pass
        indexes: dict[str, VideoIndex] = {}
        failures: dict[str, str] = {}
        for path in paths:
            try:
                indexes.update(open_strict([path]))
            except (LeRobotNodesError, OSError, ValueError) as exc:
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                failures[path] = why.split(f"{path}: ", 1)[-1]
        return indexes, failures

    return open_indexes


def open_checked(
    meta: DatasetMeta,
    episodes: Sequence[int],
    tolerance_s: float,
    open_strict: Callable[[list[str]], Mapping[str, VideoIndex]],
    *,
    skip: bool,
) -> tuple[dict[str, VideoIndex], BadEpisodes]:
    """The MP4 indexes of ``episodes``' files, checked against the metadata, and the bad episodes left out.

    ``skip=False`` (``--dataset.streaming_bad_episodes=raise``): a :class:`MetadataError` naming the first
    missing file and the episodes of ``episodes`` that need it, else the first ``video_checks``
    problem (the checks of the versions before ``skip``); nothing is left out. ``skip=True``:
    :func:`check_dataset` on ``episodes`` (what ``inspect`` runs: data footers, MP4 indexes, frame
    counts) and :func:`episodes_to_skip`; the remaining episodes must pass the camera info check.
    Only the files of ``episodes`` are read, plus one listing of ``data/`` and ``videos/``.
    """
    chosen = np.asarray(episodes, dtype=np.int64)
    if not skip:
        missing = missing_file_error(meta, chosen, listing(meta.source, bool(meta.video_keys)))
        if missing is not None:
            raise MetadataError(missing)
        indexes = dict(open_strict(meta.video_files(chosen.tolist()))) if meta.video_keys else {}
        check_video_metadata(meta, indexes, chosen.tolist(), tolerance_s)
        return indexes, BadEpisodes()
    report = check_dataset(meta, chosen.tolist(), tolerance_s, tolerant_open(open_strict), _past_end(meta, tolerance_s))
    bad = episodes_to_skip(meta, report, tolerance_s)
    remaining = sorted_difference(chosen, bad.episodes)
    if meta.video_keys and len(remaining):
        check_video_metadata(meta, report.indexes, remaining.tolist(), tolerance_s)
    return report.indexes, bad


def _past_end(meta: DatasetMeta, tolerance_s: float) -> Callable[[Mapping[str, VideoIndex], np.ndarray], np.ndarray]:
    return lambda indexes, chosen: span_overflows(meta, indexes, chosen, tolerance_s)
