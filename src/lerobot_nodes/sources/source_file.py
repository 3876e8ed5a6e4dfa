"""A seekable file object over one file of a :class:`ByteSource`, read lazily by range.

For libraries that want a file (``av.open``). Wrap in ``io.BufferedReader`` so that small
reads are served from a buffer instead of one range request each.
"""

from __future__ import annotations

import io

from .base import ByteSource


class SourceFile(io.RawIOBase):
    """Raw, read-only view of ``path`` in ``source``."""

    def __init__(self, source: ByteSource, path: str, size: int | None = None) -> None:
        super().__init__()
        self.source = source
        self.name = path
        self._size = source.info(path).size if size is None else size
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        end = min(self._position + len(buffer), self._size)
        if end <= self._position:
            return 0
        data = self.source.read_range(self.name, self._position, end)
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)


def open_buffered(source: ByteSource, path: str, buffer_size: int = 1 << 20) -> io.BufferedReader:
    """``path`` of ``source`` as a buffered binary file object."""
    return io.BufferedReader(SourceFile(source, path), buffer_size=buffer_size)
