"""A read-only file object made of byte ranges fetched ahead of time.

Libraries such as pyarrow read a file through ``seek``/``read`` calls. Serving those from
ranges fetched in one batch (``ByteSource.read_ranges``) keeps remote reads to one round
trip, and a read outside the fetched ranges is an error rather than a hidden request.
"""

from __future__ import annotations

import bisect
import io


class SparseFile(io.RawIOBase):
    """A file of ``size`` bytes of which only ``ranges`` (``{start: bytes}``) are known."""

    def __init__(self, name: str, size: int, ranges: dict[int, bytes]) -> None:
        super().__init__()
        self.name = name
        self._size = size
        self._starts = sorted(ranges)
        self._chunks = [ranges[s] for s in self._starts]
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._position = offset
        elif whence == io.SEEK_CUR:
            self._position += offset
        elif whence == io.SEEK_END:
            self._position = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        return self._position

    def size(self) -> int:
        return self._size

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        wanted = min(len(buffer), self._size - self._position)
        if wanted <= 0:
            return 0
        data = self._read_at(self._position, wanted)
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)

    def _read_at(self, position: int, length: int) -> bytes:
        index = bisect.bisect_right(self._starts, position) - 1
        if index >= 0:
            start = self._starts[index]
            chunk = self._chunks[index]
            if position + length <= start + len(chunk):
                return chunk[position - start : position - start + length]
        raise OSError(f"{self.name}: bytes [{position}, {position + length}) were not fetched")
