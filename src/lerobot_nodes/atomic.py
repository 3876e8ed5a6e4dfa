"""Atomic installation of files: readers see the previous file or the complete new one, never a part.

A file is written under a hidden temporary name in the destination folder, flushed to disk,
then renamed over the destination (``os.replace`` is atomic on POSIX file systems). A process
killed mid-write leaves only its hidden temporary file, which names the host and process that
wrote it so a later writer can delete it once that process is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_PARTIAL_SUFFIX = ".partial"
_PARTIAL_PATTERN = re.compile(r"^\.(?P<name>.+)\.(?P<host>[^.]+)\.(?P<pid>\d+)\.[0-9a-f]+\.partial$")


def _host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def partial_name(target: Path) -> Path:
    """A fresh hidden temporary name beside ``target``, tagged with this host and process."""
    token = secrets.token_hex(4)
    return target.with_name(f".{target.name}.{_host_tag()}.{os.getpid()}.{token}{_PARTIAL_SUFFIX}")


def is_partial(path: Path) -> bool:
    return _PARTIAL_PATTERN.match(path.name) is not None


def fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(target: str | os.PathLike[str], mode: int = 0o644) -> Iterator[BinaryIO]:
    """Open a temporary file (read-write, so it can be verified before it is installed); on a
    clean exit of the block it replaces ``target`` atomically.

    Guarantees: ``target`` is never partially written; an exception inside the block deletes
    the temporary file and leaves ``target`` as it was; on success the content is on disk
    (fsync of file and folder) before the function returns.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = partial_name(target)
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    handle = os.fdopen(fd, "w+b")
    try:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.replace(temporary, target)
    except BaseException:
        handle.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    fsync_directory(target.parent)


def _process_is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it belongs to someone else
    return True


def remove_dead_partials(directory: str | os.PathLike[str], target_name: str | None = None) -> list[Path]:
    """Delete temporary files in ``directory`` left by killed writers of this host.

    Only files whose writing process no longer exists are removed (a live writer's file is
    kept), and only those of ``target_name`` when given. Returns the removed paths.
    """
    folder = Path(directory)
    if not folder.is_dir():
        return []
    removed = []
    host = _host_tag()
    for entry in folder.iterdir():
        match = _PARTIAL_PATTERN.match(entry.name)
        if match is None or match["host"] != host:
            continue
        if target_name is not None and match["name"] != target_name:
            continue
        if _process_is_alive(int(match["pid"])):
            continue
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
            removed.append(entry)
    return removed
