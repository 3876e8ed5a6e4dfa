"""The seek/read plumbing shared by the read-only file objects of this package."""

from __future__ import annotations

import io


class RandomAccessFile(io.RawIOBase):
    """A read-only, seekable raw file of ``size`` bytes; subclasses say how to read at a position."""

    def __init__(self, name: str, size: int) -> None:
        super().__init__()
        self.name = name
        self._size = size
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def size(self) -> int:
        return self._size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence not in (io.SEEK_SET, io.SEEK_CUR, io.SEEK_END):
            raise ValueError(f"invalid whence {whence}")
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        wanted = min(len(buffer), self._size - self._position)
        if wanted <= 0:
            return 0
        data = self._read_at(self._position, wanted)
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)

    def _read_at(self, position: int, length: int) -> bytes:
        raise NotImplementedError
