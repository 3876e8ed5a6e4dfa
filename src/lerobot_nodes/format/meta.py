"""LeRobotDataset v3.0 metadata, read through a :class:`~lerobot_nodes.sources.ByteSource`.

:func:`load_meta` reads ``meta/info.json``, every ``meta/episodes/chunk-*/file-*.parquet``,
``meta/tasks.parquet`` and ``meta/stats.json`` and checks them against each other. Episodes
are held column-wise (numpy arrays, tasks as one vocabulary and integer ids), so a dataset with
a million episodes stays compact. Of ``meta/episodes`` only the columns this package uses are
read (:func:`episode_columns`; the ~200 per-episode ``stats/...`` columns are never fetched
when opening, :func:`load_episode_columns` reads any column on demand). Every error names the
file (and episode) it concerns.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import io
import json
import logging
import operator
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, SupportsIndex

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import (
    ConfigError,
    ForkRefusedError,
    MetadataError,
    SourceFileNotFoundError,
    UnsupportedVersionError,
)
from ..heap import glibc_malloc_trim
from ..sources import ByteSource, FileInfo, LocalSource, ReadStats
from ..sources.listed import ListedHttpSource
from ..workers.forked_map import forked_map
from ..workers.server import fork_blocker
from .parquet_columns import read_columns
from .table_cache import CacheFileError, MappedFile, TableCache, read_table, table_key

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes/"
LEGACY_EPISODES_PATH = "meta/episodes.jsonl"

DEFAULT_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
_EPISODE_FILE_PATTERN = re.compile(r"^meta/episodes/chunk-\d+/file-\d+\.parquet$")
# Episode spans are float seconds accumulated over many encodes; allow this much slack when
# checking that consecutive spans in one video file meet.
_SPAN_SLACK_S = 1e-4
# The meta/episodes columns every dataset must have (videos/<key>/... too, per video key).
EPISODE_INT_COLUMNS = (
    "episode_index",
    "length",
    "dataset_from_index",
    "dataset_to_index",
    "data/chunk_index",
    "data/file_index",
)
# Read when present; an episode of a file without it has no tasks.
EPISODE_OPTIONAL_COLUMNS = ("tasks",)
# Episode files read at once: local reads are mostly CPU (footer parse and decode, which release the
# GIL) but wait on the disk when the page cache is cold, so a few more than 2 cores keep both busy;
# remote ones wait on round trips.
_LOCAL_READERS = 4
_REMOTE_READERS = 8
# Local episode files read by forked processes instead (_fork_readers): at least this many files,
# at most this many processes (one per core the process may use, up to this).
_FORK_MIN_FILES = 16
_FORK_MAX_READERS = 8

log = logging.getLogger("lerobot_nodes.format")


@dataclass(frozen=True)
class VideoSpans:
    """Where one camera's frames of every episode live: file and time span inside it."""

    chunk_index: np.ndarray
    file_index: np.ndarray
    from_timestamp: np.ndarray
    to_timestamp: np.ndarray


class EpisodeTasks(Sequence[list[str]]):
    """Every episode's ``tasks`` list, held compactly: episode ``e``'s tasks are
    ``names[i] for i in ids[offsets[e]:offsets[e + 1]]`` (one string per distinct task, not
    one Python list per episode). Indexing gives a fresh ``list[str]``."""

    __slots__ = ("offsets", "ids", "names")

    def __init__(self, offsets: np.ndarray, ids: np.ndarray, names: Sequence[str | None]) -> None:
        self.offsets = offsets
        self.ids = ids
        self.names = list(names)

    @classmethod
    def from_lists(cls, lists: Iterable[Iterable[str | None]]) -> EpisodeTasks:
        vocabulary: dict[str | None, int] = {}
        lengths: list[int] = []
        ids: list[int] = []
        for episode_tasks in lists:
            listed = list(episode_tasks)
            lengths.append(len(listed))
            ids.extend(vocabulary.setdefault(t, len(vocabulary)) for t in listed)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(offsets, np.asarray(ids, dtype=np.int32), list(vocabulary))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = operator.index(index)
        count = len(self)
        if i < 0:
            i += count
        if not 0 <= i < count:
            raise IndexError(f"episode {index} out of range ({count} episodes)")
        names = self.names
        return [names[j] for j in self.ids[self.offsets[i] : self.offsets[i + 1]].tolist()]

    def __iter__(self) -> Iterator[list[str]]:
        names, ids, bounds = self.names, self.ids.tolist(), self.offsets.tolist()
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            yield [names[j] for j in ids[start:stop]]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == list(b) for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def tolist(self) -> list[list[str]]:
        return list(self)

    def __repr__(self) -> str:
        return f"EpisodeTasks({len(self)} episodes, {len(self.names)} distinct tasks)"


@dataclass(frozen=True)
class EpisodeTable:
    """The selected columns of ``meta/episodes``, one entry per episode, positional.

    A table mapped from the node's table cache (``mapped``) pickles as its cache file, not its
    arrays: a DataLoader worker (or any process it is sent to) maps the same pages instead of
    receiving a private copy (~110 MB per process at 1M episodes with 2 cameras)."""

    episode_index: np.ndarray
    length: np.ndarray
    dataset_from_index: np.ndarray
    dataset_to_index: np.ndarray
    data_chunk_index: np.ndarray
    data_file_index: np.ndarray
    tasks: EpisodeTasks
    videos: dict[str, VideoSpans]
    mapped: MappedFile | None = field(default=None, compare=False, repr=False)
    """The table-cache file these arrays are read-only views of, if they are."""

    def __len__(self) -> int:
        return len(self.episode_index)

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        if self.mapped is None:
            return super().__reduce_ex__(protocol)
        return (_mapped_episode_table, (str(self.mapped.path), self.mapped.key, list(self.videos)))


def _mapped_episode_table(path: str, key: str, video_keys: list[str]) -> EpisodeTable:
    """The table a process pickled by its cache file (:class:`EpisodeTable`), mapped in this one."""
    try:
        cached = read_table(Path(path), key)
    except (OSError, CacheFileError) as error:
        raise MetadataError(
            f"the cached meta/episodes table {path}, which the training process read the dataset from, is gone "
            f"or was replaced ({error}): start the run again (the next open rebuilds it)"
        ) from None
    table = _table_from_arrays(cached.arrays, cached.extra, video_keys, cached.mapped)
    if table is None:
        raise MetadataError(f"the cached meta/episodes table {path} lacks columns of this version: start the run again")
    return table


@dataclass
class DatasetMeta:
    """Everything a reader needs to know about a v3 dataset before touching its payload."""

    source: ByteSource
    info: dict[str, Any]
    episodes: EpisodeTable
    tasks: list[str]
    stats: dict[str, dict[str, np.ndarray]] | None
    repo_id: str | None = None

    # -- info.json fields ------------------------------------------------------------
    @property
    def fps(self) -> int:
        return int(self.info["fps"])

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return self.info["features"]

    @property
    def codebase_version(self) -> str:
        return str(self.info["codebase_version"])

    @property
    def total_episodes(self) -> int:
        return int(self.info["total_episodes"])

    @property
    def total_frames(self) -> int:
        return int(self.info["total_frames"])

    @property
    def total_tasks(self) -> int:
        return int(self.info["total_tasks"])

    @property
    def robot_type(self) -> str | None:
        return self.info.get("robot_type")

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] == "image"]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] in ("video", "image")]

    @property
    def depth_keys(self) -> list[str]:
        return [k for k in self.camera_keys if _is_depth(self.features[k])]

    # -- file locations --------------------------------------------------------------
    def data_file(self, episode: int) -> str:
        """Path of the data Parquet file holding ``episode``'s rows."""
        return str(self.info["data_path"]).format(
            chunk_index=int(self.episodes.data_chunk_index[episode]),
            file_index=int(self.episodes.data_file_index[episode]),
        )

    def video_file(self, episode: int, video_key: str) -> str:
        """Path of the MP4 holding ``episode``'s frames of camera ``video_key``."""
        spans = self.episodes.videos[video_key]
        return str(self.info["video_path"]).format(
            video_key=video_key,
            chunk_index=int(spans.chunk_index[episode]),
            file_index=int(spans.file_index[episode]),
        )

    def video_span(self, episode: int, video_key: str) -> tuple[float, float]:
        """``(from_timestamp, to_timestamp)`` of ``episode`` inside its MP4, in seconds."""
        spans = self.episodes.videos[video_key]
        return float(spans.from_timestamp[episode]), float(spans.to_timestamp[episode])

    def episode_bounds(self, episode: int) -> tuple[int, int]:
        """Global ``index`` range ``[from, to)`` of ``episode``'s frames."""
        return int(self.episodes.dataset_from_index[episode]), int(self.episodes.dataset_to_index[episode])

    def data_files(self, episodes: Iterable[int] | None = None) -> list[str]:
        """Sorted distinct data files of ``episodes`` (all episodes when ``None``)."""
        chosen = self._chosen(episodes)
        template = str(self.info["data_path"])
        pairs = _distinct_pairs(self.episodes.data_chunk_index, self.episodes.data_file_index, chosen)
        return sorted({template.format(chunk_index=c, file_index=f) for c, f in pairs})

    def video_files(self, episodes: Iterable[int] | None = None) -> list[str]:
        chosen = self._chosen(episodes)
        paths: set[str] = set()
        template = str(self.info.get("video_path"))
        for key in self.video_keys:
            spans = self.episodes.videos[key]
            for c, f in _distinct_pairs(spans.chunk_index, spans.file_index, chosen):
                paths.add(template.format(video_key=key, chunk_index=c, file_index=f))
        return sorted(paths)

    def _chosen(self, episodes: Iterable[int] | None) -> np.ndarray | None:
        if episodes is None:
            return None
        return np.fromiter((int(e) for e in episodes), dtype=np.int64)

    def read_episode_columns(self, columns: Sequence[str]) -> pa.Table:
        """Columns of ``meta/episodes`` that opening leaves unread (the per-episode ``stats/...``
        columns, ``meta/episodes/...``), read now; see :func:`load_episode_columns`."""
        return load_episode_columns(self.source, columns)

    def summary(self) -> str:
        lines = [
            f"LeRobotDataset {self.codebase_version} at {self.source.url}",
            f"  episodes: {self.total_episodes}, frames: {self.total_frames}, fps: {self.fps}, "
            f"tasks: {self.total_tasks}, robot: {self.robot_type}",
            f"  cameras: {', '.join(self.camera_keys) or '(none)'}",
            f"  data files: {len(self.data_files())}, video files: {len(self.video_files())}",
        ]
        for key, feature in self.features.items():
            lines.append(f"    {key}: {feature['dtype']} {tuple(feature.get('shape') or ())}")
        return "\n".join(lines)


def _distinct_pairs(
    chunks: np.ndarray, files: np.ndarray, chosen: np.ndarray | None = None
) -> list[tuple[int, int]]:
    """The distinct ``(chunk, file)`` pairs of the ``chosen`` positions (all when ``None``), in
    order of first appearance. Episodes of one file are neighbours, so only run starts are visited."""
    if chosen is not None:
        chunks, files = chunks[chosen], files[chosen]
    if len(chunks) == 0:
        return []
    starts = np.flatnonzero((chunks[1:] != chunks[:-1]) | (files[1:] != files[:-1])) + 1
    starts = np.concatenate([[0], starts])
    return list(dict.fromkeys(zip(chunks[starts].tolist(), files[starts].tolist(), strict=True)))


def _is_depth(feature: dict[str, Any]) -> bool:
    info = feature.get("info") or {}
    legacy = feature.get("video_info") or {}
    return bool(
        info.get("is_depth_map") or info.get("video.is_depth_map") or legacy.get("video.is_depth_map")
    )


# -- loading -------------------------------------------------------------------------


def load_meta(
    source: ByteSource,
    repo_id: str | None = None,
    check_files: bool = True,
    table_cache: TableCache | bool = True,
) -> DatasetMeta:
    """Read and cross-check the v3 metadata of the dataset behind ``source``.

    With ``check_files`` every data and video file the episodes point to must appear in the
    source's listing (one listing call, no payload read). ``table_cache``: where the parsed
    ``meta/episodes`` table is kept per revision (``True``: ``$HF_LEROBOT_HOME/streaming-meta/
    episode-tables``; ``False``: parse the Parquet at every open); see :func:`load_episodes`.
    """
    info = load_info(source)
    cache = TableCache() if table_cache is True else None if table_cache is False else table_cache
    episodes = load_episodes(source, info, cache=cache)
    tasks = load_tasks(source, info)
    stats = load_stats(source)
    meta = DatasetMeta(source=source, info=info, episodes=episodes, tasks=tasks, stats=stats, repo_id=repo_id)
    _check_totals(meta)
    if check_files:
        _check_files_exist(meta)
    release_free_heap()
    return meta


_malloc_trim = functools.cache(glibc_malloc_trim)


def release_free_heap() -> None:
    """Give memory freed while reading the metadata back to the system: Arrow's pool's unused
    memory, and the C heap's free pages where the C library is glibc (``malloc_trim(0)``)."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim()


def _read_json(source: ByteSource, path: str) -> Any:
    raw = source.read_file(path)
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MetadataError(f"{path} in {source.url} is not valid JSON: {exc}") from None


def load_info(source: ByteSource) -> dict[str, Any]:
    """``meta/info.json`` as a dict, after checking the format version and required fields."""
    try:
        info = _read_json(source, INFO_PATH)
    except SourceFileNotFoundError:
        raise MetadataError(
            f"{INFO_PATH} not found in {source.url}: this is not a LeRobotDataset root "
            "(expected meta/info.json, meta/episodes/, data/ and videos/)"
        ) from None
    if not isinstance(info, dict):
        raise MetadataError(f"{INFO_PATH} in {source.url} must hold a JSON object, got {type(info).__name__}")
    version = str(info.get("codebase_version", ""))
    match = re.fullmatch(r"v?(\d+)(?:\.(\d+))?.*", version)
    if not match:
        raise MetadataError(f"{INFO_PATH} in {source.url} has no valid codebase_version (got {version!r})")
    major = int(match.group(1))
    if major < 3:
        raise UnsupportedVersionError(
            f"{source.url} is a LeRobotDataset {version} (codebase_version in {INFO_PATH}); "
            "lerobot_nodes reads v3.0 only. Convert it first with LeRobot's converter: "
            "python -m lerobot.datasets.v30.convert_dataset_v21_to_v30 --repo-id=OWNER/DATASET"
        )
    if major > 3:
        raise UnsupportedVersionError(
            f"{source.url} is a LeRobotDataset {version} ({INFO_PATH}); this lerobot_nodes reads v3.x. "
            "Upgrade lerobot_nodes."
        )
    required = {"fps": int, "features": dict, "total_episodes": int, "total_frames": int, "data_path": str}
    for key, kind in required.items():
        if not isinstance(info.get(key), kind):
            raise MetadataError(
                f"{INFO_PATH} in {source.url}: field {key!r} must be {kind.__name__}, got {info.get(key)!r}"
            )
    if info["fps"] <= 0:
        raise MetadataError(f"{INFO_PATH} in {source.url}: fps must be > 0, got {info['fps']}")
    for key, feature in info["features"].items():
        if not isinstance(feature, dict) or "dtype" not in feature:
            raise MetadataError(f"{INFO_PATH} in {source.url}: feature {key!r} has no dtype")
    has_video = any(f["dtype"] == "video" for f in info["features"].values())
    if has_video and not isinstance(info.get("video_path"), str):
        raise MetadataError(f"{INFO_PATH} in {source.url}: video features need a 'video_path' template")
    info.setdefault("total_tasks", 0)
    info.setdefault("chunks_size", 1000)
    return info


def _read_parquet(source: ByteSource, path: str, columns: Sequence[str] | None = None) -> pa.Table:
    """The whole table of the Parquet file ``path`` (or its ``columns``).

    Read through ``ParquetFile``, not ``pq.read_table``: the same table (columns, types, schema
    metadata), but ``read_table`` goes through ``pyarrow.dataset``, whose first import (8-13 ms,
    with dateutil) fell inside every dataset's construction."""
    raw = source.read_file(path)
    try:
        return pq.ParquetFile(io.BytesIO(raw)).read(columns=list(columns) if columns is not None else None)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise MetadataError(f"{path} in {source.url} is not a readable Parquet file: {exc}") from None


def _int_column(table: pa.Table, name: str, path: str) -> np.ndarray:
    if name not in table.column_names:
        raise MetadataError(f"{path}: required column {name!r} is missing")
    column = table.column(name)
    if column.null_count:
        raise MetadataError(f"{path}: column {name!r} has {column.null_count} missing values")
    return _arrow_owned(column, pa.int64())


def _float_column(table: pa.Table, name: str, path: str) -> np.ndarray:
    if name not in table.column_names:
        raise MetadataError(f"{path}: required column {name!r} is missing")
    column = table.column(name)
    if column.null_count:  # missing values become NaN: numpy's copy
        return np.asarray(column.to_numpy(), dtype=np.float64)
    return _arrow_owned(column, pa.float64())


def _arrow_owned(column: pa.ChunkedArray | pa.Array, kind: pa.DataType) -> np.ndarray:
    """``column`` (no nulls) as one read-only numpy array of ``kind``, a view of memory Arrow's pool holds.

    Why not numpy's copy: these arrays outlive the parse of their file, and numpy would put them in
    the C heap between the ~200,000 objects of the file's parsed footer; once that is freed they pin
    the heap into a patchwork, and every later footer's parse and free costs more (measured: the free
    9 -> 15 ms, the parse 23 -> 26 ms, over 100 files). Arrow's pool (mimalloc or jemalloc) is apart."""
    if column.type != kind:
        column = pc.cast(column, kind)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.to_numpy(zero_copy_only=True)


def episode_columns(info: dict[str, Any]) -> list[str]:
    """The ``meta/episodes`` columns :func:`load_episodes` reads for a dataset with ``info``;
    no other column's bytes are fetched."""
    video_keys = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    names = [*EPISODE_INT_COLUMNS, *EPISODE_OPTIONAL_COLUMNS]
    for key in video_keys:
        names += [
            f"videos/{key}/{n}" for n in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
        ]
    return names


def _episode_files(source: ByteSource) -> list[FileInfo]:
    files = [f for f in source.list_files(EPISODES_DIR) if _EPISODE_FILE_PATTERN.match(f.path)]
    if not files:
        hint = ""
        if source.exists(LEGACY_EPISODES_PATH):
            hint = " (found meta/episodes.jsonl: this looks like a v2.x dataset; convert it to v3.0)"
        raise MetadataError(f"no meta/episodes/chunk-*/file-*.parquet files in {source.url}{hint}")
    return files


def _whole_meta_files(source: ByteSource) -> bool:
    """Whether ``meta/`` files are better read whole: listed remote stores keep whole ``meta/``
    files in a local cache keyed by content, so a whole read costs nothing after the first open
    (and works offline), while range reads would go to the network every time."""
    return isinstance(source, ListedHttpSource)


FileRead = Callable[[FileInfo, "FileInfo | None"], Any]
"""Reads one file, given the file read after it by the same reader (``None``: none), whose bytes it
may :meth:`~lerobot_nodes.sources.ByteSource.advise` the source of."""


def _map_files(source: ByteSource, files: Sequence[FileInfo], read: FileRead) -> list[Any]:
    """``read`` of every file, in file order, a few at a time (the first error in file order raises).

    Many local files are read by forked processes where this process may fork
    (:func:`_fork_readers`), else by threads. Each file is read with the one after it (a forked
    reader reads a contiguous run of files, one at a time)."""
    pairs = list(zip(files, [*files[1:], None], strict=True))
    processes = _fork_readers(source, files)
    if processes > 1:
        try:
            counted = forked_map(functools.partial(_counted_read, source, read), pairs, processes)
        except ForkRefusedError as error:  # a process, memory or file limit: threads need none of that
            log.debug("reading %d meta/episodes files with threads: %s", len(files), error)
        else:
            for _, stats in counted:
                source.add_stats(stats)
            return [result for result, _ in counted]
    limit = _LOCAL_READERS if isinstance(source, LocalSource) else _REMOTE_READERS
    workers = max(1, min(limit, len(files)))
    if workers == 1:
        return [read(*pair) for pair in pairs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lerobot-nodes-meta") as pool:
        return list(pool.map(read, files, [after for _, after in pairs]))


def _counted_read(
    source: ByteSource, read: FileRead, pair: tuple[FileInfo, FileInfo | None]
) -> tuple[Any, ReadStats]:
    """``read(*pair)`` and what it read of ``source`` (a forked reader's copy of it, whose counts the
    parent adds to its own)."""
    before = dataclasses.replace(source.stats)
    result = read(*pair)
    after = source.stats
    return result, ReadStats(
        requests=after.requests - before.requests,
        bytes_read=after.bytes_read - before.bytes_read,
        whole_file_reads=after.whole_file_reads - before.whole_file_reads,
    )


def _fork_readers(source: ByteSource, files: Sequence[FileInfo]) -> int:
    """How many forked processes read ``files`` (1: none, threads do).

    Parsing a local ``meta/episodes`` file is CPU work of which pyarrow holds the GIL for a third
    (freeing each parsed footer of ~21,700 column chunks: LeRobot writes row groups of 10 rows),
    so threads use one core; one process per core uses them all. Only where a fork is safe (no
    other threads: :func:`~lerobot_nodes.workers.server.fork_blocker`) and there are enough files
    to pay for the forks (a few milliseconds each) and for pickling the results back."""
    if not isinstance(source, LocalSource) or len(files) < _FORK_MIN_FILES or not hasattr(os, "fork"):
        return 1
    if not sys.platform.startswith("linux") or fork_blocker() is not None:
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), _FORK_MAX_READERS))


@dataclass
class _EpisodeFileColumns:
    """What one ``meta/episodes`` file contributes: numpy columns and its episodes' tasks."""

    rows: int
    columns: dict[str, np.ndarray]
    task_lengths: np.ndarray
    task_ids: np.ndarray
    task_names: pa.Array
    """The file's task vocabulary (strings, a null for a missing task), in order of first appearance."""


_NO_TASK_NAMES = pa.array([], pa.large_string())


def _task_lists(table: pa.Table) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Per-episode task counts, task ids into a file-local vocabulary, and that vocabulary.

    The vocabulary stays an Arrow array (a file of 1,000 episodes may name 1,000 tasks: no Python
    string per task until the merged vocabulary is built, once)."""
    if "tasks" not in table.column_names:
        return np.zeros(table.num_rows, dtype=np.int64), np.zeros(0, dtype=np.int64), _NO_TASK_NAMES
    column = table.column("tasks")
    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
        compact = EpisodeTasks.from_lists(list(t or []) for t in column.to_pylist())
        names = pa.array(compact.names, pa.large_string())
        return np.diff(compact.offsets), compact.ids.astype(np.int64), names
    lengths = _arrow_owned(pc.list_value_length(column).fill_null(0), pa.int64())
    flat = pc.list_flatten(column)
    flat = flat.combine_chunks() if isinstance(flat, pa.ChunkedArray) else flat
    if len(flat) == 0:
        return lengths, np.zeros(0, dtype=np.int64), _NO_TASK_NAMES
    encoded = flat.dictionary_encode()
    names = encoded.dictionary.cast(pa.large_string())
    indices = encoded.indices
    if indices.null_count:
        indices = indices.fill_null(len(names))
        names = pa.concat_arrays([names, pa.nulls(1, pa.large_string())])
    return lengths, _arrow_owned(indices, pa.int64()), names


def _read_episode_file(
    source: ByteSource,
    array_names: tuple[Sequence[str], Sequence[str]],
    whole: bool,
    file: FileInfo,
    read_next: FileInfo | None,
) -> _EpisodeFileColumns:
    path = file.path
    int_names, float_names = array_names
    wanted = [*int_names, *float_names, *EPISODE_OPTIONAL_COLUMNS]
    table = read_columns(source, path, wanted, size=file.size, whole_file=whole, read_next=read_next).table
    columns = {name: _int_column(table, name, path) for name in int_names}
    columns.update({name: _float_column(table, name, path) for name in float_names})
    lengths, ids, task_names = _task_lists(table)
    return _EpisodeFileColumns(table.num_rows, columns, lengths, ids, task_names)


def _merge_tasks(parts: Sequence[_EpisodeFileColumns]) -> EpisodeTasks:
    """One vocabulary for every file's tasks, in order of first appearance across the files (a
    missing task, null, is an entry of its own), and each file's task ids mapped into it."""
    every_name = pa.concat_arrays([part.task_names for part in parts]) if parts else _NO_TASK_NAMES
    # Dictionary encoding numbers the distinct names in order of first appearance: the vocabulary.
    encoded = every_name.dictionary_encode(null_encoding="encode")
    into_vocabulary = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    ids = []
    start = 0
    for part in parts:
        remap = into_vocabulary[start : start + len(part.task_names)]
        start += len(part.task_names)
        ids.append(remap[part.task_ids])
    lengths = np.concatenate([part.task_lengths for part in parts])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids_array = np.concatenate(ids).astype(np.int32, copy=False) if ids else np.zeros(0, dtype=np.int32)
    return EpisodeTasks(offsets, ids_array, encoded.dictionary.to_pylist())


EPISODE_TABLE_KIND = "meta/episodes"
"""The kind of the cached episodes table in its :func:`~.table_cache.table_key`."""


def load_episodes(source: ByteSource, info: dict[str, Any], cache: TableCache | None = None) -> EpisodeTable:
    """Every ``meta/episodes`` file, concatenated in path order; only :func:`episode_columns` read.

    With ``cache``, the parsed table is kept per revision: its key is the source (URL, pinned
    revision) and the path, size and content identity of ``meta/info.json`` and of every
    ``meta/episodes`` file (:func:`~.table_cache.table_key`), so an open of the same content maps
    the cached arrays (read-only, shared by the node's processes) and reads no Parquet; changed
    content is parsed (and cached) again. The checks of the rows ran when the table was parsed.
    """
    files = _episode_files(source)
    video_keys = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    if cache is None:
        return _parse_episodes(source, video_keys, files)
    key = table_key(source, EPISODE_TABLE_KIND, [*files, source.info(INFO_PATH)])
    what = f"meta/episodes table of {source.url}"
    cached = cache.get_or_build(
        source, key, lambda: _table_arrays(_parse_episodes(source, video_keys, files)), what=what
    )
    table = _table_from_arrays(cached.arrays, cached.extra, video_keys, cached.mapped)
    if table is None:  # not the arrays this code stores: a bug or a foreign file, never the user's problem
        log.warning("the cached %s lacks columns of this version: parsing it again", what)
        return _parse_episodes(source, video_keys, files)
    return table


def _episode_array_names(video_keys: Sequence[str]) -> tuple[list[str], list[str]]:
    """The integer and float ``meta/episodes`` columns read for a dataset with ``video_keys``."""
    int_names = list(EPISODE_INT_COLUMNS)
    for key in video_keys:
        int_names += [f"videos/{key}/chunk_index", f"videos/{key}/file_index"]
    float_names = [
        name for key in video_keys for name in (f"videos/{key}/from_timestamp", f"videos/{key}/to_timestamp")
    ]
    return int_names, float_names


_TASK_OFFSETS, _TASK_IDS = "tasks/offsets", "tasks/ids"


def _table_arrays(table: EpisodeTable) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``table`` as named arrays (the ``meta/episodes`` column names) and JSON (the task vocabulary)."""
    arrays = {
        "episode_index": table.episode_index,
        "length": table.length,
        "dataset_from_index": table.dataset_from_index,
        "dataset_to_index": table.dataset_to_index,
        "data/chunk_index": table.data_chunk_index,
        "data/file_index": table.data_file_index,
    }
    for key, spans in table.videos.items():
        arrays.update(
            {
                f"videos/{key}/chunk_index": spans.chunk_index,
                f"videos/{key}/file_index": spans.file_index,
                f"videos/{key}/from_timestamp": spans.from_timestamp,
                f"videos/{key}/to_timestamp": spans.to_timestamp,
            }
        )
    arrays[_TASK_OFFSETS] = table.tasks.offsets
    arrays[_TASK_IDS] = table.tasks.ids
    return arrays, {"task_names": list(table.tasks.names)}


def _table_from_arrays(
    arrays: dict[str, np.ndarray], extra: dict[str, Any], video_keys: Sequence[str], mapped: MappedFile | None = None
) -> EpisodeTable | None:
    """The table :func:`_table_arrays` stored (views of the cache file ``mapped``, if given), or ``None``
    when an array is missing or misshapen."""
    int_names, float_names = _episode_array_names(video_keys)
    names = [*int_names, *float_names]
    if any(name not in arrays for name in (*names, _TASK_OFFSETS, _TASK_IDS)) or "task_names" not in extra:
        return None
    count = len(arrays["episode_index"])
    offsets, ids = arrays[_TASK_OFFSETS], arrays[_TASK_IDS]
    if any(arrays[name].shape != (count,) for name in names) or offsets.shape != (count + 1,):
        return None
    if len(offsets) and (
        int(offsets[-1]) != len(ids) or (len(ids) and int(ids.max()) >= len(extra["task_names"]))
    ):
        return None
    return _table_of(arrays, EpisodeTasks(offsets, ids, extra["task_names"]), video_keys, mapped)


def _table_of(
    columns: Mapping[str, np.ndarray],
    tasks: EpisodeTasks,
    video_keys: Sequence[str],
    mapped: MappedFile | None = None,
) -> EpisodeTable:
    """The table of the per-episode ``columns`` (named as the ``meta/episodes`` Parquet names them)."""
    return EpisodeTable(
        episode_index=columns["episode_index"],
        length=columns["length"],
        dataset_from_index=columns["dataset_from_index"],
        dataset_to_index=columns["dataset_to_index"],
        data_chunk_index=columns["data/chunk_index"],
        data_file_index=columns["data/file_index"],
        tasks=tasks,
        videos={
            key: VideoSpans(
                chunk_index=columns[f"videos/{key}/chunk_index"],
                file_index=columns[f"videos/{key}/file_index"],
                from_timestamp=columns[f"videos/{key}/from_timestamp"],
                to_timestamp=columns[f"videos/{key}/to_timestamp"],
            )
            for key in video_keys
        },
        mapped=mapped,
    )


def _parse_episodes(source: ByteSource, video_keys: Sequence[str], files: Sequence[FileInfo]) -> EpisodeTable:
    """The episodes table read from the Parquet ``files`` and checked."""
    int_names, float_names = _episode_array_names(video_keys)
    whole = _whole_meta_files(source)
    read = functools.partial(_read_episode_file, source, (int_names, float_names), whole)
    parts = _map_files(source, files, read)
    merged = {
        name: np.concatenate([part.columns[name] for part in parts]) for name in [*int_names, *float_names]
    }
    tasks = _merge_tasks(parts)
    del parts
    episode_index = merged["episode_index"]
    expected = np.arange(len(episode_index))
    if not np.array_equal(episode_index, expected):
        bad = int(np.flatnonzero(episode_index != expected)[0])
        raise MetadataError(
            f"meta/episodes rows must be ordered by episode_index 0..N-1: row {bad} holds episode "
            f"{int(episode_index[bad])} (files {', '.join(f.path for f in files)})"
        )
    table = _table_of(merged, tasks, video_keys)
    _check_episode_rows(table)
    return table


def load_episode_columns(source: ByteSource, columns: Sequence[str]) -> pa.Table:
    """Any ``columns`` of ``meta/episodes`` (e.g. per-episode ``stats/<feature>/<stat>``), one row
    per episode in episode order, reading only those columns' bytes. A column some files lack is
    null in their rows; a column no file has is an error naming it."""
    files = _episode_files(source)
    whole = _whole_meta_files(source)
    reads = _map_files(
        source,
        files,
        lambda file, read_next: read_columns(
            source, file.path, columns, size=file.size, whole_file=whole, read_next=read_next
        ),
    )
    missing = [name for name in columns if not any(name in r.schema.names for r in reads)]
    if missing:
        raise MetadataError(f"meta/episodes in {source.url} has no column {', '.join(map(repr, missing))}")
    types: dict[str, pa.DataType] = {}
    for read in reads:
        for column in read.schema:
            types.setdefault(column.name, column.type)
    schema = pa.schema([pa.field(name, types[name]) for name in columns])
    tables = []
    for read in reads:
        table = read.table
        arrays = [
            table.column(name) if name in table.column_names else pa.nulls(table.num_rows, types[name])
            for name in columns
        ]
        tables.append(pa.Table.from_arrays(arrays, schema=schema))
    return pa.concat_tables(tables)


def _check_episode_rows(table: EpisodeTable) -> None:
    spans = table.dataset_to_index - table.dataset_from_index
    bad = np.flatnonzero((spans != table.length) | (table.length <= 0) | (table.dataset_from_index < 0))
    if len(bad):
        e = int(bad[0])
        raise MetadataError(
            f"meta/episodes: episode {e} has length {int(table.length[e])} but rows "
            f"[{int(table.dataset_from_index[e])}, {int(table.dataset_to_index[e])})"
        )
    gaps = np.flatnonzero(table.dataset_from_index[1:] != table.dataset_to_index[:-1])
    if len(gaps):
        e = int(gaps[0]) + 1
        raise MetadataError(
            f"meta/episodes: episode {e} starts at row {int(table.dataset_from_index[e])} but episode "
            f"{e - 1} ends at row {int(table.dataset_to_index[e - 1])}; episode rows must be contiguous"
        )
    for key, video in table.videos.items():
        bad = np.flatnonzero(
            ~np.isfinite(video.from_timestamp)
            | ~np.isfinite(video.to_timestamp)
            | (video.from_timestamp < 0)
            | (video.to_timestamp <= video.from_timestamp)
        )
        if len(bad):
            e = int(bad[0])
            raise MetadataError(
                f"meta/episodes: episode {e} has an empty or negative video span for {key}: "
                f"[{video.from_timestamp[e]}, {video.to_timestamp[e]})"
            )


def load_tasks(source: ByteSource, info: dict[str, Any]) -> list[str]:
    """Task strings by position (row i holds ``task_index == i``)."""
    try:
        table = _read_parquet(source, TASKS_PATH)
    except SourceFileNotFoundError:
        if int(info.get("total_tasks", 0)) == 0:
            return []
        raise MetadataError(f"{TASKS_PATH} not found in {source.url} but info.json declares tasks") from None
    names = table.column_names
    task_column = "task" if "task" in names else "__index_level_0__" if "__index_level_0__" in names else None
    if task_column is None or "task_index" not in names:
        raise MetadataError(
            f"{TASKS_PATH}: expected columns 'task' (or the pandas index) and 'task_index', got {names}"
        )
    task_index = _int_column(table, "task_index", TASKS_PATH)
    if not np.array_equal(task_index, np.arange(len(task_index))):
        raise MetadataError(f"{TASKS_PATH}: row i must hold task_index i, got {task_index.tolist()[:10]}...")
    return [str(t) for t in table.column(task_column).to_pylist()]


def load_stats(source: ByteSource) -> dict[str, dict[str, np.ndarray]] | None:
    """``meta/stats.json`` as nested numpy arrays, or ``None`` when the file is absent."""
    try:
        raw = _read_json(source, STATS_PATH)
    except SourceFileNotFoundError:
        return None
    if not isinstance(raw, dict):
        raise MetadataError(f"{STATS_PATH} in {source.url} must hold a JSON object")
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key, per_stat in raw.items():
        if not isinstance(per_stat, dict):
            raise MetadataError(f"{STATS_PATH}: entry {key!r} must be an object of statistics")
        stats[key] = {name: np.atleast_1d(np.asarray(value)) for name, value in per_stat.items()}
    return stats


def _check_totals(meta: DatasetMeta) -> None:
    episodes = meta.episodes
    problems = []
    if meta.total_episodes != len(episodes):
        problems.append(f"total_episodes is {meta.total_episodes} but meta/episodes has {len(episodes)} rows")
    frames = int(episodes.length.sum())
    if meta.total_frames != frames:
        problems.append(f"total_frames is {meta.total_frames} but the episode lengths sum to {frames}")
    if meta.tasks and meta.total_tasks != len(meta.tasks):
        problems.append(f"total_tasks is {meta.total_tasks} but {TASKS_PATH} has {len(meta.tasks)} rows")
    if problems:
        raise MetadataError(
            f"{INFO_PATH} disagrees with the tables in {meta.source.url}: " + "; ".join(problems)
        )
    for key, video in episodes.videos.items():
        same_file = (video.chunk_index[1:] == video.chunk_index[:-1]) & (
            video.file_index[1:] == video.file_index[:-1]
        )
        overlap = np.flatnonzero(
            same_file & (video.from_timestamp[1:] < video.to_timestamp[:-1] - _SPAN_SLACK_S)
        )
        if len(overlap):
            e = int(overlap[0]) + 1
            raise MetadataError(
                f"meta/episodes: episode {e}'s {key} span starts at {video.from_timestamp[e]} s, before episode "
                f"{e - 1}'s span ends ({video.to_timestamp[e - 1]} s) in {meta.video_file(e, key)}"
            )


def _check_files_exist(meta: DatasetMeta) -> None:
    listed = {f.path for f in meta.source.list_files("data/")}
    if meta.video_keys:
        listed |= {f.path for f in meta.source.list_files("videos/")}
    episodes = meta.episodes
    # (first episode needing the file, data before each camera in feature order, path)
    missing: list[tuple[int, int, str]] = []
    kinds: list[tuple[np.ndarray, np.ndarray, str | None]] = [
        (episodes.data_chunk_index, episodes.data_file_index, None)
    ]
    kinds += [(episodes.videos[k].chunk_index, episodes.videos[k].file_index, k) for k in meta.video_keys]
    for order, (chunks, files, key) in enumerate(kinds):
        if len(chunks) == 0:
            continue
        starts = np.flatnonzero((chunks[1:] != chunks[:-1]) | (files[1:] != files[:-1])) + 1
        starts = np.concatenate([[0], starts])
        seen: set[tuple[int, int]] = set()
        for episode, chunk, file in zip(
            starts.tolist(), chunks[starts].tolist(), files[starts].tolist(), strict=True
        ):
            if (chunk, file) in seen:
                continue
            seen.add((chunk, file))
            path = meta.data_file(episode) if key is None else meta.video_file(episode, key)
            if path not in listed:
                missing.append((episode, order, path))
                break  # later runs of this kind start at later episodes
    if missing:
        episode, _, path = min(missing)
        raise MetadataError(f"episode {episode} needs {path}, which is missing from {meta.source.url}")


# -- episode selection -------------------------------------------------------------------


def select_episodes(meta: DatasetMeta, episodes: Sequence[int] | None) -> list[int]:
    """The episode indices to read, in LeRobot's way.

    ``None`` selects every episode. Out-of-range indices are dropped with a warning (as
    LeRobot's ``resolve_episode_indices`` does); duplicates are an error; an empty result is
    an error naming the dataset.
    """
    total = len(meta.episodes)
    if episodes is None:
        return list(range(total))
    chosen = [int(e) for e in episodes]
    if len(set(chosen)) != len(chosen):
        repeated = sorted(e for e, count in collections.Counter(chosen).items() if count > 1)
        raise ConfigError(f"episodes contains duplicates: {repeated}")
    kept = [e for e in chosen if 0 <= e < total]
    if not kept:  # one line: the error names them, a warning before it would say it twice
        raise ConfigError(
            f"no episode selected: {list(episodes)} has no episode of {meta.source.url} ({total} episodes)"
        )
    dropped = [e for e in chosen if not 0 <= e < total]
    if dropped:
        warnings.warn(
            f"episodes {dropped} are not in {meta.source.url} ({total} episodes); they are ignored",
            stacklevel=2,
        )
    return kept
