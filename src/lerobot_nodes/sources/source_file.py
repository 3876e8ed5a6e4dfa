"""A seekable file object over one file of a :class:`ByteSource`, read lazily by range.

For libraries that want a file (``av.open``). Wrap in ``io.BufferedReader`` so that small
reads are served from a buffer instead of one range request each.
"""

from __future__ import annotations

import io

from .base import ByteSource
from .random_access_file import RandomAccessFile


class SourceFile(RandomAccessFile):
    """Raw, read-only view of ``path`` in ``source``."""

    def __init__(self, source: ByteSource, path: str, size: int | None = None) -> None:
        super().__init__(path, source.info(path).size if size is None else size)
        self.source = source

    def _read_at(self, position: int, length: int) -> bytes:
        return self.source.read_range(self.name, position, position + length)


def open_buffered(source: ByteSource, path: str, buffer_size: int = 1 << 20) -> io.BufferedReader:
    """``path`` of ``source`` as a buffered binary file object."""
    return io.BufferedReader(SourceFile(source, path), buffer_size=buffer_size)
