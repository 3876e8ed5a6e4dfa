"""The one interface through which every dataset byte is read.

Readers (metadata, Parquet, MP4 index, clip fetches) never open a dataset file by path;
they ask a :class:`ByteSource`. Local folders, Hub repos, Hub buckets and generic fsspec
stores implement it, so readers stay the same whatever the store.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from .ranges import ByteRange


@dataclass(frozen=True)
class FileInfo:
    """What a store says about one file.

    ``fingerprint`` is a content identity (hash, ETag, Xet hash, or for local files a
    size+mtime+inode token) or ``None`` when the store offers none.
    """

    path: str
    size: int
    fingerprint: str | None = None


@dataclass
class ReadStats:
    """Counters of what a source has read: requests (round trips) and bytes."""

    requests: int = 0
    bytes_read: int = 0
    whole_file_reads: int = 0


class ByteSource(ABC):
    """Read-only access to the files of one dataset root.

    Paths are POSIX paths relative to the dataset root (``meta/info.json``). Implementations
    must be safe to call from several threads at once and picklable (DataLoader workers
    receive a copy), re-opening any connection lazily after unpickling.
    """

    #: True when ``FileInfo.fingerprint`` changes whenever a file's content changes, so
    #: indexes derived from a file can be reused across opens.
    has_stable_identity: bool = True

    def __init__(self) -> None:
        self.stats = ReadStats()
        self._stats_lock = threading.Lock()

    # -- description ------------------------------------------------------------------
    @property
    @abstractmethod
    def url(self) -> str:
        """Where the dataset lives (a folder, ``hf://...`` URL, ...), without credentials."""

    @property
    def revision(self) -> str | None:
        """The pinned revision (commit) of the store, if it has one."""
        return None

    def published_sidecar_source(self) -> ByteSource | None:
        """Where maintainers publish verified sidecars (``meta/mp4-sidecars/``): the dataset root
        itself, except for Hub repos (their ``lerobot-sidecars`` branch); ``None`` when absent."""
        return self

    # -- listing ----------------------------------------------------------------------
    @abstractmethod
    def list_files(self, prefix: str = "") -> list[FileInfo]:
        """Every file under ``prefix`` (recursively), sorted by path."""

    @abstractmethod
    def info(self, path: str) -> FileInfo:
        """Size and identity of one file; raises :class:`SourceFileNotFoundError`."""

    def exists(self, path: str) -> bool:
        try:
            self.info(path)
        except FileNotFoundError:
            return False
        return True

    # -- reading ----------------------------------------------------------------------
    def read_file(self, path: str) -> bytes:
        """The whole content of a (small) file."""
        data = self._read_file(path)
        self._count(1, len(data), whole=True)
        return data

    def read_ranges(self, path: str, ranges: Sequence[ByteRange]) -> list[bytes]:
        """The bytes of each ``(start, end)`` range of ``path``, in the order asked.

        All ranges are sent in one round trip where the store allows it. A range that
        reaches past the end of the file raises :class:`SourceError` naming the file.
        """
        ranges = [(int(start), int(end)) for start, end in ranges]
        for start, end in ranges:
            if start < 0 or end < start:
                raise ValueError(f"invalid byte range ({start}, {end}) for {path}")
        chunks = self._read_ranges(path, ranges)
        self._count(1, sum(len(c) for c in chunks))
        return chunks

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return self.read_ranges(path, [(start, end)])[0]

    @abstractmethod
    def _read_file(self, path: str) -> bytes: ...

    @abstractmethod
    def _read_ranges(self, path: str, ranges: list[ByteRange]) -> list[bytes]: ...

    def _count(self, requests: int, nbytes: int, whole: bool = False) -> None:
        with self._stats_lock:
            self.stats.requests += requests
            self.stats.bytes_read += nbytes
            if whole:
                self.stats.whole_file_reads += 1

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_stats_lock", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._stats_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
