"""A node-local disk cache of remote byte ranges: later epochs and restarts read the disk, not the store.

Every range a reader asks of a remote source (MP4 clips and ``moov`` reads, Parquet footers and
row groups, whole payload files) maps to fixed-size aligned blocks of the file, each block one
file on disk::

    <folder>/blocks-1MiB/<store>/<file key>/<index>-<length>

``<file key>`` is a hash of the source address, the path and the file's identity (its
fingerprint, with the source's revision): a file replaced in the store gets a new key, so a
block is immutable and never invalidated in place. Files without an identity are not cached,
local folders never are (:attr:`ByteSource.caches_bytes`).

- **Atomic blocks.** A block is written under a hidden temporary name in its folder, fsynced,
  then renamed; a reader checks its length against the name (a wrong length is a miss and is
  removed). A writer killed mid-write leaves only its temporary file, removed by a later scan.
- **One fetch per block per node.** Missing blocks are fetched under a per-block ``flock``
  (released by the kernel when a process dies), taken without waiting first, then in ascending
  order for the blocks others are fetching, re-checking presence after each; the missing blocks
  of one read are coalesced into one call of the store (contiguous blocks into one range).
- **Bounded, least recently used.** A hit touches the block's mtime at most once a minute.
  After every ``scan_every`` bytes it wrote, a process scans the cache under a cache-wide lock
  (skipped when another process holds it) and removes the oldest blocks while the total is
  above the bound (down to 90 % of it). The bound defaults to the smaller of 50 GB and a
  quarter of the free space of the cache's disk (the cache's own size counted as free).
- **Never an error.** A folder that cannot be written, a full disk or a bound smaller than one
  block turn caching off with one warning naming the folder (per process); reads go to the store.
- **Picklable**: only the folder, the bound and the block size travel to DataLoader workers;
  locks and counters are per process.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..atomic import is_partial, partial_name, remove_dead_partials
from ..config import BYTES_PER_GB
from ..home import lerobot_home

try:  # POSIX; elsewhere blocks are still installed atomically, only the once-per-node fetch is lost
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("lerobot_nodes.sources")

CACHE_DIR_NAME = "streaming-bytes"
BLOCK_SIZE = 1 << 20
"""1 MiB: 50 GB is 50k block files; a range costs at most one block of extra bytes at each end."""
DEFAULT_MAX_BYTES = 50 * BYTES_PER_GB
FREE_SPACE_SHARE = 4
"""The default bound takes at most a quarter of the free space where the cache lives."""
LOW_WATER = 0.9
TOUCH_EVERY_S = 60.0
LOCK_WAIT_S = 600.0
"""How long a read waits for another process fetching the same block before reading it itself."""
MAX_SCAN_EVERY = 256 << 20
MAX_HELD_LOCKS = 32
"""Block locks one read holds at once (each an open file descriptor): 32 MiB of 1 MiB blocks per store call."""
EVICT_LOCK = "evict.lock"
READ_FAILED = (OSError, ValueError)
_BLOCK_NAME = re.compile(r"^(?P<index>\d+)-(?P<length>\d+)$")


def default_byte_cache_root() -> Path:
    """``$HF_LEROBOT_HOME/streaming-bytes``."""
    return lerobot_home() / CACHE_DIR_NAME


def block_folder_name(block_size: int) -> str:
    """``blocks-1MiB`` (the block size is part of the layout: another size starts afresh)."""
    return f"blocks-{block_size >> 20}MiB" if block_size % (1 << 20) == 0 else f"blocks-{block_size}B"


@dataclass
class ByteCacheStats:
    """What the cache did in this process: blocks found and fetched, bytes served and stored, evictions."""

    hits: int = 0
    misses: int = 0
    bytes_served: int = 0
    bytes_stored: int = 0
    evictions: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class CacheUsage:
    """What a scan found: bytes held, block files, cached source files."""

    total_bytes: int
    blocks: int
    files: int


Fetch = Callable[[list[tuple[int, int]]], list[bytes]]


class ByteRangeCache:
    """Blocks of remote files under ``folder`` (default ``$HF_LEROBOT_HOME/streaming-bytes``),
    at most ``max_bytes`` (``None``: the smaller of 50 GB and a quarter of the free space)."""

    _warned: set[str] = set()

    def __init__(self, folder: str | os.PathLike[str] | None = None, max_bytes: int | None = None,
                 block_size: int = BLOCK_SIZE) -> None:
        self.folder = Path(folder).expanduser() if folder is not None else default_byte_cache_root()
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        self.block_size = int(block_size)
        self.writable = True
        self._process_state()

    def _process_state(self) -> None:
        self.stats = ByteCacheStats()
        self._lock = threading.Lock()
        self._written_since_scan = self.scan_every  # a process's first write scans: a restart honours the bound

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "max_bytes": self.max_bytes, "block_size": self.block_size,
                "writable": self.writable}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._process_state()

    def __repr__(self) -> str:
        bound = "auto" if self.max_bytes is None else f"{self.max_bytes} bytes"
        return f"ByteRangeCache({str(self.folder)!r}, bound {bound})"

    # -- setup ----------------------------------------------------------------------------
    @property
    def blocks_root(self) -> Path:
        return self.folder / block_folder_name(self.block_size)

    @property
    def scan_every(self) -> int:
        """Bytes a process writes between two scans: 1/64 of the bound (64 ranks may share a node),
        between one block and 256 MiB."""
        bound = self.max_bytes if self.max_bytes is not None else DEFAULT_MAX_BYTES
        return max(self.block_size, min(MAX_SCAN_EVERY, bound // 64))

    def bound(self, held_bytes: int = 0) -> int:
        """The size limit: the explicit one, else min(50 GB, (free space + ``held_bytes``) / 4)."""
        if self.max_bytes is not None:
            return self.max_bytes
        try:
            free = shutil.disk_usage(_existing(self.folder)).free
        except OSError:
            free = 0
        return min(DEFAULT_MAX_BYTES, (free + held_bytes) // FREE_SPACE_SHARE)

    def ready(self) -> bool:
        """Check once, in the process that opens the dataset, that the cache can be used: the folder
        is writable and the bound holds a block. Otherwise warn once and return False."""
        bound = self.bound()
        if bound < self.block_size:
            self._give_up(f"its bound, {bound} bytes, is smaller than one block ({self.block_size} bytes)")
            return False
        try:
            self.blocks_root.mkdir(parents=True, exist_ok=True)
            probe = partial_name(self.blocks_root / "probe")
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(probe)
        except OSError as error:
            self._give_up(f"{type(error).__name__}: {error}")
            return False
        return True

    def _give_up(self, why: str) -> None:
        self.writable = False
        if str(self.folder) not in ByteRangeCache._warned:
            ByteRangeCache._warned.add(str(self.folder))
            log.warning("the disk byte cache %s cannot be used (%s): remote reads go to the store, uncached",
                        self.folder, why)

    # -- reading --------------------------------------------------------------------------
    def read(self, group: str, identity: str, size: int, ranges: Sequence[tuple[int, int]], fetch: Fetch) -> list[bytes]:
        """The bytes of each ``(start, end)`` range (inside a file of ``size`` bytes whose identity is
        ``identity``), from cached blocks where present; ``fetch(ranges)`` reads the store."""
        size_of = self.block_size
        needed = sorted({i for start, end in ranges if end > start for i in range(start // size_of, (end - 1) // size_of + 1)})
        folder = self.blocks_root / group / hashlib.sha256(identity.encode()).hexdigest()[:32]
        blocks: dict[int, bytes] = {}
        missing = []
        for index in needed:
            data = self._load(folder, index, self._length(index, size))
            if data is None:
                missing.append(index)
            else:
                blocks[index] = data
        hits = set(blocks)
        if missing:
            fetched, found = self._fill(folder, size, missing, fetch)
            blocks.update(fetched)
            hits |= found
        out, served = [], 0
        for start, end in ranges:
            pieces = []
            for index in range(start // size_of, (end - 1) // size_of + 1) if end > start else ():
                base = index * size_of
                piece = blocks[index][max(start, base) - base: min(end, base + size_of) - base]
                served += len(piece) if index in hits else 0
                pieces.append(piece)
            out.append(b"".join(pieces))
        with self._lock:
            self.stats.bytes_served += served
        return out

    def _length(self, index: int, size: int) -> int:
        return min(self.block_size, size - index * self.block_size)

    def _load(self, folder: Path, index: int, length: int) -> bytes | None:
        """The block, or ``None`` when absent (a block of the wrong length is removed)."""
        target = folder / f"{index}-{length}"
        try:
            fd = os.open(target, os.O_RDONLY)
        except OSError:
            return None
        try:
            status = os.fstat(fd)
            data = os.pread(fd, length + 1, 0) if status.st_size == length else b""
        except OSError:
            data = b""
        finally:
            os.close(fd)
        if len(data) != length:
            with contextlib.suppress(OSError):
                target.unlink()
            return None
        if time.time() - status.st_mtime > TOUCH_EVERY_S:
            with contextlib.suppress(OSError):
                os.utime(target)  # least recently *used*: a hit keeps the block
        with self._lock:
            self.stats.hits += 1
        return data

    def _fill(self, folder: Path, size: int, missing: list[int], fetch: Fetch) -> tuple[dict[int, bytes], set[int]]:
        """Fetch and store ``missing`` blocks; returns them and which of them another process stored meanwhile.

        At most :data:`MAX_HELD_LOCKS` block locks (one file descriptor each) are held at once: a read
        of a large range takes its blocks a chunk at a time."""
        got: dict[int, bytes] = {}
        found: set[int] = set()
        for first in range(0, len(missing), MAX_HELD_LOCKS):
            chunk_got, chunk_found = self._fill_chunk(folder, size, missing[first : first + MAX_HELD_LOCKS], fetch)
            got.update(chunk_got)
            found |= chunk_found
        return got, found

    def _fill_chunk(
        self, folder: Path, size: int, missing: list[int], fetch: Fetch
    ) -> tuple[dict[int, bytes], set[int]]:
        got: dict[int, bytes] = {}
        found: set[int] = set()
        held: dict[int, int] = {}
        try:
            waiting = missing
            if self.writable and fcntl is not None:
                waiting = []
                for index in missing:  # without waiting: take what nobody else is fetching
                    fd = self._lock_block(folder, index, wait=False)
                    if fd is None:
                        waiting.append(index)
                    elif not self._found(folder, index, size, fd, got, found):
                        held[index] = fd
                if held:
                    got.update(self._fetch(folder, size, sorted(held), fetch, store=True))
                    self._release(held)
                uncached = []
                for index in waiting:  # then wait for the others' fetches, in ascending order
                    fd = self._lock_block(folder, index, wait=True) if self.writable else None
                    if fd is None:
                        uncached.append(index)
                    elif not self._found(folder, index, size, fd, got, found):
                        held[index] = fd
                waiting = uncached
                if held:
                    got.update(self._fetch(folder, size, sorted(held), fetch, store=True))
            if waiting:
                got.update(self._fetch(folder, size, waiting, fetch, store=self.writable and fcntl is None))
        finally:
            self._release(held)
        return got, found

    def _found(self, folder: Path, index: int, size: int, fd: int, got: dict[int, bytes], found: set[int]) -> bool:
        """Re-check a block once its lock is held: another process may have stored it meanwhile."""
        data = self._load(folder, index, self._length(index, size))
        if data is None:
            return False
        got[index] = data
        found.add(index)
        self._release({index: fd})
        return True

    def _fetch(self, folder: Path, size: int, indices: list[int], fetch: Fetch, store: bool) -> dict[int, bytes]:
        """Read ``indices`` (sorted) in one call of the store, contiguous blocks as one range; store them."""
        runs: list[list[int]] = []
        for index in indices:
            if runs and runs[-1][-1] == index - 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        spans = [(run[0] * self.block_size, run[0] * self.block_size + sum(self._length(i, size) for i in run))
                 for run in runs]
        chunks = fetch(spans)
        blocks: dict[int, bytes] = {}
        for run, chunk in zip(runs, chunks, strict=True):
            offset = 0
            for index in run:
                length = self._length(index, size)
                blocks[index] = chunk[offset: offset + length]
                offset += length
        with self._lock:
            self.stats.misses += len(blocks)
        if store:
            for index, data in blocks.items():
                if not self.writable:
                    break
                self._store(folder, index, data)
        return blocks

    # -- writing --------------------------------------------------------------------------
    def _store(self, folder: Path, index: int, data: bytes) -> None:
        target = folder / f"{index}-{len(data)}"
        temporary = partial_name(target)
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, target)
        except FileNotFoundError:
            # The folder was removed under us (``lerobot-nodes cache clear``): skip this block.
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            return
        except OSError as error:  # full disk, read-only file system, ...
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            self._give_up(f"{type(error).__name__}: {error}")
            return
        with self._lock:
            self.stats.bytes_stored += len(data)
            self._written_since_scan += len(data)
            scan = self._written_since_scan >= self.scan_every
            if scan:
                self._written_since_scan = 0
        if scan:
            self.evict()

    def _lock_block(self, folder: Path, index: int, wait: bool) -> int | None:
        """The fd holding block ``index``'s lock; ``None`` when busy (``wait=False``), after
        :data:`LOCK_WAIT_S` (``wait=True``) or when the lock cannot be made (caching is off then)."""
        assert fcntl is not None
        path = folder / f"{index}.lock"
        try:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                folder.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            self._give_up(f"{type(error).__name__}: {error}")
            return None
        deadline, pause = time.monotonic() + LOCK_WAIT_S, 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if not wait or time.monotonic() > deadline:
                    os.close(fd)
                    return None
            except OSError as error:
                os.close(fd)
                self._give_up(f"{type(error).__name__}: {error}")
                return None
            time.sleep(pause)
            pause = min(0.05, pause * 2)

    @staticmethod
    def _release(held: dict[int, int]) -> None:
        for fd in held.values():
            os.close(fd)  # closing the only descriptor releases the flock
        held.clear()

    # -- bound ----------------------------------------------------------------------------
    def evict(self) -> CacheUsage | None:
        """Scan the cache (under the cache-wide lock; ``None`` when another process scans) and remove
        the least recently used blocks while it holds more than its bound; dead writers' temporary
        files go too."""
        try:
            fd = os.open(self.folder / EVICT_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return None
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return None
            blocks, total, files = scan_blocks(self.folder)
            bound = self.bound(total)
            evicted = 0
            if total > bound:
                blocks.sort()
                for _, nbytes, path in blocks:
                    if total <= LOW_WATER * bound:
                        break
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                        total -= nbytes
                        evicted += 1
                    with contextlib.suppress(OSError):
                        os.unlink(path.rsplit("-", 1)[0] + ".lock")
            with self._lock:
                self.stats.evictions += evicted
            return CacheUsage(total, len(blocks) - evicted, files)
        finally:
            os.close(fd)


def scan_blocks(folder: Path) -> tuple[list[tuple[float, int, str]], int, int]:
    """``(mtime, size, path)`` of every block under ``folder`` (any block size), the bytes held
    (temporary files included) and the number of cached source files; removes dead writers' files."""
    blocks: list[tuple[float, int, str]] = []
    total = files = 0
    for top in _subfolders(folder, "blocks-"):
        for group in _subfolders(top):
            for entry in _subfolders(group):
                files += 1
                partials = False
                with contextlib.suppress(OSError), os.scandir(entry) as children:
                    for child in children:
                        with contextlib.suppress(OSError):
                            if _BLOCK_NAME.match(child.name):
                                status = child.stat(follow_symlinks=False)
                                blocks.append((status.st_mtime, status.st_size, child.path))
                                total += status.st_size
                            elif is_partial(Path(child.name)):
                                partials = True
                                total += child.stat(follow_symlinks=False).st_size
                if partials:
                    for removed in remove_dead_partials(entry):
                        log.debug("removed %s, left by a killed writer", removed)
    return blocks, total, files


def _subfolders(folder: Path, prefix: str = "") -> list[Path]:
    try:
        with os.scandir(folder) as entries:
            return sorted(Path(e.path) for e in entries if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _existing(folder: Path) -> Path:
    """``folder`` or its nearest existing parent (where free space is measured before it exists)."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return candidate
    return folder


def byte_cache_from_options(size_gb: float | None, folder: str | None) -> ByteRangeCache | None:
    """The cache ``--dataset.streaming_disk_cache_gb`` / ``_dir`` ask for, checked (``ready``), or ``None``:
    ``0`` GB turns it off; ``None`` is the default bound; ``None`` folder is ``$HF_LEROBOT_HOME/streaming-bytes``."""
    if size_gb is not None and size_gb == 0:
        return None
    cache = ByteRangeCache(folder, None if size_gb is None else int(size_gb * BYTES_PER_GB))
    return cache if cache.ready() else None
