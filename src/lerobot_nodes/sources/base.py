"""The one interface through which every dataset byte is read.

Readers (metadata, Parquet, MP4 index, clip fetches) never open a dataset file by path;
they ask a :class:`ByteSource`. Local folders, Hub repos, Hub buckets and generic fsspec
stores implement it, so readers stay the same whatever the store.
"""

from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .file_cache import slug
from .ranges import ByteRange

if TYPE_CHECKING:
    from .range_cache import ByteRangeCache

_USERINFO = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@")


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
    #: True for remote stores whose reads may be kept in the node-local disk byte cache
    #: (:mod:`.range_cache`); a local folder is never cached.
    caches_bytes: bool = False
    byte_cache: ByteRangeCache | None = None

    def __init__(self) -> None:
        self.stats = ReadStats()
        self._stats_lock = threading.Lock()
        self.byte_cache = None

    def use_byte_cache(self, cache: ByteRangeCache | None) -> None:
        """Read remote ranges through ``cache`` from now on (``None``: no cache). Ignored by sources
        that are never cached (:attr:`caches_bytes`)."""
        self.byte_cache = cache if self.caches_bytes else None

    def byte_identity(self, path: str) -> str | None:
        """What names the content of ``path`` in the byte cache (source, path, revision, fingerprint,
        size), or ``None`` when it has none and must not be cached."""
        if not self.has_stable_identity:
            return None
        info = self.info(path)
        if info.fingerprint is None:
            return None
        return "\0".join((self.url, path, self.revision or "", info.fingerprint, str(info.size)))

    @property
    def byte_cache_group(self) -> str:
        """The byte cache's folder of this source's files (what ``lerobot-nodes cache list`` shows)."""
        return slug(_USERINFO.sub(r"\g<scheme>", self.url).split("://", 1)[-1])

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
        """The whole content of a (small) file (payload files through the byte cache; ``meta/``
        files have their own cache)."""
        if self.byte_cache is not None and not path.startswith("meta/"):
            identity = self.byte_identity(path)
            if identity is not None:
                size = self.info(path).size
                return self.byte_cache.read(self.byte_cache_group, identity, size, [(0, size)], self._counted(path))[0]
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
        if self.byte_cache is not None:
            identity = self.byte_identity(path)
            if identity is not None:
                size = self.info(path).size
                if all(end <= size for _, end in ranges):  # else the store names the file in its error
                    return self.byte_cache.read(self.byte_cache_group, identity, size, ranges, self._counted(path))
        return self._counted(path)(ranges)

    def _counted(self, path: str) -> Callable[[list[ByteRange]], list[bytes]]:
        """``_read_ranges`` of ``path``, each call counted as one request to the store."""

        def read(ranges: list[ByteRange]) -> list[bytes]:
            chunks = self._read_ranges(path, ranges)
            self._count(1, sum(len(c) for c in chunks))
            return chunks

        return read

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return self.read_ranges(path, [(start, end)])[0]

    def advise(self, path: str, ranges: Sequence[ByteRange]) -> None:
        """A hint that ``ranges`` of ``path`` will be read soon: a store that can start fetching them
        in the background does (a local file: the kernel reads them ahead); others ignore it. Never
        reads, counts or raises: a missing file or a range past its end is found by the read itself."""
        return None

    @abstractmethod
    def _read_file(self, path: str) -> bytes: ...

    @abstractmethod
    def _read_ranges(self, path: str, ranges: list[ByteRange]) -> list[bytes]: ...

    def add_stats(self, stats: ReadStats) -> None:
        """Count reads made for this source by a copy of it elsewhere (a forked process)."""
        with self._stats_lock:
            self.stats.requests += stats.requests
            self.stats.bytes_read += stats.bytes_read
            self.stats.whole_file_reads += stats.whole_file_reads

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
