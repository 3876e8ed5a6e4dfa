"""Finding, validating, converting and building the sample indexes a dataset open needs.

Lookup order for each requested video file (SPEC §4):

1. a valid record in the local cache entry of the dataset revision;
2. a valid **published** sidecar (``meta/mp4-sidecars/*.npz`` in the dataset root), converted
   into a record;
3. otherwise a local build of that file.

Steps 2 and 3 run while holding the entry's process lock; each record is installed atomically.
A store without stable file identities is indexed in memory at every open and nothing is cached.

Cache layout: ``<root>/g<generation>/<dataset entry>/records/<path hash>-<identity hash>.idx``.
A record's name is derived from the identity of the file it indexes (path, size, fingerprint,
revision, index format), so a replaced video gets a new record while processes that mapped
the old one keep reading it: records are immutable and never invalidated in place.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..atomic import atomic_write, remove_dead_partials
from ..errors import SidecarFormatError
from ..format.meta import DatasetMeta
from ..home import lerobot_home
from ..mp4.index import INDEX_FORMAT_VERSION, VideoIndex
from ..sources import ByteSource, LocalSource
from ..sources.source_file import open_buffered
from .builder import (
    BuildProgress,
    IndexParser,
    current_identities,
    iter_parsed,
    parse_identity,
    parse_video_index,
)
from .derived import DERIVED_GENERATION, MappedRecord, MappedVideoIndex, write_record
from .locking import BuildLock
from .schema import PUBLISHED_DIR, SCHEMA_VERSION, SidecarArchive, SourceIdentity

log = logging.getLogger("lerobot_nodes.sidecar")

_T = TypeVar("_T")
_R = TypeVar("_R")

DEFAULT_LOCK_TIMEOUT_S = 1800.0
CACHE_DIR_NAME = "streaming-indexes"
DEFAULT_BUILD_WORKERS = 4
"""Files indexed at once from a local folder (parsing is CPU work: a few threads suffice)."""
REMOTE_BUILD_WORKERS = 32
"""Files indexed at once from a remote store: indexing one costs two round trips (the head window,
then the exact ``moov``), so the build is latency-bound and needs many files in flight (5,000
files at 50 ms RTT: ~16 s with 32 in flight, ~125 s with 4)."""


def default_build_workers(source: ByteSource) -> int:
    """:data:`DEFAULT_BUILD_WORKERS` for a local folder, :data:`REMOTE_BUILD_WORKERS` for any other store."""
    return DEFAULT_BUILD_WORKERS if isinstance(source, LocalSource) else REMOTE_BUILD_WORKERS


def default_cache_root() -> Path:
    """``$HF_LEROBOT_HOME/streaming-indexes`` (``~/.cache/huggingface/lerobot/streaming-indexes``)."""
    return lerobot_home() / CACHE_DIR_NAME


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


@dataclass
class OpenReport:
    """Where each index of one open came from (for logs, tests and troubleshooting)."""

    reused: list[str] = field(default_factory=list)
    converted: list[str] = field(default_factory=list)
    built: list[str] = field(default_factory=list)
    stale: dict[str, str] = field(default_factory=dict)
    in_memory: bool = False
    lock_wait_s: float = 0.0


class CacheEntry:
    """The records of one dataset revision in one cache generation, and the lock guarding them."""

    def __init__(self, root: Path, key: str) -> None:
        self.directory = root / f"g{DERIVED_GENERATION}" / key
        self.records = self.directory / "records"
        self.lock_path = self.directory / "build.lock"

    @staticmethod
    def key(source: ByteSource, dataset_id: str | None) -> str:
        """A readable, collision-free folder name: the dataset and revision, plus a hash of
        the store's address when there is no pinned revision (local folders)."""
        revision = source.revision
        name = re.sub(r"[^A-Za-z0-9._-]+", "--", dataset_id or Path(source.url.rstrip("/")).name or "dataset")
        material = f"{dataset_id}@{revision}" if dataset_id and revision else f"{dataset_id}@{revision}@{source.url}"
        return f"{name}@{(revision or 'unpinned')[:12]}-{_digest(material, 12)}"

    def record_path(self, identity: SourceIdentity) -> Path:
        identity_text = json.dumps({**identity.to_json(), "index_format": INDEX_FORMAT_VERSION}, sort_keys=True)
        return self.records / f"{_digest(identity.path, 16)}-{_digest(identity_text, 24)}.idx"

    def open_record(self, identity: SourceIdentity) -> tuple[MappedRecord | None, str | None]:
        """The valid record of ``identity``, or ``None`` and why not (``None`` reason: absent)."""
        path = self.record_path(identity)
        try:
            record = MappedRecord.open(path)
        except FileNotFoundError:
            return None, None
        except SidecarFormatError as error:
            return None, f"unusable record: {error}"
        reason = record.identity.mismatch(identity)
        version = record.arrays.get("index_format_version")
        if reason is None and (version is None or int(version) != INDEX_FORMAT_VERSION):
            reason = f"index format {version} is not {INDEX_FORMAT_VERSION}"
        return (None, reason) if reason is not None else (record, None)

    def install(self, identity: SourceIdentity, arrays: Mapping[str, Any], origin: str) -> MappedRecord:
        """Write the record of ``identity`` atomically and map it."""
        path = self.record_path(identity)
        write_record(path, identity, arrays, origin)
        return MappedRecord.open(path)

    def describe(self, dataset_id: str | None, revision: str | None) -> None:
        """Leave a human-readable note of what the entry holds (written once)."""
        note = self.directory / "entry.json"
        if note.exists():
            return
        with contextlib.suppress(OSError), atomic_write(note) as out:
            out.write(json.dumps({"dataset_id": dataset_id, "revision": revision,
                                  "generation": DERIVED_GENERATION}, indent=1).encode())


class PublishedSidecars:
    """The sidecar archives published inside a dataset root, opened lazily by range reads."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self._archives: list[tuple[str, SidecarArchive]] | None = None

    def archives(self) -> list[tuple[str, SidecarArchive]]:
        if self._archives is None:
            self._archives = []
            for info in self.source.list_files(PUBLISHED_DIR):
                if info.path.endswith(".npz"):
                    archive = self._open(info.path)
                    if archive is not None:
                        self._archives.append((info.path, archive))
        return self._archives

    def _open(self, path: str) -> SidecarArchive | None:
        try:
            archive = SidecarArchive(open_buffered(self.source, path, buffer_size=256 * 1024), path)
        except SidecarFormatError as error:
            log.warning("ignoring published sidecar %s: %s; missing indexes are built locally", path, error)
            return None
        version = archive.meta.schema_version
        if version != SCHEMA_VERSION:
            log.warning(
                "published sidecar %s has schema v%d, this reader needs v%d: building the indexes locally into "
                "a separate revision-keyed cache entry. Maintainers: rebuild it with lerobot-build-mp4-sidecar "
                "before publishing again.", path, version, SCHEMA_VERSION,
            )
            return None
        if archive.meta.index_format_version != INDEX_FORMAT_VERSION:
            log.warning("ignoring published sidecar %s: index format %s, this reader needs %d", path,
                        archive.meta.index_format_version, INDEX_FORMAT_VERSION)
            return None
        return archive

    def close(self) -> None:
        for _, archive in self._archives or []:
            archive.close()
        self._archives = None

    def arrays_for(self, identity: SourceIdentity) -> tuple[dict[str, Any], str] | None:
        """The verified arrays of ``identity`` from the first archive that matches it, and that archive."""
        for path, archive in self.archives():
            entry = archive.meta.file(identity.path)
            if entry is None:
                continue
            reason = entry.identity.mismatch(identity)
            if reason is not None:
                log.info("published sidecar %s does not match %s (%s): building it locally", path, identity.path, reason)
                continue
            try:
                arrays = archive.load_arrays(identity.path)
                VideoIndex.from_arrays(arrays)
            except (SidecarFormatError, ValueError) as error:
                log.warning("published sidecar %s has an invalid index of %s (%s): building it locally",
                            path, identity.path, error)
                continue
            return arrays, path
        return None


class SidecarCache:
    """The local index cache: lookup, validation, conversion, locked builds, atomic installs.

    Guarantees of :meth:`open`: every returned index matches the current identity of its file
    in the store; indexes are built only for the requested files; concurrent processes asking
    for the same files build each file at most once (the others wait on the entry lock, up to
    ``lock_timeout_s``); a failed or killed build leaves every installed record intact.
    """

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        lock_timeout_s: float | None = DEFAULT_LOCK_TIMEOUT_S,
        build_workers: int | None = None,
        parser: IndexParser = parse_video_index,
        show_progress: bool | None = None,
    ) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_root()
        self.lock_timeout_s = lock_timeout_s
        if build_workers is not None and build_workers < 1:
            raise ValueError(f"build_workers must be >= 1, got {build_workers}")
        self.build_workers = build_workers
        """Files indexed at once; ``None``: :func:`default_build_workers` of each source."""
        self.parser = parser
        self.show_progress = show_progress

    def open(
        self, source: ByteSource, video_paths: Iterable[str], *, dataset_id: str | None = None
    ) -> tuple[dict[str, VideoIndex], OpenReport]:
        """Indexes of ``video_paths`` (paths relative to the dataset root) and how they were obtained."""
        paths = sorted(set(video_paths))
        report = OpenReport()
        if not paths:
            return {}, report
        identities = current_identities(source, paths, source.revision)
        what = f"{dataset_id or source.url} @ {source.revision or 'unpinned'}"
        if not source.has_stable_identity:
            return self._index_in_memory(source, [identities[p] for p in paths], what, report), report
        entry = CacheEntry(self.root, CacheEntry.key(source, dataset_id))
        records: dict[str, MappedRecord] = {}
        for path in paths:
            record, reason = entry.open_record(identities[path])
            if record is not None:
                records[path] = record
            elif reason is not None:
                report.stale[path] = reason
        report.reused = sorted(records)
        missing = [p for p in paths if p not in records]
        indexes: dict[str, VideoIndex] = {}
        if missing:
            try:
                records.update(self._fill(source, entry, [identities[p] for p in missing], what, report, dataset_id))
            except OSError as error:
                if not _unwritable(error):
                    raise
                self._warn_unwritable(error)
                indexes = self._index_in_memory(source, [identities[p] for p in missing], what, report)
        indexes.update({path: MappedVideoIndex(record) for path, record in records.items()})
        return {path: indexes[path] for path in paths}, report

    def workers_for(self, source: ByteSource) -> int:
        return self.build_workers if self.build_workers is not None else default_build_workers(source)

    def _warn_unwritable(self, error: OSError) -> None:
        if str(self.root) in _WARNED_UNWRITABLE:
            return
        _WARNED_UNWRITABLE.add(str(self.root))
        log.warning(
            "the streaming-index cache %s cannot be written (%s: %s): indexes are kept in memory and rebuilt at "
            "every open; point HF_LEROBOT_HOME at a writable folder to keep them", self.root,
            type(error).__name__, error.strerror or error,
        )

    def _fill(
        self,
        source: ByteSource,
        entry: CacheEntry,
        missing: list[SourceIdentity],
        what: str,
        report: OpenReport,
        dataset_id: str | None,
    ) -> dict[str, MappedRecord]:
        """Convert or build the records of ``missing`` under the entry lock."""
        for path, reason in report.stale.items():
            log.info("the cached index of %s is stale (%s): indexing it again", path, reason)
        lock = BuildLock(entry.lock_path, self.lock_timeout_s, f"index {len(missing)} video files of {what}")
        with lock:
            report.lock_wait_s = lock.waited_s
            entry.describe(dataset_id, source.revision)
            remove_dead_partials(entry.records)
            remove_dead_partials(entry.directory)
            records: dict[str, MappedRecord] = {}
            to_index = []
            for identity in missing:
                record, _ = entry.open_record(identity)  # another process may have installed it meanwhile
                if record is not None:
                    records[identity.path] = record
                    report.reused.append(identity.path)
                else:
                    to_index.append(identity)
            to_build = self._convert_published(source, entry, to_index, records, report)
            if to_build:
                self._build(source, entry, to_build, what, records, report)
        report.reused.sort()
        return records

    def _convert_published(
        self,
        source: ByteSource,
        entry: CacheEntry,
        identities: list[SourceIdentity],
        records: dict[str, MappedRecord],
        report: OpenReport,
    ) -> list[SourceIdentity]:
        """Convert what published sidecars hold; return the identities left to build."""
        if not identities:
            return []
        published_root = source.published_sidecar_source()
        if published_root is None:
            return list(identities)
        published = PublishedSidecars(published_root)
        left = []
        try:
            for identity in identities:
                found = published.arrays_for(identity)
                if found is None:
                    left.append(identity)
                    continue
                arrays, archive_path = found
                records[identity.path] = entry.install(identity, arrays, origin=f"published:{archive_path}")
                report.converted.append(identity.path)
        finally:
            published.close()
        if report.converted:
            log.info("converted %d published indexes into the local cache %s", len(report.converted), entry.directory)
        return left

    def _build(
        self,
        source: ByteSource,
        entry: CacheEntry,
        identities: list[SourceIdentity],
        what: str,
        records: dict[str, MappedRecord],
        report: OpenReport,
    ) -> None:
        bytes_before = source.stats.bytes_read
        progress = BuildProgress(len(identities), f"{what}, cache {entry.directory}", self.show_progress)
        workers = self.workers_for(source)

        def build_one(identity: SourceIdentity) -> tuple[MappedRecord, int]:
            # Parse, write and map in the worker: record writes (and their fsyncs) overlap too.
            arrays = parse_identity(source, identity, self.parser)
            return entry.install(identity, arrays, origin="local-build"), len(arrays["offsets"])

        try:
            for identity, (record, samples) in _bounded_map(build_one, identities, workers, "sidecar-build"):
                records[identity.path] = record
                report.built.append(identity.path)
                progress.advance(samples)
        except BaseException as error:
            progress.fail(error)
            raise
        report.built.sort()
        progress.finish(source.stats.bytes_read - bytes_before)

    def _index_in_memory(
        self, source: ByteSource, identities: list[SourceIdentity], what: str, report: OpenReport
    ) -> dict[str, VideoIndex]:
        if not source.has_stable_identity:
            log.info("%s has no stable file identities: indexing its videos again at this open (nothing is cached)",
                     source.url)
        report.in_memory = True
        progress = BuildProgress(len(identities), f"{what}, in memory", self.show_progress)
        indexes: dict[str, VideoIndex] = {}
        bytes_before = source.stats.bytes_read
        for parsed in iter_parsed(source, identities, workers=self.workers_for(source), parser=self.parser):
            indexes[parsed.identity.path] = VideoIndex.from_arrays(parsed.arrays)
            report.built.append(parsed.identity.path)
            progress.advance(parsed.samples)
        progress.finish(source.stats.bytes_read - bytes_before)
        return indexes


_WARNED_UNWRITABLE: set[str] = set()


def _bounded_map(
    function: Callable[[_T], _R], items: Iterable[_T], workers: int, name: str
) -> Iterator[tuple[_T, _R]]:
    """``(item, function(item))`` as each call finishes, at most ``workers`` calls in flight (so at
    most ``workers`` results in memory, whatever the number of items). On an error the calls not
    started are cancelled, the running ones joined, and the error propagates."""
    remaining = iter(items)
    pending: dict[Future[_R], _T] = {}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name) as pool:
        try:
            for item in itertools.islice(remaining, workers):
                pending[pool.submit(function, item)] = item
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    item = pending.pop(future)
                    result = future.result()
                    for following in itertools.islice(remaining, 1):
                        pending[pool.submit(function, following)] = following
                    yield item, result
        finally:
            for future in pending:
                future.cancel()


def _unwritable(error: OSError) -> bool:
    """Whether ``error`` says the cache folder cannot be written (permissions, read-only file system)."""
    return isinstance(error, PermissionError) or error.errno in (errno.EROFS, errno.EACCES, errno.EPERM)


def stale_index_hint(source: ByteSource, dataset_id: str | None, cache_dir: str | Path | None = None) -> str:
    """How to clear the cached indexes of a dataset, for a decode error that a stale index may explain.

    A record is keyed by its file's identity (size, mtime and inode for local files, a content
    hash or commit elsewhere): a file replaced without changing it keeps its old index.
    """
    if dataset_id:
        how = f"`lerobot-nodes cache clear --dataset.repo_id={dataset_id}`"
    else:
        entry = CacheEntry(Path(cache_dir) if cache_dir is not None else default_cache_root(), CacheEntry.key(source, None))
        how = f"`rm -r {entry.directory}` (or `lerobot-nodes cache clear --all`)"
    return (
        "; if this video file was replaced keeping its size and modification time, its cached MP4 index is stale: "
        f"clear it with {how}, then stream again"
    )


def open_video_indexes(
    source: ByteSource,
    meta: DatasetMeta | None,
    video_paths: Iterable[str],
    *,
    lock_timeout_s: float | None = DEFAULT_LOCK_TIMEOUT_S,
    cache_dir: str | Path | None = None,
    dataset_id: str | None = None,
    build_workers: int | None = None,
) -> dict[str, VideoIndex]:
    """The sample index of each of ``video_paths``, for the streaming graph of one rank.

    Follows the lookup order of this module (local cache, published sidecar, locked local
    build) for exactly the files asked. Returned indexes are :class:`MappedVideoIndex` views of
    shared read-only records (plain :class:`VideoIndex` objects for stores without stable
    identities). ``cache_dir`` defaults to ``$HF_LEROBOT_HOME/streaming-indexes``;
    ``dataset_id`` defaults to ``meta.repo_id``. Raises :class:`SidecarLockTimeoutError` after
    ``lock_timeout_s`` seconds of waiting for another process's build. ``build_workers``: files
    indexed at once when some must be built (default :func:`default_build_workers`: 4 for a local
    folder, 32 for a remote store, where each file costs two round trips of latency).

    Nothing here holds a file descriptor per index (records are mapped, then closed), so a
    process may hold the indexes of any number of files.
    """
    cache = SidecarCache(cache_dir, lock_timeout_s=lock_timeout_s, build_workers=build_workers)
    indexes, _ = cache.open(source, video_paths, dataset_id=dataset_id or (meta.repo_id if meta else None))
    return indexes
