"""Answers of the Hub shared by every process of one node: one fetches, the others wait and read it.

All ranks of a node and all their DataLoader workers open the same dataset at about the same
time. Without sharing, each would resolve the revision, list the tree and read ``meta/`` itself,
and the Hub's per-user rate limits (1,000 API calls per 5 minutes for a free user) are spent at
training start. Here each answer is fetched by one process under a per-answer file lock
(``filelock``; the kernel releases it if the holder dies) and written atomically to
``$HF_LEROBOT_HOME/streaming-meta/hub/``; the processes that waited read it.

- **How long an answer is reused** is the caller's choice (:meth:`NodeCache.shared`): forever
  for what a commit sha pins (a revision given as a sha, its tree, ``meta/`` files by content);
  :func:`moving_ttl_s` for what may move (a branch or tag's commit, the ref list, a bucket
  listing): within one job (:func:`job_id`: torchrun, SLURM, PBS, LSF, or
  ``LEROBOT_NODES_JOB_ID``) the ranks of the node share it for :data:`MOVING_REF_TTL_S`
  (``LEROBOT_NODES_HUB_REF_TTL_S`` overrides it), so they all read the same commit; outside a job
  it is shared only with the processes that were waiting for it, so a new run always asks again.
- **Negative answers** (a revision or repo that is not there, :class:`SourceFileNotFoundError`)
  are shared the same way, never longer than :func:`moving_ttl_s`.
- **Redirect targets** (:class:`LocationStore`): the signed CDN URL a resolver answered for a file,
  shared until its expiry, so a file costs one resolver call per node per URL lifetime. Entries
  are written with mode ``0600`` (a signed URL grants access to that one file until it expires).
- **Never an error**: a folder that cannot be written, or a lock not released within
  :data:`LOCK_WAIT_S`, makes a process fetch for itself (logged once per folder).

No token ever reaches a path or an entry: keys are hashed, values are Hub answers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import SourceFileNotFoundError
from ..home import lerobot_home

log = logging.getLogger("lerobot_nodes.sources")

NODE_CACHE_DIR = "hub"
MOVING_REF_TTL_S = 300.0
"""How long the ranks of one job on a node reuse a branch or tag's commit, a ref list, a bucket listing
(one window of the Hub's rate limits)."""
REF_TTL_ENV = "LEROBOT_NODES_HUB_REF_TTL_S"
LOCK_WAIT_S = 300.0
"""How long a process waits for another one fetching the same answer before fetching it itself."""
JOB_ID_ENVS = ("LEROBOT_NODES_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")
"""Where the id of the job a process belongs to is read (the first one set)."""

_warned: set[str] = set()


def moving_ref_ttl_s() -> float:
    """:data:`MOVING_REF_TTL_S`, or ``$LEROBOT_NODES_HUB_REF_TTL_S`` (seconds, read now)."""
    value = os.environ.get(REF_TTL_ENV, "").strip()
    try:
        return max(0.0, float(value)) if value else MOVING_REF_TTL_S
    except ValueError:
        return MOVING_REF_TTL_S


def job_id() -> str | None:
    """The id of the job this process belongs to (torchrun, SLURM, PBS, LSF), if any."""
    for name in JOB_ID_ENVS:
        value = os.environ.get(name, "").strip()
        if value and value != "none":
            return f"{name}={value}"
    return None


def moving_ttl_s() -> float:
    """How long an answer that may move is reused: :func:`moving_ref_ttl_s` within a job, else 0
    (shared only with the processes waiting for it)."""
    return moving_ref_ttl_s() if job_id() else 0.0


def default_node_cache_root() -> Path:
    """``$HF_LEROBOT_HOME/streaming-meta/hub``."""
    return lerobot_home() / "streaming-meta" / NODE_CACHE_DIR


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _warn_once(folder: Path, error: BaseException) -> None:
    if str(folder) not in _warned:
        _warned.add(str(folder))
        log.warning("cannot share Hub answers through %s (%s: %s): this process asks the Hub itself", folder,
                    type(error).__name__, error)


def _write(path: Path, payload: dict[str, Any]) -> None:
    """Install ``payload`` at ``path`` atomically (no fsync: a lost entry is only fetched again)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(payload, out)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _read(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


@contextlib.contextmanager
def file_lock(path: Path, folder: Path) -> Iterator[bool]:
    """Hold the lock file ``path`` (``True``), or yield ``False`` when it cannot be taken in time."""
    from filelock import FileLock, Timeout

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path), timeout=LOCK_WAIT_S)
        lock.acquire()
    except Timeout:
        log.warning("waited %.0f s for %s: fetching without it", LOCK_WAIT_S, path)
        yield False
        return
    except OSError as error:
        _warn_once(folder, error)
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


class NodeCache:
    """JSON answers under ``folder`` (default ``$HF_LEROBOT_HOME/streaming-meta/hub``), one fetch per node."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else default_node_cache_root()

    def _entry(self, key: str) -> Path:
        return self.folder / "answers" / f"{_digest(key)}.json"

    def _fresh(self, key: str, ttl_s: float | None, since: float) -> dict[str, Any] | None:
        payload = _read(self._entry(key))
        if payload is None or payload.get("key") != key:
            return None
        at = float(payload.get("at", 0.0))
        if "missing" in payload:
            ttl_s = min(ttl_s, moving_ttl_s()) if ttl_s is not None else moving_ttl_s()
        if ttl_s is None or time.time() - at <= ttl_s or at >= since:
            return payload
        return None

    def shared(self, key: str, fetch: Callable[[], Any], *, ttl_s: float | None) -> Any:
        """``fetch()`` (a JSON value) fetched once per node and reused for ``ttl_s`` seconds (``None``:
        forever). Processes that wait while another one fetches get its answer whatever ``ttl_s``.
        A :class:`SourceFileNotFoundError` of ``fetch`` is shared too, and raised again."""
        since = time.time()
        payload = self._fresh(key, ttl_s, since)
        if payload is None:
            entry = self._entry(key)
            with file_lock(entry.with_suffix(".lock"), self.folder) as locked:
                payload = self._fresh(key, ttl_s, since) if locked else None
                if payload is None:
                    payload = {"key": key}
                    try:
                        payload["value"] = fetch()
                    except SourceFileNotFoundError as error:
                        payload["missing"] = str(error)
                    payload["at"] = time.time()
                    if locked:
                        try:
                            _write(entry, payload)
                        except OSError as error:
                            _warn_once(self.folder, error)
        if "missing" in payload:
            raise SourceFileNotFoundError(str(payload["missing"]))
        return payload["value"]


class LocationStore:
    """Redirect targets of files (``url`` -> signed ``location`` until a wall-clock expiry), shared by a node.

    Picklable: only the folder travels.
    """

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else default_node_cache_root()

    def _entry(self, url: str) -> Path:
        digest = _digest(url)
        return self.folder / "locations" / digest[:2] / f"{digest}.json"

    def get(self, url: str) -> tuple[str, float] | None:
        """``(location, expires_at)`` (``time.time()`` seconds) while it has not expired, else ``None``."""
        payload = _read(self._entry(url))
        if payload is None or payload.get("url") != _digest(url + "#url"):
            return None
        expires = float(payload.get("expires", 0.0))
        if expires <= time.time():
            return None
        return str(payload["location"]), expires

    def put(self, url: str, location: str, expires_at: float) -> None:
        try:
            _write(self._entry(url), {"url": _digest(url + "#url"), "location": location, "expires": expires_at})
        except OSError as error:
            _warn_once(self.folder, error)

    def drop(self, url: str, location: str) -> None:
        """Forget ``url``'s target if it is still ``location`` (a CDN refused it)."""
        found = self.get(url)
        if found is not None and found[0] == location:
            with contextlib.suppress(OSError):
                self._entry(url).unlink()

    def lock(self, url: str) -> contextlib.AbstractContextManager[bool]:
        """The lock one process of the node holds while it asks the resolver for ``url``'s target."""
        return file_lock(self._entry(url).with_suffix(".lock"), self.folder)
