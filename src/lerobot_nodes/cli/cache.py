"""``lerobot-nodes cache list|clear``: the local caches of MP4 indexes, remote metadata and remote bytes.

Three folders under ``$HF_LEROBOT_HOME``: ``streaming-indexes`` (one entry per dataset revision,
``g<generation>/<entry>/records/*.idx``, guarded by ``build.lock``), ``streaming-meta``
(``datasets/<owner--name>/<commit>/``, ``buckets/<owner--name>/`` and ``http/<host--path>/``, and
``episode-tables/<source>/``, the parsed ``meta/episodes`` tables: kind ``tables``)
and ``streaming-bytes``, the disk byte cache (``blocks-1MiB/<owner--name or store>/<file>/``, one
entry per store; lerobot_nodes.sources.range_cache).
Entries are immutable and a replaced file gets a new record, so clearing is never needed for
correctness, except when a file was replaced without its identity changing (same size, restored
mtime and inode).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from ..format.table_cache import TABLE_SUFFIX, default_table_cache_root, table_origin
from ..sidecar.cache import default_cache_root
from ..sidecar.locking import BuildLock
from ..sources.file_cache import default_file_cache_root, slug
from ..sources.range_cache import ByteRangeCache, default_byte_cache_root, scan_blocks

LOCK_NAME = "build.lock"


@dataclass(frozen=True)
class CacheItem:
    """One cache entry: what it holds and where."""

    kind: str  # "indexes", "meta", "tables" or "bytes"
    dataset: str
    revision: str
    records: int
    size_bytes: int
    path: Path

    def matches(self, repo_id: str) -> bool:
        """Whether the entry belongs to the Hub dataset or bucket ``repo_id``."""
        if self.dataset == repo_id:
            return True
        # Folder names spell the id as a slug: <owner--name>@<revision>-<hash>, datasets/<owner--name>/<sha>.
        folder = self.path.parent.name if self.kind == "meta" and self.revision != "bucket" else self.path.name
        return folder.partition("@")[0] == slug(repo_id)


def _size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def index_items(root: Path | None = None) -> Iterator[CacheItem]:
    """The entries of ``$HF_LEROBOT_HOME/streaming-indexes`` (every cache generation)."""
    root = root or default_cache_root()
    for entry in sorted(root.glob("g*/*")):
        if not entry.is_dir():
            continue
        name, _, revision = entry.name.partition("@")
        dataset, revision = name, revision.rpartition("-")[0] or "unpinned"
        with contextlib.suppress(OSError, ValueError, AttributeError):
            note = json.loads((entry / "entry.json").read_text())
            dataset = note.get("dataset_id") or f"local folder {name}"
            revision = note.get("revision") or "unpinned"
        records = len(list((entry / "records").glob("*.idx")))
        yield CacheItem("indexes", dataset, revision, records, _size(entry), entry)


def meta_items(root: Path | None = None) -> Iterator[CacheItem]:
    """The entries of ``$HF_LEROBOT_HOME/streaming-meta``: one per Hub commit, bucket, plain HTTP and S3 root."""
    root = root or default_file_cache_root()
    for entry in sorted(root.glob("datasets/*/*")):
        if entry.is_dir():
            files = _entries(entry)
            yield CacheItem("meta", entry.parent.name.replace("--", "/", 1), entry.name, len(files), _size(entry), entry)
    for entry in sorted(root.glob("buckets/*")):
        if entry.is_dir():
            files = _entries(entry)
            yield CacheItem("meta", entry.name.replace("--", "/", 1), "bucket", len(files), _size(entry), entry)
    for entry in sorted(root.glob("http/*")):
        if entry.is_dir():  # plain http(s) roots: one folder per URL, entries keyed by ETag or Last-Modified
            files = _entries(entry)
            yield CacheItem("meta", f"http root {entry.name}", "unpinned", len(files), _size(entry), entry)
    for entry in sorted(root.glob("s3/*")):
        if entry.is_dir():  # s3:// roots: one folder per endpoint, bucket and prefix, entries keyed by ETag
            files = _entries(entry)
            yield CacheItem("meta", f"s3 root {entry.name}", "unpinned", len(files), _size(entry), entry)
    hub = root / "hub"
    if hub.is_dir():  # Hub answers shared by a node's processes: revisions, refs, redirect targets
        yield CacheItem("meta", "Hub answers", "shared", len(_entries(hub, recursive=True)), _size(hub), hub)


def _entries(folder: Path, recursive: bool = False) -> list[Path]:
    """Cached files of ``folder``, without the hidden lock files that guard their fetches."""
    found = folder.rglob("*") if recursive else folder.iterdir()
    return [p for p in found if p.is_file() and not (p.name.startswith(".") and p.name.endswith(".lock"))]


def byte_items(root: Path | None = None) -> Iterator[CacheItem]:
    """The entries of ``$HF_LEROBOT_HOME/streaming-bytes``: one per store (Hub repo or bucket, other URL)
    and block size; ``records`` is the number of its files with cached blocks."""
    root = root or default_byte_cache_root()
    for entry in sorted(root.glob("blocks-*/*")):
        if entry.is_dir():
            files = sum(1 for child in entry.iterdir() if child.is_dir())
            label = entry.parent.name.removeprefix("blocks-") + " blocks"
            yield CacheItem("bytes", entry.name.replace("--", "/", 1), label, files, _size(entry), entry)


def table_items(root: Path | None = None) -> Iterator[CacheItem]:
    """The entries of ``$HF_LEROBOT_HOME/streaming-meta/episode-tables``: one per source (its parsed
    ``meta/episodes`` tables, one file per content; lerobot_nodes.format.table_cache)."""
    root = root or default_table_cache_root()
    for entry in sorted(root.glob("*")):
        if not entry.is_dir():
            continue
        tables = sorted(entry.glob(f"*{TABLE_SUFFIX}"))
        origin = ""
        with contextlib.suppress(OSError, ValueError):
            origin = table_origin(tables[-1]) if tables else ""
        dataset, revision = _origin_name(origin, entry.name)
        yield CacheItem("tables", dataset, revision, len(tables), _size(entry), entry)


def _origin_name(origin: str, folder: str) -> tuple[str, str]:
    """(dataset, revision) of a table entry from the source URL it records."""
    for prefix in ("hf://datasets/", "hf://buckets/"):
        if origin.startswith(prefix):
            name, _, revision = origin[len(prefix) :].partition("@")
            return "/".join(name.split("/")[:2]), revision or ("bucket" if "buckets" in prefix else "unpinned")
    if origin and "://" not in origin:
        return f"local folder {Path(origin).name}", "unpinned"
    return origin or f"tables {folder}", "unpinned"


def cache_items() -> list[CacheItem]:
    return [*index_items(), *meta_items(), *table_items(), *byte_items()]


def byte_cache_line(root: Path | None = None) -> str | None:
    """Where the disk byte cache is, how much it holds of its default bound; ``None`` when it holds nothing."""
    root = root or default_byte_cache_root()
    blocks, held, files = scan_blocks(root)
    if not blocks and not held:
        return None
    bound = ByteRangeCache(root).bound(held)
    return (f"byte cache {root}: {human_bytes(held)} in {files} files ({len(blocks)} blocks), default bound "
            f"{human_bytes(bound)} (the smaller of 50 GB and a quarter of the free space; "
            "--dataset.streaming_disk_cache_gb sets it)")


def human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def run_cache_list() -> int:
    items = cache_items()
    if not items:
        print(f"the caches are empty: {default_cache_root()}, {default_file_cache_root()}, {default_byte_cache_root()}")
        return 0
    rows = [("kind", "dataset", "revision", "records", "on disk", "path")]
    rows += [(i.kind, i.dataset, i.revision[:12], str(i.records), human_bytes(i.size_bytes), str(i.path)) for i in items]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
    line = byte_cache_line()
    if line is not None:
        print(line)
    total = sum(i.size_bytes for i in items)
    print(f"{len(items)} entries, {human_bytes(total)}")
    return 0


def run_cache_clear(repo_id: str | None, clear_all: bool) -> int:
    items = [i for i in cache_items() if clear_all or (repo_id is not None and i.matches(repo_id))]
    if not items:
        print(f"nothing to clear: no cache entry {'at all' if clear_all else f'of {repo_id}'}")
        return 0
    removed = kept = 0
    freed = 0
    for item in items:
        held_by = _remove(item)
        if held_by is None:
            removed += 1
            freed += item.size_bytes
            print(f"removed {item.kind} of {item.dataset} @ {item.revision[:12]}: {item.path}")
        else:
            kept += 1
            print(f"kept {item.kind} of {item.dataset} @ {item.revision[:12]}: its lock is held by {held_by} ({item.path})")
    print(f"removed {removed} entries ({human_bytes(freed)})" + (f", kept {kept} in use" if kept else ""))
    return 0


def _remove(item: CacheItem) -> str | None:
    """Remove ``item``'s folder; return who holds its lock instead when a live process does."""
    lock_path = item.path / LOCK_NAME
    if item.kind != "indexes" or not lock_path.exists():
        shutil.rmtree(item.path, ignore_errors=True)
        return None
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        # A live process builds or converts indexes of this entry (the OS frees a dead holder's lock).
        return BuildLock(lock_path, 0, "").owner()
    try:
        # Processes that mapped a record keep reading it: unlinking does not touch mapped pages.
        for child in item.path.iterdir():
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            elif child.name != LOCK_NAME:
                child.unlink(missing_ok=True)
    finally:
        lock.release()
    shutil.rmtree(item.path, ignore_errors=True)
    return None
