"""Chosen columns of a small Parquet file, reading only their bytes through a ByteSource.

``meta/episodes`` files carry ~200 per-episode ``stats/...`` columns next to the ~20 a reader
needs. :func:`read_columns` reads the footer (the file's last 64 KiB, then the footer exactly if
it is longer), then fetches only the column chunks of the wanted columns in one
``read_ranges`` call and decodes just those. Of the other columns at most the data inside that
first 64 KiB tail is fetched. Columns a file lacks are left out of the result
(the caller decides which are required). ``whole_file=True`` reads the file with one
``read_file`` instead (sources that keep whole ``meta/`` files in a local cache) and still
decodes only the wanted columns.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import MetadataError
from ..sources import ByteRange, ByteSource
from ..sources.ranges import coalesce
from ..sources.sparse_file import SparseFile

_FOOTER_GUESS = 64 * 1024
_PARQUET_MAGIC = b"PAR1"


@dataclass(frozen=True)
class ColumnRead:
    """The decoded columns and what reading them cost."""

    table: pa.Table
    schema: pa.Schema
    """The file's whole Arrow schema (every column, read or not)."""
    bytes_fetched: int


def _unreadable(source: ByteSource, path: str, why: object) -> MetadataError:
    return MetadataError(f"{path} in {source.url} is not a readable Parquet file: {why}")


def leaf_count(kind: pa.DataType) -> int:
    """How many Parquet leaf columns an Arrow field of type ``kind`` is stored as."""
    if pa.types.is_struct(kind):
        return sum(leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return leaf_count(kind.key_type) + leaf_count(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return leaf_count(kind.value_type)
    if isinstance(kind, pa.BaseExtensionType):
        return leaf_count(kind.storage_type)
    return 1


def leaf_columns(schema: pa.Schema, names: Sequence[str]) -> list[int]:
    """Parquet leaf-column indices of the top-level fields ``names`` (leaves are stored depth
    first, in field order)."""
    wanted = set(names)
    leaves: list[int] = []
    position = 0
    for field in schema:
        count = leaf_count(field.type)
        if field.name in wanted:
            leaves.extend(range(position, position + count))
        position += count
    return leaves


def column_chunk_range(metadata: pq.FileMetaData, group: int, column: int) -> ByteRange:
    """The bytes of one column chunk of one row group: its dictionary page (if any) and data pages."""
    chunk = metadata.row_group(group).column(column)
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None and chunk.dictionary_page_offset > 0:
        start = min(start, chunk.dictionary_page_offset)
    return (start, start + chunk.total_compressed_size)


def read_footer_tail(source: ByteSource, path: str, size: int, guess: int = _FOOTER_GUESS) -> tuple[pq.FileMetaData, int, bytes]:
    """The parsed footer of ``path`` (``size`` bytes), where the fetched tail starts, and the tail
    (which ends with the footer).

    One range read of the last ``guess`` bytes; a footer longer than that is then read exactly (a
    second read, of the part the first one missed). The footer is parsed alone, framed as a file of
    its own, so pyarrow makes no speculative read of bytes that were not fetched. Raises
    :class:`ValueError` naming ``path`` and what is wrong with it (callers give it their error type).
    """
    if size < 12:
        raise ValueError(f"{path} is too small to be a Parquet file ({size} bytes)")
    tail_start = max(0, size - guess)
    tail = source.read_range(path, tail_start, size)
    if len(tail) != size - tail_start:
        raise ValueError(f"{path}: read {len(tail)} bytes of its last {size - tail_start}")
    if tail[-4:] != _PARQUET_MAGIC:
        raise ValueError(f"{path} is not a Parquet file (no PAR1 magic at its end)")
    footer_length = struct.unpack("<I", tail[-8:-4])[0]
    footer_start = size - 8 - footer_length
    if footer_start < 4:
        raise ValueError(f"{path}: Parquet footer length {footer_length} does not fit in {size} bytes")
    if footer_start < tail_start:
        tail = source.read_range(path, footer_start, tail_start) + tail
        tail_start = footer_start
    footer = tail[footer_start - tail_start : size - 8 - tail_start]
    framed = _PARQUET_MAGIC + footer + struct.pack("<I", footer_length) + _PARQUET_MAGIC
    try:
        metadata = pq.ParquetFile(pa.BufferReader(framed)).metadata
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{path}: malformed Parquet footer: {exc}") from None
    return metadata, tail_start, tail


def read_columns(
    source: ByteSource, path: str, columns: Sequence[str], *, size: int | None = None, whole_file: bool = False
) -> ColumnRead:
    """The top-level ``columns`` of ``path`` that it has, in file order, reading only their bytes.

    ``size`` is the file's size if the caller knows it (saves an ``info`` call).
    """
    if whole_file:
        raw = source.read_file(path)
        try:
            parquet = pq.ParquetFile(pa.BufferReader(raw))
            schema = parquet.schema_arrow
            present = [name for name in schema.names if name in set(columns)]
            table = parquet.read(columns=present, use_threads=False)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise _unreadable(source, path, exc) from None
        return ColumnRead(table=table, schema=schema, bytes_fetched=len(raw))

    size = source.info(path).size if size is None else size
    try:
        metadata, tail_start, tail = read_footer_tail(source, path, size)
    except ValueError as error:
        raise _unreadable(source, path, error) from None
    try:
        # Not metadata.schema: that makes a FileMetaData <-> ParquetSchema reference cycle,
        # which keeps the (large) parsed footer alive until the next garbage collection.
        schema = pq.ParquetFile(SparseFile(path, size, {tail_start: tail}), metadata=metadata).schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(source, path, exc) from None
    wanted = set(columns)
    present = [name for name in schema.names if name in wanted]
    leaves = leaf_columns(schema, present)
    if sum(leaf_count(f.type) for f in schema) != metadata.num_columns:
        # A schema whose leaves do not add up: read the file whole rather than guess.
        return read_columns(source, path, columns, whole_file=True)
    ranges = coalesce(
        [column_chunk_range(metadata, g, c) for g in range(metadata.num_row_groups) for c in leaves]
    )
    # Ranges inside the tail already fetched need no second read.
    to_fetch = [(start, end) for start, end in ranges if start < tail_start]
    chunks = source.read_ranges(path, to_fetch) if to_fetch else []
    known = dict(zip((start for start, _ in to_fetch), chunks, strict=True))
    known[tail_start] = tail
    try:
        parquet = pq.ParquetFile(SparseFile(path, size, known), metadata=metadata, pre_buffer=False)
        table = parquet.read(columns=present, use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(source, path, exc) from None
    return ColumnRead(table=table, schema=schema, bytes_fetched=sum(map(len, chunks)) + len(tail))
