"""The process lock that serialises the building and conversion of one cache entry."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from filelock import FileLock, Timeout

from ..atomic import atomic_write
from ..errors import SidecarLockTimeoutError

log = logging.getLogger("lerobot_nodes.sidecar")

# While waiting, say so again this often, so a long wait is visible in the logs.
_WAIT_LOG_INTERVAL_S = 60.0


class BuildLock:
    """An exclusive inter-process lock on ``path`` (an OS file lock via ``filelock``).

    Guarantees: at most one process holds it at a time; the OS releases it when the holder
    exits, even on SIGKILL, so a lock file left on disk never blocks anyone by itself. A
    process that has to wait logs that it waits (and on whom); after ``timeout_s`` seconds
    (``None``: forever) it raises :class:`SidecarLockTimeoutError` naming the lock file.
    """

    def __init__(self, path: str | os.PathLike[str], timeout_s: float | None, purpose: str) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.purpose = purpose
        self.waited_s = 0.0
        self._lock = FileLock(str(self.path))

    @property
    def owner_path(self) -> Path:
        return self.path.with_name(self.path.name + ".owner.json")

    def owner(self) -> str:
        """Who last took the lock, as recorded beside it (``unknown`` when not recorded)."""
        try:
            info = json.loads(self.owner_path.read_text())
            return f"pid {info['pid']} on {info['host']} since {info['since']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "unknown"

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            self._wait()
        self._record_owner()

    def _wait(self) -> None:
        started = time.monotonic()
        limit = "no time limit" if self.timeout_s is None else f"up to {self.timeout_s:g} s"
        log.info("waiting (%s) for the sidecar lock %s, held by %s, to %s", limit, self.path, self.owner(), self.purpose)
        while True:
            remaining = None if self.timeout_s is None else self.timeout_s - (time.monotonic() - started)
            if remaining is not None and remaining <= 0:
                self.waited_s = time.monotonic() - started
                raise SidecarLockTimeoutError(self._timeout_message())
            step = _WAIT_LOG_INTERVAL_S if remaining is None else min(remaining, _WAIT_LOG_INTERVAL_S)
            try:
                self._lock.acquire(timeout=step)
            except Timeout:
                log.info("still waiting for the sidecar lock %s (%.0f s so far)", self.path, time.monotonic() - started)
                continue
            self.waited_s = time.monotonic() - started
            log.info("acquired the sidecar lock %s after waiting %.1f s", self.path, self.waited_s)
            return

    def _timeout_message(self) -> str:
        return (
            f"timed out after {self.timeout_s:g} s waiting for the sidecar lock {self.path} "
            f"(needed to {self.purpose}); it is held by {self.owner()}. Another process may still be "
            f"indexing the same dataset revision: check that it is healthy. The lock is released "
            f"automatically when its holder exits, so a lock file left by a crashed process does not "
            f"block; remove {self.path} only when no process is using it. For big datasets raise "
            f"--dataset.streaming_sidecar_lock_timeout_s (now {self.timeout_s:g})."
        )

    def _record_owner(self) -> None:
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        try:
            with atomic_write(self.owner_path) as out:
                out.write(json.dumps(owner).encode())
        except OSError:
            pass  # diagnostics only

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> BuildLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()
