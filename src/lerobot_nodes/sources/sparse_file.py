"""A read-only file object made of byte ranges fetched ahead of time.

Libraries such as pyarrow read a file through ``seek``/``read`` calls. Serving those from
ranges fetched in one batch (``ByteSource.read_ranges``) keeps remote reads to one round
trip, and a read outside the fetched ranges is an error rather than a hidden request.
"""

from __future__ import annotations

import bisect

from .random_access_file import RandomAccessFile


class SparseFile(RandomAccessFile):
    """A file of ``size`` bytes of which only ``ranges`` (``{start: bytes}``) are known."""

    def __init__(self, name: str, size: int, ranges: dict[int, bytes]) -> None:
        super().__init__(name, size)
        self._starts = sorted(ranges)
        self._chunks = [ranges[s] for s in self._starts]

    def _read_at(self, position: int, length: int) -> bytes:
        index = bisect.bisect_right(self._starts, position) - 1
        if index >= 0:
            start = self._starts[index]
            chunk = self._chunks[index]
            if position + length <= start + len(chunk):
                return chunk[position - start : position - start + length]
        raise OSError(f"{self.name}: bytes [{position}, {position + length}) were not fetched")
