"""A local cache of small remote files (``meta/``, listings), keyed by content identity.

Entries are immutable: a file's name holds its content identity (a commit sha, Xet hash or
ETag), so a changed remote file gets a new entry and nothing is ever invalidated in place.
Entries are installed atomically, and fetched by one process of the node at a time
(:meth:`FileCache.get_or_fetch`; the others wait on the entry's file lock, then read it). A cache folder that cannot be written is reported once and
the source goes on reading from the store; nothing else changes. No credentials ever reach
a path or an entry.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from pathlib import Path

from ..atomic import atomic_write
from ..home import lerobot_home

log = logging.getLogger("lerobot_nodes.sources")

CACHE_DIR_NAME = "streaming-meta"


def default_file_cache_root() -> Path:
    """``$HF_LEROBOT_HOME/streaming-meta``."""
    return lerobot_home() / CACHE_DIR_NAME


def slug(text: str) -> str:
    """A readable folder name for ``text`` (``owner/name`` becomes ``owner--name``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", text).strip("-") or "_"


class FileCache:
    """Immutable cached copies of remote files under one folder."""

    _warned: set[str] = set()

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def entry(self, path: str, identity: str) -> Path:
        digest = hashlib.sha256(f"{path}\0{identity}".encode()).hexdigest()[:24]
        return self.folder / f"{slug(path)}.{digest}"

    def get(self, path: str, identity: str) -> bytes | None:
        try:
            return self.entry(path, identity).read_bytes()
        except OSError:
            return None

    def put(self, path: str, identity: str, data: bytes) -> None:
        target = self.entry(path, identity)
        try:
            with atomic_write(target) as out:
                out.write(data)
        except OSError as error:
            if str(self.folder) not in FileCache._warned:
                FileCache._warned.add(str(self.folder))
                log.warning("cannot write the metadata cache %s (%s): reading metadata from the store at every open",
                            self.folder, error)

    def get_or_fetch(self, path: str, identity: str, fetch: Callable[[], bytes], valid: Callable[[bytes], bool]) -> bytes:
        """The cached entry if ``valid``, else ``fetch()`` (stored): one process of the node fetches,
        the others wait on the entry's lock and read what it stored."""
        cached = self.get(path, identity)
        if cached is not None and valid(cached):
            return cached
        from .node_cache import file_lock

        entry = self.entry(path, identity)
        with file_lock(entry.with_name(f".{entry.name}.lock"), self.folder) as locked:
            if locked:
                cached = self.get(path, identity)
                if cached is not None and valid(cached):
                    return cached
            data = fetch()
            self.put(path, identity, data)
            return data
