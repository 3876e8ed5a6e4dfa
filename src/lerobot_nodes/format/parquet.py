"""Whole-episode tables from data Parquet files, read by byte range.

An episode's rows are found by pruning row groups with their ``episode_index`` statistics
(a row group may hold one episode or the end of one and the start of the next, as LeRobot's
writers produce), fetching only the surviving column chunks in one round trip, then filtering
to the episode. Row groups without statistics stay candidates, so a file without useful bounds
is read whole. The footer of each file is read once and exactly: its 8-byte trailer, then the
footer itself (row-group bytes a tail read may hold are served from it, never read again).

Plans list each row group's byte ranges (:attr:`EpisodeRowsPlan.group_ranges`), so a reader of
several episodes can fetch a row group they share once (``fetch.row_groups``); decoding takes
any set of fetched pieces covering the planned row groups.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import MetadataError
from ..sources import ByteRange, ByteSource
from ..sources.ranges import coalesce
from ..sources.sparse_file import SparseFile
from .episode_data import EpisodeData, episode_data_from_table
from .meta import DatasetMeta
from .parquet_columns import column_chunk_range, read_footer_tail

_FOOTER_GUESS = 8
"""Tail bytes read first to find the footer: the footer length and magic only, so the second read
is exactly the footer. A larger guess would save that round trip but read row-group bytes that
each reader of the file (every DataLoader worker) pays for again, needed or not; what a larger
guess does hold of row groups is served from it (:meth:`ParquetFooter.unread`), not read again."""


@dataclass(frozen=True)
class ParquetFooter:
    """The parsed footer of one Parquet file and where it sits."""

    path: str
    size: int
    metadata: pq.FileMetaData
    footer_start: int
    footer_bytes: bytes
    """``footer_bytes`` is the file's tail from ``footer_start``: the footer and what precedes it."""

    def known(self, start: int, end: int) -> bytes | None:
        """``[start, end)`` of the file if the tail holds it."""
        if start >= self.footer_start and end <= self.size:
            return self.footer_bytes[start - self.footer_start : end - self.footer_start]
        return None

    def unread(self, byte_range: ByteRange) -> ByteRange | None:
        """The part of ``byte_range`` the tail does not hold (``None``: all of it is held)."""
        start, end = byte_range
        if start >= self.footer_start:
            return None
        return (start, min(end, self.footer_start))


@dataclass(frozen=True)
class EpisodeRowsPlan:
    """What to fetch to read one episode: row groups and their byte ranges."""

    path: str
    row_groups: list[int]
    byte_ranges: list[ByteRange]
    """What to read for this episode alone: the row groups' coalesced ranges, less the footer tail."""
    group_ranges: dict[int, list[ByteRange]] = field(default_factory=dict)
    """Per row group, the coalesced byte ranges of its column chunks (what decoding needs of it)."""

    @property
    def size(self) -> int:
        return sum(end - start for start, end in self.byte_ranges)


class EpisodeTableReader:
    """Reads one episode's rows of a dataset; thread-safe, footers cached per file."""

    def __init__(self, source: ByteSource, meta: DatasetMeta) -> None:
        self.source = source
        self.meta = meta
        self._footers: dict[str, ParquetFooter] = {}
        self._reading: dict[str, Future[ParquetFooter]] = {}
        self._lock = threading.Lock()

    def footer(self, path: str) -> ParquetFooter:
        """The footer of ``path``, read once: concurrent first calls wait for one read (a failed
        read is not kept, so a later call reads again)."""
        with self._lock:
            cached = self._footers.get(path)
            if cached is not None:
                return cached
            pending = self._reading.get(path)
            if pending is None:
                pending = self._reading[path] = Future()
                mine = True
            else:
                mine = False
        if not mine:
            return pending.result()
        try:
            footer = read_footer(self.source, path)
        except BaseException as exc:
            with self._lock:
                del self._reading[path]
            pending.set_exception(exc)
            raise
        with self._lock:
            self._footers[path] = footer
            del self._reading[path]
        pending.set_result(footer)
        return footer

    def plan(self, episode: int) -> EpisodeRowsPlan:
        """Row groups that may hold ``episode`` and the coalesced byte ranges of their columns."""
        path = self.meta.data_file(episode)
        footer = self.footer(path)
        groups = candidate_row_groups(footer.metadata, episode)
        group_ranges = {g: row_group_ranges(footer.metadata, g) for g in groups}
        wanted = [footer.unread(r) for g in groups for r in group_ranges[g]]
        ranges = coalesce([r for r in wanted if r is not None and r[1] > r[0]])
        return EpisodeRowsPlan(path=path, row_groups=groups, byte_ranges=ranges, group_ranges=group_ranges)

    def read(self, episode: int, plan: EpisodeRowsPlan | None = None, chunks: list[bytes] | None = None) -> EpisodeData:
        """The episode's rows; ``chunks`` are the fetched bytes of ``plan.byte_ranges`` if already read."""
        plan = plan or self.plan(episode)
        if chunks is None:
            chunks = self.source.read_ranges(plan.path, plan.byte_ranges) if plan.byte_ranges else []
        footer = self.footer(plan.path)
        return self.decode(episode, plan, chunks, footer)

    def decode(self, episode: int, plan: EpisodeRowsPlan, chunks: list[bytes], footer: ParquetFooter) -> EpisodeData:
        """Decode from ``chunks``, the bytes of ``plan.byte_ranges`` (the footer tail supplies the rest)."""
        pieces = {start: chunk for (start, _), chunk in zip(plan.byte_ranges, chunks, strict=False)}
        return self.decode_pieces(episode, plan, pieces, footer)

    def decode_pieces(
        self, episode: int, plan: EpisodeRowsPlan, pieces: dict[int, bytes], footer: ParquetFooter
    ) -> EpisodeData:
        """Decode from ``pieces`` (``{start: bytes}``, any split, overlaps allowed) that, with the
        footer tail, cover the ranges of every planned row group."""
        ranges = join_pieces({**pieces, footer.footer_start: footer.footer_bytes})
        sparse = SparseFile(plan.path, footer.size, ranges)
        try:
            table = pq.ParquetFile(sparse, metadata=footer.metadata).read_row_groups(plan.row_groups)
        except (pa.ArrowException, OSError) as exc:
            raise MetadataError(f"{plan.path}: cannot read row groups {plan.row_groups} of episode {episode}: {exc}") from None
        return episode_rows(table, self.meta, episode, plan.path)


def episode_rows(table: pa.Table, meta: DatasetMeta, episode: int, path: str) -> EpisodeData:
    """Filter ``table`` to ``episode`` and check the rows match ``meta/episodes``."""
    if "episode_index" not in table.column_names:
        raise MetadataError(f"{path}: column 'episode_index' is missing")
    # A typed scalar: a Python int would be converted by inference, whose first use imports dateutil
    # (3-4 ms, in every worker before its first batch); the comparison is the same (int64).
    rows = table.filter(pc.equal(table.column("episode_index"), pa.scalar(int(episode), pa.int64())))
    start, stop = meta.episode_bounds(episode)
    indices = rows.column("index").to_numpy() if "index" in rows.column_names and rows.num_rows else None
    if rows.num_rows != stop - start or indices is None or int(indices[0]) != start or int(indices[-1]) != stop - 1:
        found = f"rows {int(indices[0])}..{int(indices[-1])}" if indices is not None else "no rows"
        raise MetadataError(
            f"episode {episode}: meta/episodes places its {stop - start} rows [{start}, {stop}) in {path}, "
            f"but that file holds {rows.num_rows} rows of it ({found})"
        )
    return episode_data_from_table(rows, episode, start, path)


def read_footer(source: ByteSource, path: str) -> ParquetFooter:
    """Parse the footer of ``path``: its trailer, then exactly the footer (two range reads)."""
    size = source.info(path).size
    try:
        metadata, tail_start, tail = read_footer_tail(source, path, size, _FOOTER_GUESS)
    except ValueError as error:
        raise MetadataError(str(error)) from None
    # The whole tail is kept: the row-group bytes it holds are served from it.
    return ParquetFooter(path=path, size=size, metadata=metadata, footer_start=tail_start, footer_bytes=tail)


def _episode_column(metadata: pq.FileMetaData) -> int | None:
    for i in range(metadata.num_columns):
        if metadata.schema.column(i).path == "episode_index":
            return i
    return None


def candidate_row_groups(metadata: pq.FileMetaData, episode: int) -> list[int]:
    """Row groups whose ``episode_index`` statistics admit ``episode`` (or that have none)."""
    column = _episode_column(metadata)
    groups = []
    for g in range(metadata.num_row_groups):
        stats = metadata.row_group(g).column(column).statistics if column is not None else None
        if stats is not None and stats.has_min_max and not (stats.min <= episode <= stats.max):
            continue
        groups.append(g)
    return groups


def row_group_ranges(metadata: pq.FileMetaData, group: int) -> list[ByteRange]:
    """The coalesced byte ranges of every column chunk of row group ``group`` (usually one)."""
    return coalesce([column_chunk_range(metadata, group, c) for c in range(metadata.num_columns)])


def join_pieces(pieces: dict[int, bytes]) -> dict[int, bytes]:
    """``{start: bytes}`` with touching or overlapping pieces joined, so a read spanning pieces
    fetched separately (e.g. a column chunk split by the footer tail) finds one contiguous run.
    A piece that touches no other is kept as is (no copy)."""
    runs: list[tuple[int, int, list[tuple[int, bytes]]]] = []  # (start, end, pieces)
    for start in sorted(pieces):
        data = pieces[start]
        end = start + len(data)
        if runs and start <= runs[-1][1]:
            run_start, run_end, members = runs[-1]
            members.append((start, data))
            runs[-1] = (run_start, max(run_end, end), members)
        else:
            runs.append((start, end, [(start, data)]))
    joined: dict[int, bytes] = {}
    for run_start, run_end, members in runs:
        if len(members) == 1:
            joined[run_start] = members[0][1]
            continue
        run = bytearray(run_end - run_start)
        for start, data in members:
            run[start - run_start : start - run_start + len(data)] = data
        joined[run_start] = bytes(run)
    return joined
