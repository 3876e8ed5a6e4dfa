"""Whole-episode tables from data Parquet files, read by byte range.

An episode's rows are found by pruning row groups with their ``episode_index`` statistics
(LeRobot writes one row group per episode), fetching only the surviving column chunks in one
round trip, then filtering to the episode. Row groups without statistics stay candidates,
so a file without useful bounds is read whole. The footer of each file is read once.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import MetadataError
from ..sources import ByteRange, ByteSource
from ..sources.ranges import coalesce
from ..sources.sparse_file import SparseFile
from .episode_data import EpisodeData, episode_data_from_table
from .meta import DatasetMeta

_FOOTER_GUESS = 64 * 1024
_PARQUET_MAGIC = b"PAR1"


@dataclass(frozen=True)
class ParquetFooter:
    """The parsed footer of one Parquet file and where it sits."""

    path: str
    size: int
    metadata: pq.FileMetaData
    footer_start: int
    footer_bytes: bytes
    """``footer_bytes`` is the file's tail from ``footer_start``: the footer and what precedes it."""


@dataclass(frozen=True)
class EpisodeRowsPlan:
    """What to fetch to read one episode: row groups and their byte ranges."""

    path: str
    row_groups: list[int]
    byte_ranges: list[ByteRange]

    @property
    def size(self) -> int:
        return sum(end - start for start, end in self.byte_ranges)


class EpisodeTableReader:
    """Reads one episode's rows of a dataset; thread-safe, footers cached per file."""

    def __init__(self, source: ByteSource, meta: DatasetMeta) -> None:
        self.source = source
        self.meta = meta
        self._footers: dict[str, ParquetFooter] = {}
        self._lock = threading.Lock()

    def footer(self, path: str) -> ParquetFooter:
        with self._lock:
            cached = self._footers.get(path)
        if cached is not None:
            return cached
        footer = read_footer(self.source, path)
        with self._lock:
            self._footers[path] = footer
        return footer

    def plan(self, episode: int) -> EpisodeRowsPlan:
        """Row groups that may hold ``episode`` and the coalesced byte ranges of their columns."""
        path = self.meta.data_file(episode)
        footer = self.footer(path)
        groups = candidate_row_groups(footer.metadata, episode)
        ranges = coalesce([column_chunk_range(footer.metadata, g, c) for g in groups for c in range(footer.metadata.num_columns)])
        return EpisodeRowsPlan(path=path, row_groups=groups, byte_ranges=ranges)

    def read(self, episode: int, plan: EpisodeRowsPlan | None = None, chunks: list[bytes] | None = None) -> EpisodeData:
        """The episode's rows; ``chunks`` are the fetched bytes of ``plan.byte_ranges`` if already read."""
        plan = plan or self.plan(episode)
        if chunks is None:
            chunks = self.source.read_ranges(plan.path, plan.byte_ranges)
        footer = self.footer(plan.path)
        return self.decode(episode, plan, chunks, footer)

    def decode(self, episode: int, plan: EpisodeRowsPlan, chunks: list[bytes], footer: ParquetFooter) -> EpisodeData:
        ranges = {start: chunk for (start, _), chunk in zip(plan.byte_ranges, chunks, strict=False)}
        ranges[footer.footer_start] = footer.footer_bytes
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
    rows = table.filter(pc.equal(table.column("episode_index"), episode))
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
    """Parse the footer of ``path`` with one range read (two if the footer is large)."""
    size = source.info(path).size
    if size < 12:
        raise MetadataError(f"{path} is too small to be a Parquet file ({size} bytes)")
    tail_start = max(0, size - _FOOTER_GUESS)
    tail = source.read_range(path, tail_start, size)
    if tail[-4:] != _PARQUET_MAGIC:
        raise MetadataError(f"{path} is not a Parquet file (no PAR1 magic at its end)")
    footer_length = struct.unpack("<I", tail[-8:-4])[0]
    footer_start = size - 8 - footer_length
    if footer_start < 4:
        raise MetadataError(f"{path}: Parquet footer length {footer_length} does not fit in {size} bytes")
    if footer_start < tail_start:
        tail = source.read_range(path, footer_start, size)
        tail_start = footer_start
    # pyarrow reads a speculative 64 KiB tail, so keep the whole tail, not just the footer.
    footer_bytes = tail
    footer_start = tail_start
    sparse = SparseFile(path, size, {footer_start: footer_bytes})
    try:
        metadata = pq.ParquetFile(sparse).metadata
    except (pa.ArrowException, OSError) as exc:
        raise MetadataError(f"{path}: malformed Parquet footer: {exc}") from None
    return ParquetFooter(path=path, size=size, metadata=metadata, footer_start=footer_start, footer_bytes=footer_bytes)


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


def column_chunk_range(metadata: pq.FileMetaData, group: int, column: int) -> ByteRange:
    chunk = metadata.row_group(group).column(column)
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None and chunk.dictionary_page_offset > 0:
        start = min(start, chunk.dictionary_page_offset)
    return (start, start + chunk.total_compressed_size)
