"""A remote store whose files are listed once at open and read by HTTP range.

The listing taken at open is the run's view of the store: sizes and content identities come
from it, and every read is checked against it. Small files under ``meta/`` are kept in a
local :class:`FileCache` keyed by their content identity, so a second open of the same
content reads none of them again, and one process of the node reads each (the others wait for
it). With a :class:`~.node_cache.LocationStore`, each file's redirect target is shared by the node.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path

from .base import ByteRange, ByteSource, FileInfo
from .file_cache import FileCache
from .http_range import HttpOptions, HttpRangeReader, HttpStats
from .listing import FileListing
from .node_cache import LocationStore

CACHED_PREFIX = "meta/"


class ListedHttpSource(ByteSource):
    """Files from a listing taken at open, payload from ``file_url(path)`` by native range reads."""

    has_stable_identity = True
    caches_bytes = True

    def __init__(
        self, files: list[FileInfo], credentials: Callable[[str], Mapping[str, str]], http: HttpOptions | None,
        cache_folder: Path | None,
        locations: LocationStore | None = None,
    ) -> None:
        super().__init__()
        self._listing = FileListing(files, self.url)  # subclasses know their url before calling this
        self.credentials = credentials
        self._locations = locations
        self.reader = HttpRangeReader(http, credentials, locations)
        self._cache = FileCache(cache_folder) if cache_folder is not None else None

    def _add_api_stats(self, stats: HttpStats) -> None:
        """Count the API requests (and their 429 retries) the subclass made at open in :attr:`http_stats`."""
        mine = self.reader.stats
        mine.api_requests += stats.api_requests
        mine.retries += stats.retries
        mine.rate_limited += stats.rate_limited

    @abstractmethod
    def file_url(self, path: str) -> str:
        """The URL a payload read of ``path`` goes to."""

    @property
    def http_stats(self) -> HttpStats:
        return self.reader.stats

    def set_http_options(self, options: HttpOptions) -> None:
        """Use ``options`` from now on (each DataLoader worker sets its share of connections).

        The counts carry over, so :attr:`http_stats` stays every request of this source in this
        process (with no workers: the dataset's index open included).
        """
        stats = self.reader.stats
        self.reader.close()
        self.reader = HttpRangeReader(options, self.credentials, getattr(self, "_locations", None))
        self.reader.stats = stats

    def list_files(self, prefix: str = "") -> list[FileInfo]:
        return self._listing.under(prefix)

    def info(self, path: str) -> FileInfo:
        return self._listing.info(path)

    def _read_file(self, path: str) -> bytes:
        info = self.info(path)
        def fetch() -> bytes:
            return self.reader.read_all(self.file_url(path), size=info.size, name=self._name(path),
                                        identity=info.fingerprint)

        if self._cache is None or info.fingerprint is None or not path.startswith(CACHED_PREFIX):
            return fetch()
        return self._cache.get_or_fetch(path, info.fingerprint, fetch, lambda data: len(data) == info.size)

    def _read_ranges(self, path: str, ranges: list[ByteRange]) -> list[bytes]:
        info = self.info(path)
        return self.reader.read_ranges(self.file_url(path), ranges, size=info.size, name=self._name(path),
                                       identity=info.fingerprint)

    def _name(self, path: str) -> str:
        return f"{self.url.rstrip('/')}/{path}"
