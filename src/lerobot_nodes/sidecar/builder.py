"""Building sample indexes: parse video files concurrently, stream them into an archive.

:func:`iter_parsed` parses files with a bounded number of results in memory (array memory
follows the parse concurrency, not the dataset size); :func:`build_archive` writes them into a
hidden temporary archive that replaces the output only once complete and verified.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

import numpy as np
from tqdm import tqdm

from ..atomic import atomic_write, remove_dead_partials
from ..errors import SidecarError, SidecarFormatError
from ..format.meta import load_meta, select_episodes
from ..mp4.index import INDEX_FORMAT_VERSION, VideoIndex, read_index_from_source
from ..sources import ByteSource
from .schema import ArchiveWriter, SidecarArchive, SourceIdentity

log = logging.getLogger("lerobot_nodes.sidecar")

IndexParser = Callable[[ByteSource, str], Mapping[str, np.ndarray]]
"""Reads one video file of a source and returns its :meth:`VideoIndex.to_arrays`."""

# Log progress at most this often (the tqdm bar, when shown, updates continuously).
_PROGRESS_LOG_INTERVAL_S = 10.0
# Looking up identities one by one is cheaper than a listing for a handful of files.
_MAX_SINGLE_LOOKUPS = 8


def parse_video_index(source: ByteSource, path: str, size: int | None = None) -> dict[str, np.ndarray]:
    """The default parser: the MP4 sample tables of ``path`` (range reads of its ``moov`` only:
    at most two requests; one more for the size when ``size`` is not given)."""
    return read_index_from_source(source, path, size).to_arrays()


def parse_identity(source: ByteSource, identity: SourceIdentity, parser: IndexParser = parse_video_index) -> dict[str, np.ndarray]:
    """``parser``'s arrays of the file of ``identity``; the default parser is given the size the
    identity already holds, so indexing a listed file costs its ``moov`` reads only."""
    if parser is parse_video_index:
        return parse_video_index(source, identity.path, identity.size)
    return dict(parser(source, identity.path))


def current_identities(source: ByteSource, paths: Sequence[str], revision: str | None) -> dict[str, SourceIdentity]:
    """The store's present identity (size, fingerprint, revision) of each of ``paths``.

    Many files are looked up with one listing of their common folder (no payload is read).
    """
    wanted = set(paths)
    found: dict[str, SourceIdentity] = {}
    if len(wanted) > _MAX_SINGLE_LOOKUPS:
        prefix = _common_folder(paths)
        found = {info.path: SourceIdentity.of(info, revision) for info in source.list_files(prefix) if info.path in wanted}
    for path in sorted(wanted - found.keys()):
        found[path] = SourceIdentity.of(source.info(path), revision)
    return found


def _common_folder(paths: Sequence[str]) -> str:
    parts = [p.split("/")[:-1] for p in paths]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return "/".join(common) + "/" if common else ""


class _IndexingBar(tqdm):  # type: ignore[type-arg]
    """A tqdm bar without tqdm's monitor thread, which would outlive the build and keep the
    training process from being forked into the workers' server (``lerobot_nodes.workers.server``)."""

    monitor_interval = 0


class BuildProgress:
    """Progress of one build: a tqdm bar (on terminals) and log lines at start, every 10 s, and end."""

    def __init__(self, total: int, what: str, show_bar: bool | None = None) -> None:
        self.total = total
        self.what = what
        self.files = 0
        self.samples = 0
        self.started = time.monotonic()
        self._last_log = self.started
        # disable=None lets tqdm show the bar only on a terminal.
        disable = None if show_bar is None else not show_bar
        self._bar = _IndexingBar(total=total, unit="file", desc="indexing MP4s", disable=disable, file=sys.stderr)
        log.info("building MP4 sample indexes of %d video files (%s)", total, what)

    def advance(self, samples: int) -> None:
        self.files += 1
        self.samples += samples
        self._bar.update(1)
        now = time.monotonic()
        if now - self._last_log >= _PROGRESS_LOG_INTERVAL_S and self.files < self.total:
            self._last_log = now
            log.info("indexed %d/%d video files (%d samples) in %.0f s", self.files, self.total, self.samples, now - self.started)

    def finish(self, bytes_read: int) -> float:
        self._bar.close()
        seconds = time.monotonic() - self.started
        log.info(
            "built MP4 sample indexes of %d video files (%d samples, %d bytes read) in %.2f s (%s)",
            self.files, self.samples, bytes_read, seconds, self.what,
        )
        return seconds

    def fail(self, error: BaseException) -> None:
        self._bar.close()
        log.warning("MP4 index build failed after %d/%d files (%s): %s", self.files, self.total, self.what, error)


@dataclass(frozen=True)
class ParsedFile:
    identity: SourceIdentity
    arrays: dict[str, np.ndarray]

    @property
    def samples(self) -> int:
        return len(self.arrays["offsets"])


def iter_parsed(
    source: ByteSource,
    identities: Sequence[SourceIdentity],
    *,
    workers: int = 1,
    parser: IndexParser = parse_video_index,
) -> Iterator[ParsedFile]:
    """Parse each file, yielding results in the order given.

    At most ``workers`` files are parsed at once and at most ``workers`` finished results wait
    for the consumer, so memory is bounded by the concurrency, whatever the number of files.
    On an error, or when the consumer stops early (a stop signal raised in it, ``close()``), the
    pending parses are cancelled and the error propagates at once: parses already running finish
    in the background and their results are dropped (over a slow server, waiting for them could
    outlast a stop signal's grace).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    pending: deque[tuple[SourceIdentity, Future[Mapping[str, np.ndarray]]]] = deque()
    remaining = iter(identities)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sidecar-parse")
    finished = False
    try:
        for identity in remaining:
            pending.append((identity, pool.submit(parse_identity, source, identity, parser)))
            if len(pending) >= workers:
                break
        while pending:
            identity, future = pending.popleft()
            arrays = dict(future.result())
            next_identity = next(remaining, None)
            if next_identity is not None:
                pending.append((next_identity, pool.submit(parse_identity, source, next_identity, parser)))
            yield ParsedFile(identity, arrays)
        finished = True
    finally:
        pool.shutdown(wait=finished, cancel_futures=True)


@dataclass(frozen=True)
class BuildSummary:
    """What a build did: for the final line of ``lerobot-build-mp4-sidecar``."""

    output: Path
    files: int
    samples: int
    bytes_read: int
    seconds: float
    complete: bool
    archive_bytes: int

    def describe(self) -> str:
        scope = "full dataset" if self.complete else "SUBSET of the dataset (cannot be published)"
        rate = self.files / self.seconds if self.seconds > 0 else float("inf")
        return (
            f"wrote {self.output} ({scope}): {self.files} video files, {self.samples} samples, "
            f"{self.bytes_read} bytes read, {self.archive_bytes} bytes written, {self.seconds:.2f} s "
            f"({rate:.1f} files/s)"
        )


def build_archive(
    source: ByteSource,
    output: str | Path,
    *,
    dataset_id: str | None = None,
    revision: str | None = None,
    episodes: Sequence[int] | None = None,
    workers: int = 1,
    parser: IndexParser = parse_video_index,
    show_progress: bool | None = None,
) -> BuildSummary:
    """Index every video file of the dataset (or of ``episodes``) into a schema v3 archive.

    The guarantees of :func:`write_archive` hold. The summary counts everything the build read
    and spent, metadata included.
    """
    started = time.monotonic()
    bytes_before = source.stats.bytes_read
    meta = load_meta(source, repo_id=dataset_id)
    chosen = select_episodes(meta, episodes)
    paths = meta.video_files(chosen)
    if not paths:
        raise SidecarError(f"{dataset_id or source.url} has no video features: there is nothing to index")
    summary = write_archive(
        source,
        paths,
        output,
        dataset_id=dataset_id or meta.repo_id,
        revision=revision,
        complete=len(chosen) == len(meta.episodes),
        workers=workers,
        parser=parser,
        show_progress=show_progress,
    )
    return replace(summary, seconds=time.monotonic() - started, bytes_read=source.stats.bytes_read - bytes_before)


def write_archive(
    source: ByteSource,
    paths: Sequence[str],
    output: str | Path,
    *,
    dataset_id: str | None = None,
    revision: str | None = None,
    complete: bool = False,
    workers: int = 1,
    parser: IndexParser = parse_video_index,
    show_progress: bool | None = None,
) -> BuildSummary:
    """Index ``paths`` of ``source`` into a schema v3 archive at ``output``.

    Guarantees: ``output`` is replaced atomically and only by a complete archive that was read
    back and verified against the store; on any failure (or a kill) the previous ``output`` is
    untouched and no partial file carries its name. Temporary files of killed earlier builds
    of the same output are removed first. ``complete`` declares that ``paths`` are all the
    video files of the dataset (only such archives may be published).
    """
    output = Path(output)
    commit = source.revision or revision
    identities = current_identities(source, paths, commit)
    remove_dead_partials(output.parent, output.name)
    bytes_before = source.stats.bytes_read
    progress = BuildProgress(len(paths), f"{dataset_id or 'dataset'} @ {commit or 'local'} -> {output}", show_progress)
    try:
        with atomic_write(output) as handle, ArchiveWriter(handle) as writer:
            for parsed in iter_parsed(source, [identities[p] for p in paths], workers=workers, parser=parser):
                writer.add(parsed.identity, parsed.arrays)
                progress.advance(parsed.samples)
            archive_meta = writer.finish(
                dataset_id=dataset_id,
                revision=revision,
                source_commit=commit,
                complete=complete,
                index_format_version=INDEX_FORMAT_VERSION,
            )
            verify_archive(handle, str(output), identities)
            archive_bytes = handle.tell()
    except BaseException as error:
        progress.fail(error)
        raise
    bytes_read = source.stats.bytes_read - bytes_before
    seconds = progress.finish(bytes_read)
    return BuildSummary(
        output=output,
        files=len(archive_meta.files),
        samples=archive_meta.sample_count,
        bytes_read=bytes_read,
        seconds=seconds,
        complete=complete,
        archive_bytes=archive_bytes,
    )


def verify_archive(handle: IO[bytes], where: str, expected: Mapping[str, SourceIdentity]) -> None:
    """Read a written archive back: every expected file present, matching, and a valid index.

    Leaves ``handle`` positioned at its end.
    """
    handle.seek(0)
    archive = SidecarArchive(handle, where)
    for path, identity in expected.items():
        entry = archive.meta.file(path)
        if entry is None:
            raise SidecarFormatError(f"{where}: the written archive lacks {path}")
        reason = entry.identity.mismatch(identity)
        if reason is not None:
            raise SidecarFormatError(f"{where}: the written entry of {path} does not match the store: {reason}")
        VideoIndex.from_arrays(archive.load_arrays(path))
    handle.seek(0, 2)
