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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import MetadataError
from ..sources import ByteRange, ByteSource, FileInfo
from ..sources.ranges import coalesce

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


def column_chunk_range(metadata: pq.FileMetaData, group: int, column: int) -> ByteRange:
    """The bytes of one column chunk of one row group: its dictionary page (if any) and data pages."""
    return chunk_byte_range(metadata.row_group(group).column(column))


def chunk_byte_range(chunk: pq.ColumnChunkMetaData) -> ByteRange:
    """The bytes of one column chunk (see :func:`column_chunk_range`)."""
    start = chunk.data_page_offset
    if (
        chunk.has_dictionary_page
        and chunk.dictionary_page_offset is not None
        and chunk.dictionary_page_offset > 0
    ):
        start = min(start, chunk.dictionary_page_offset)
    return (start, start + chunk.total_compressed_size)


def fetch_footer_tail(source: ByteSource, path: str, size: int, guess: int = _FOOTER_GUESS) -> tuple[int, bytes]:
    """Where the fetched tail of ``path`` (``size`` bytes) starts, and the tail, which ends with the
    whole footer.

    One range read of the last ``guess`` bytes; a footer longer than that is then read exactly (a
    second read, of the part the first one missed). Raises :class:`ValueError` naming ``path`` and
    what is wrong with it (callers give it their error type).
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
        missed = source.read_range(path, footer_start, tail_start)
        if len(missed) != tail_start - footer_start:
            raise ValueError(f"{path}: read {len(missed)} bytes of its footer's first {tail_start - footer_start}")
        return footer_start, missed + tail
    return tail_start, tail


def read_footer_tail(
    source: ByteSource, path: str, size: int, guess: int = _FOOTER_GUESS
) -> tuple[pq.FileMetaData, int, bytes]:
    """The parsed footer of ``path`` (``size`` bytes), where the fetched tail starts, and the tail
    (which ends with the footer): :func:`fetch_footer_tail`, then the footer parsed alone, framed as
    a file of its own, so pyarrow makes no speculative read of bytes that were not fetched. Raises
    :class:`ValueError` naming ``path`` and what is wrong with it.
    """
    tail_start, tail = fetch_footer_tail(source, path, size, guess)
    footer_length = struct.unpack("<I", tail[-8:-4])[0]
    footer = tail[len(tail) - 8 - footer_length : len(tail) - 8]
    framed = _PARQUET_MAGIC + footer + struct.pack("<I", footer_length) + _PARQUET_MAGIC
    try:
        metadata = pq.ParquetFile(pa.BufferReader(framed)).metadata
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{path}: malformed Parquet footer: {exc}") from None
    return metadata, tail_start, tail


class _FetchedBytes:
    """A file of ``size`` bytes of which only the fetched pieces are known, as one in-memory buffer.

    pyarrow reads the column chunks from memory without calling back into Python (a Python file
    object takes the GIL for every read: ~1,800 reads per LeRobot episodes file of 100 row groups).
    The pieces are the chunks of the columns asked for, computed from the same footer pyarrow
    reads them by, so it never reads the zeros in between; those pages are never touched either
    (``np.zeros`` maps them lazily), so only the fetched bytes take memory.
    """

    def __init__(self, size: int) -> None:
        self._bytes = np.zeros(size, dtype=np.uint8)
        self.buffer = pa.py_buffer(self._bytes)

    def put(self, start: int, piece: bytes) -> None:
        self._bytes[start : start + len(piece)] = np.frombuffer(piece, dtype=np.uint8)


def _open_reader(buffer: pa.Buffer) -> pq.ParquetReader:
    """A Parquet reader over ``buffer``, its footer parsed there (in C++, without the GIL).

    ``pq.ParquetReader`` rather than ``pq.ParquetFile``: the file wrapper adds, per file, a
    Python index of every leaf's dotted path and a footer parse of its own when given none; at
    1,000 episodes files of 21,700 column chunks each that is seconds of GIL-held work."""
    reader = pq.ParquetReader()
    reader.open(pa.BufferReader(buffer), pre_buffer=False)
    return reader


def _leaves_of(reader: pq.ParquetReader, columns: Sequence[str]) -> list[int]:
    """The file's leaf-column indices under the top-level fields ``columns``, in file order (the
    leaves ``ParquetFile.read(columns=...)`` reads: the file's own column paths, no guessing)."""
    wanted = set(columns)
    return [i for i, leaf_path in enumerate(reader.column_paths) if leaf_path[0] in wanted]


def _fetch_footer(source: ByteSource, path: str, size: int, fetched: _FetchedBytes) -> int:
    """Put the file's tail, ending with its whole footer, into ``fetched``; return where it starts
    (:func:`fetch_footer_tail`)."""
    tail_start, tail = fetch_footer_tail(source, path, size)
    fetched.put(tail_start, tail)
    return tail_start


def read_columns(
    source: ByteSource,
    path: str,
    columns: Sequence[str],
    *,
    size: int | None = None,
    whole_file: bool = False,
    read_next: FileInfo | None = None,
) -> ColumnRead:
    """The top-level ``columns`` of ``path`` that it has, in file order, reading only their bytes.

    ``size`` is the file's size if the caller knows it (saves an ``info`` call). The footer is
    parsed once, from the fetched bytes. ``read_next``: the file this reader reads after this one;
    once this footer is fetched the source is advised of that file's tail, as long as this one's
    (files of one table have footers of about one size), so a local disk reads it while this
    one is parsed.
    """
    if whole_file:
        raw = source.read_file(path)
        try:
            reader = _open_reader(pa.py_buffer(raw))
            schema = reader.schema_arrow
            table = reader.read_all(column_indices=_leaves_of(reader, columns), use_threads=False)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise _unreadable(source, path, exc) from None
        return ColumnRead(table=table, schema=schema, bytes_fetched=len(raw))

    size = source.info(path).size if size is None else size
    # One buffer of the file's size holds what was fetched, at its offsets (see _FetchedBytes): the
    # tail first, from which the reader parses the footer, then the wanted column chunks.
    fetched = _FetchedBytes(size)
    try:
        tail_start = _fetch_footer(source, path, size, fetched)
    except ValueError as error:
        raise _unreadable(source, path, error) from None
    tail_length = size - tail_start
    if read_next is not None:
        source.advise(read_next.path, [(max(0, read_next.size - tail_length), read_next.size)])
    try:
        reader = _open_reader(fetched.buffer)
        schema = reader.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(source, path, exc) from None
    # Not metadata.schema: that makes a FileMetaData <-> ParquetSchema reference cycle, which
    # keeps the (large) parsed footer alive until the next garbage collection.
    metadata = reader.metadata
    leaves = _leaves_of(reader, columns)
    ranges = coalesce(
        [
            chunk_byte_range(group.column(c))
            for group in map(metadata.row_group, range(metadata.num_row_groups))  # one wrapper per row group
            for c in leaves
        ]
    )
    del metadata
    # Ranges inside the tail already fetched need no second read.
    to_fetch = [(start, end) for start, end in ranges if start < tail_start]
    chunks = source.read_ranges(path, to_fetch) if to_fetch else []
    fetched_bytes = tail_length + sum(map(len, chunks))
    for (start, _), chunk in zip(to_fetch, chunks, strict=True):
        fetched.put(start, chunk)
    del chunks
    try:
        table = reader.read_all(column_indices=leaves, use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(source, path, exc) from None
    return ColumnRead(table=table, schema=schema, bytes_fetched=fetched_bytes)
