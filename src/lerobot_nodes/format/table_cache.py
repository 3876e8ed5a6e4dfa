"""Parsed tables of a dataset revision kept on the node's disk, so a second open reads no Parquet.

Opening a 1M-episode dataset means reading ~1,000 ``meta/episodes`` Parquet files to build a few
numpy columns per episode. :class:`TableCache` keeps those columns, once built, as one file per
dataset revision under ``$HF_LEROBOT_HOME/streaming-meta/episode-tables/``; later opens (every
rank of the node, every restart) map it read-only (``mmap``: the ranks of a node share its pages).

- **Keyed by what makes it valid** (:func:`table_key`): the source (URL, pinned revision: a Hub
  commit sha) and the path, size and content identity (Hub/Xet hash, ETag, or for a local file
  ``size-mtime_ns-inode``) of every file the table is derived from. A source without stable
  identities is never cached. A changed file gives another key, so a cache file is never
  trusted for content it was not built from.
- **Never half-written**: files are installed atomically (:func:`~lerobot_nodes.atomic.atomic_write`)
  and checked when mapped (magic, key, size, CRC-32 of the data); one process of the node builds
  under a file lock while the others wait and map what it wrote.
- **Never an error**: a stale file (the dataset changed) or a corrupt one (truncated, overwritten)
  is rebuilt with one log line; a folder that cannot be written makes the process parse for itself
  (logged once per folder).

File layout: 8-byte magic, 8-byte little-endian header length, a JSON header (key digest, arrays
as ``[name, dtype, shape, offset, nbytes]``, the caller's JSON ``extra``, CRC-32 and size of the
data), then each array's bytes at a 64-byte aligned offset.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..atomic import atomic_write, remove_dead_partials
from ..errors import CacheFileError
from ..sources import ByteSource, FileInfo
from ..sources.file_cache import default_file_cache_root, slug
from ..sources.node_cache import file_lock

log = logging.getLogger("lerobot_nodes.format")

TABLE_CACHE_DIR = "episode-tables"
TABLE_SUFFIX = ".table"
TABLE_FORMAT_VERSION = 1
"""Raised whenever the layout or the meaning of a stored array changes: older files are then stale."""
_MAGIC = b"LRNTABL1"
_ALIGN = 64
_PREAMBLE = struct.Struct("<8sQ")


def default_table_cache_root() -> Path:
    """``$HF_LEROBOT_HOME/streaming-meta/episode-tables``."""
    return default_file_cache_root() / TABLE_CACHE_DIR


def table_key(source: ByteSource, kind: str, files: Sequence[FileInfo]) -> str | None:
    """What a ``kind`` table derived from ``files`` of ``source`` is valid for, or ``None`` when the
    source cannot say whether a file changed (no stable identity, or a file without fingerprint)."""
    if not source.has_stable_identity:
        return None
    parts = [f"{kind} v{TABLE_FORMAT_VERSION}", source.url, source.revision or ""]
    for info in sorted(files, key=lambda f: f.path):
        if info.fingerprint is None:
            return None
        parts.append(f"{info.path}\0{info.size}\0{info.fingerprint}")
    return "\n".join(parts)


@dataclass(frozen=True)
class CachedTable:
    """Named arrays (read-only views of the mapped file, or the freshly built arrays) and JSON ``extra``."""

    arrays: dict[str, np.ndarray]
    extra: dict[str, Any]
    from_cache: bool
    """Whether the arrays were mapped from a cache file this open did not build."""
    mapped: MappedFile | None = None
    """The cache file the arrays are views of (None: arrays held in this process's memory)."""


@dataclass(frozen=True)
class MappedFile:
    """A table file and the key it was read for: what another process needs to map the same pages
    (``read_table(path, key)``) instead of receiving a copy of the arrays."""

    path: Path
    key: str


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def write_table(
    path: Path, key: str, arrays: Mapping[str, np.ndarray], extra: Mapping[str, Any], origin: str = ""
) -> None:
    """Install the table file at ``path`` atomically (see the module's layout); ``origin`` (the source's
    URL, never credentials) is recorded for ``lerobot-nodes cache list`` only."""
    contiguous = {name: np.ascontiguousarray(array) for name, array in arrays.items()}
    entries: list[list[Any]] = []
    offset = 0
    crc = 0
    for name, array in contiguous.items():
        if array.dtype.hasobject:
            raise TypeError(f"array {name!r} holds Python objects; only plain numeric arrays are stored")
        entries.append([name, array.dtype.str, list(array.shape), offset, array.nbytes])
        crc = zlib.crc32(_padding(array), zlib.crc32(_raw(array), crc))
        offset = _aligned(offset + array.nbytes)
    header = {
        "version": TABLE_FORMAT_VERSION,
        "key": _digest(key),
        "origin": origin,
        "arrays": entries,
        "extra": dict(extra),
        "data_size": offset,
        "data_crc32": crc,
    }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    data_start = _aligned(_PREAMBLE.size + len(encoded))
    with atomic_write(path) as out:
        out.write(_PREAMBLE.pack(_MAGIC, len(encoded)))
        out.write(encoded)
        out.write(b"\0" * (data_start - _PREAMBLE.size - len(encoded)))
        for array in contiguous.values():
            out.write(_raw(array))
            out.write(_padding(array))


def _raw(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1).view(np.uint8).data)


def _padding(array: np.ndarray) -> bytes:
    """The zeros after ``array`` that align the next one."""
    return b"\0" * (_aligned(array.nbytes) - array.nbytes)


def _public_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}"


def table_origin(path: Path) -> str:
    """The source URL a table file was built from (``""`` when unknown), without checking its key or data."""
    with open(path, "rb") as handle:
        magic, length = _PREAMBLE.unpack(handle.read(_PREAMBLE.size))
        if magic != _MAGIC:
            return ""
        header = json.loads(handle.read(length))
    return str(header.get("origin", ""))


def read_table(path: Path, key: str) -> CachedTable:
    """The arrays of the table file at ``path`` as read-only views of one shared mapping.

    Raises :class:`FileNotFoundError` when there is no file, :class:`CacheFileError` when it is
    not a complete table for ``key``.
    """
    with open(path, "rb") as handle:  # header and data of one file, even if another replaces it meanwhile
        header, data_start, data_size = _read_header(handle, key)
        if data_size == 0:
            return CachedTable(
                {
                    name: np.zeros(shape, dtype=np.dtype(dtype))
                    for name, dtype, shape, _, _ in header["arrays"]
                },
                dict(header.get("extra") or {}),
                from_cache=True,
            )
        data = np.memmap(handle, dtype=np.uint8, mode="r", offset=data_start, shape=(data_size,))
    if zlib.crc32(data.data) != header.get("data_crc32"):
        raise CacheFileError("its data does not match its checksum")
    entries = header["arrays"]
    arrays: dict[str, np.ndarray] = {}
    try:
        for name, dtype, shape, offset, nbytes in entries:
            kind = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            if offset < 0 or offset + nbytes > data_size or count * kind.itemsize != nbytes:
                raise CacheFileError(f"array {name!r} does not fit its data")
            view = (
                np.frombuffer(data, dtype=kind, count=count, offset=int(offset))
                if count
                else np.zeros(0, kind)
            )
            arrays[str(name)] = view.reshape(shape)
    except (TypeError, ValueError) as error:
        if isinstance(error, CacheFileError):
            raise
        raise CacheFileError(f"unreadable array entry ({error})") from None
    return CachedTable(arrays, dict(header.get("extra") or {}), from_cache=True, mapped=MappedFile(path, key))


def _read_header(handle: BinaryIO, key: str) -> tuple[dict[str, Any], int, int]:
    """The header of an open table file, where its data starts and its size, checked against the file."""
    preamble = handle.read(_PREAMBLE.size)
    if len(preamble) < _PREAMBLE.size:
        raise CacheFileError(f"truncated: {len(preamble)} bytes")
    magic, header_size = _PREAMBLE.unpack(preamble)
    if magic != _MAGIC:
        raise CacheFileError("not a table file (bad magic)")
    encoded = handle.read(header_size)
    file_size = os.fstat(handle.fileno()).st_size
    if len(encoded) != header_size:
        raise CacheFileError(f"truncated inside its header ({file_size} bytes)")
    try:
        header = json.loads(encoded)
        data_size = int(header["data_size"])
        if not isinstance(header["arrays"], list):
            raise TypeError("arrays is not a list")
    except (ValueError, KeyError, TypeError) as error:
        raise CacheFileError(f"unreadable header ({error})") from None
    if header.get("version") != TABLE_FORMAT_VERSION or header.get("key") != _digest(key):
        raise CacheFileError("written for other content")
    data_start = _aligned(_PREAMBLE.size + header_size)
    if file_size != data_start + data_size:
        raise CacheFileError(f"truncated: {file_size} bytes of {data_start + data_size}")
    return header, data_start, data_size


class TableCache:
    """Parsed tables under ``folder`` (default :func:`default_table_cache_root`), one file per key."""

    _warned: set[str] = set()

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = Path(folder) if folder is not None else default_table_cache_root()

    def entry(self, source: ByteSource, key: str) -> Path:
        """The file of ``key``: one folder per source URL (a Hub repo's holds its commit), one file per content."""
        host, sep, rest = source.url.split("://", 1)[-1].partition("/")
        where = host.rpartition("@")[2] + sep + rest  # never a user:password@ of the authority
        folder = f"{slug(where)[-80:].strip('-')}-{_digest(source.url)[:12]}"
        return self.folder / folder / f"{_digest(key)[:32]}{TABLE_SUFFIX}"

    def get_or_build(
        self,
        source: ByteSource,
        key: str | None,
        build: Callable[[], tuple[dict[str, np.ndarray], dict[str, Any]]],
        what: str = "table",
    ) -> CachedTable:
        """The table of ``key``, mapped from its file when one is there and sound; else ``build()``
        (by one process of the node, the others wait and map its file), stored, and mapped.

        ``key`` ``None`` (no identity): ``build()`` every time, nothing stored. ``what`` names the
        table in log lines (e.g. ``"meta/episodes of <url>"``).
        """
        if key is None:
            return CachedTable(*build(), from_cache=False)
        path = self.entry(source, key)
        found = self._mapped(path, key, what, quiet=False)
        if found is not None:
            return found
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            self._warn_once(error)
            return CachedTable(*build(), from_cache=False)
        with file_lock(path.with_name(f".{path.name}.lock"), self.folder) as locked:
            if locked:
                found = self._mapped(path, key, what, quiet=True)
                if found is not None:
                    return found
            arrays, extra = build()
            if not locked:
                return CachedTable(arrays, extra, from_cache=False)
            stale = [p for p in path.parent.glob(f"*{TABLE_SUFFIX}") if p != path]
            try:
                write_table(path, key, arrays, extra, origin=_public_url(source.url))
            except OSError as error:
                self._warn_once(error)
                return CachedTable(arrays, extra, from_cache=False)
            for old in stale:  # a mapping of it elsewhere keeps reading its pages
                old.unlink(missing_ok=True)
            remove_dead_partials(path.parent, path.name)
        if stale:
            log.info("%s changed since it was cached: parsed again, cached as %s", what, path)
        try:  # this process maps the file too, so its pages are the node's shared copy
            mapped = read_table(path, key)
        except (OSError, CacheFileError):
            return CachedTable(arrays, extra, from_cache=False)
        return CachedTable(mapped.arrays, mapped.extra, from_cache=False, mapped=mapped.mapped)

    def _mapped(self, path: Path, key: str, what: str, quiet: bool) -> CachedTable | None:
        try:
            return read_table(path, key)
        except FileNotFoundError:
            return None
        except (OSError, CacheFileError) as error:
            if not quiet:
                log.warning("the cached %s at %s is unusable (%s): parsing it again", what, path, error)
            return None

    def _warn_once(self, error: BaseException) -> None:
        if str(self.folder) not in TableCache._warned:
            TableCache._warned.add(str(self.folder))
            log.warning(
                "cannot write the table cache %s (%s): parsing meta/episodes at every open",
                self.folder,
                error,
            )
