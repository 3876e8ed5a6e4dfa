"""A loopback Hugging Face Hub that the real ``huggingface_hub`` client can talk to, for tests and demos.

Two stdlib HTTP/1.1 servers on loopback ephemeral ports (the Hub on 127.0.0.1, its CDN on
127.0.0.2 where the system allows it), nothing beyond loopback:

* the **Hub origin** (``endpoint``) answers the ``/api/...`` routes for dataset repos and storage
  buckets, the ``/resolve/`` file reads, and the few writes needed to publish sidecars
  (``create_branch``, ``upload_file``);
* the **CDN origin** (``cdn_endpoint``) serves LFS and bucket payloads behind signed, expiring
  URLs, the way the real Hub answers ``/resolve`` with a 302 to its CDN.

Wire shapes follow what huggingface_hub 2.4.0 sends and expects, as seen with the real client.
Every request on both origins is recorded as a :class:`RequestRecord`, and range reads can be made
slow or faulty (503, 429, TCP reset, close, short body, stall) to test a reader's resilience.

Content is immutable once committed: commits, tags and signed URLs share immutable blobs, so a
read pinned to a commit sha always returns the same bytes. Files added from a folder are read from
disk when served; the folder must not change while the hub runs.

There is no Xet here: Xet token routes answer 501, so clients must run with ``HF_HUB_DISABLE_XET=1``.
Unimplemented routes answer 404 (reads) or 501 (writes), never 500/502/503/504, which the client
would retry for about 23 s.

This module is the hub's face: :class:`LoopbackHub` (adding and changing content, the
observations tests make, the settings) and the command line. The HTTP plumbing, records, latency
and faults are :mod:`~lerobot_nodes.testing.http_server`'s; what each origin answers is
:mod:`~lerobot_nodes.testing.hub_routes`'s; repos, buckets and signed URLs are
:mod:`~lerobot_nodes.testing.hub_store`'s.

Run ``python -m lerobot_nodes.testing.hub --demo`` to serve a generated dataset from the shell.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from lerobot_nodes.testing.http_server import (
    FAULT_KINDS,
    LOOPBACK_HOST,
    HttpError,
    LoopbackServers,
    Origin,
    RequestRecord,
)
from lerobot_nodes.testing.hub_routes import CdnRoutes, HubRoutes, HubSettings
from lerobot_nodes.testing.hub_store import Blob, Bucket, BucketObject, Repo, Store, iso

__all__ = ["FAULT_KINDS", "LoopbackHub", "LoopbackServers", "RequestRecord", "main"]

HUB_HOST = LOOPBACK_HOST
CDN_HOST = "127.0.0.2"  # another origin for clients, still loopback (any 127.x address is, on Linux)
DEMO_REPO_ID = "lerobot-nodes/demo"

_WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})
_IGNORED_DIRS = (".git/", ".cache/huggingface/")  # what upload_folder leaves out too


# ----------------------------------------------------------------------------- the hub


class LoopbackHub(LoopbackServers):
    """A Hugging Face Hub on 127.0.0.1 for the real client: dataset repos, buckets, a CDN, faults.

    Guarantees: repos behave like git (commits are immutable snapshots; branches move, tags and
    shas pin); LFS payloads (parquet, mp4, npz, ... and other files of 10 KB or more) are served
    through a 302 to the CDN origin when ``redirect`` is on; every request on either origin is
    recorded; ``stop()`` ends every server and connection thread. ``latency_s``, ``fault_every``,
    ``fault_kinds``, ``stall_s``, ``redirect``, ``signed_url_ttl_s`` and ``require_token`` may be
    changed while the hub runs.
    """

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        fault_every: int = 0,
        fault_kinds: Sequence[str] = ("503", "reset", "close", "short", "stall"),
        stall_s: float = 3.0,
        redirect: bool = True,
        signed_url_ttl_s: float = 3600.0,
        require_token: str | None = None,
        port: int = 0,
    ) -> None:
        super().__init__(latency_s=latency_s, fault_every=fault_every, fault_kinds=fault_kinds, stall_s=stall_s)
        self.port = port
        self._store = Store()
        self._settings = HubSettings(
            self._store, redirect=redirect, signed_url_ttl_s=signed_url_ttl_s, require_token=require_token
        )

    @property
    def redirect(self) -> bool:
        """Whether LFS and bucket payloads answer a 302 to the CDN (else the Hub serves them)."""
        return self._settings.redirect

    @redirect.setter
    def redirect(self, value: bool) -> None:
        self._settings.redirect = value

    @property
    def signed_url_ttl_s(self) -> float:
        """How long a CDN URL handed out from now on stays valid."""
        return self._settings.signed_url_ttl_s

    @signed_url_ttl_s.setter
    def signed_url_ttl_s(self, value: float) -> None:
        self._settings.signed_url_ttl_s = value

    @property
    def rate_limits(self) -> dict[str, tuple[int, float]]:
        """The Hub's per-user quotas: request class (``"api"``: ``/api/...``; ``"resolvers"``:
        ``/resolve/...`` and bucket file URLs) -> ``(requests, window_s)``, counted in fixed windows
        (the first request opens one). A request over quota is answered 429 with the Hub's headers:
        ``RateLimit: "api";r=0;t=<s>``, ``RateLimit-Policy: "fixed window";"api";q=<n>;w=<s>`` and
        ``Retry-After``. Empty (the default): no limits. CDN reads are never limited."""
        return self._settings.rate_limits

    @rate_limits.setter
    def rate_limits(self, value: Mapping[str, tuple[int, float]]) -> None:
        self._settings.rate_limits = dict(value)

    def rate_limited(self) -> list[RequestRecord]:
        """The requests answered 429 (quota or an injected fault)."""
        return [r for r in self._snapshot() if r.status == 429]

    @property
    def require_token(self) -> str | None:
        """The token every Hub request must carry as ``Bearer <token>`` (None: anonymous reads)."""
        return self._settings.require_token

    @require_token.setter
    def require_token(self, value: str | None) -> None:
        self._settings.require_token = value

    @property
    def endpoint(self) -> str:
        """The Hub origin's URL (``""`` until started)."""
        return self._settings.endpoint

    @property
    def cdn_endpoint(self) -> str:
        """The CDN origin's URL (``""`` until started)."""
        return self._settings.cdn_endpoint

    def start(self) -> LoopbackHub:
        """Bind both origins and serve them from daemon threads. A hub starts once."""
        hub, cdn = self._bind(
            [
                Origin("hub", HubRoutes(self._settings), self.port, HUB_HOST),
                # A host of its own, as on the real Hub: clients that follow only same-host
                # redirects (huggingface_hub 1.x's HEAD) must see it as another origin.
                Origin("cdn", CdnRoutes(self._store), host=CDN_HOST),
            ]
        )
        self._settings.endpoint, self._settings.cdn_endpoint = hub.url, cdn.url
        self._serve([hub, cdn])
        return self

    def __enter__(self) -> LoopbackHub:
        return self.start()

    # content

    def add_dataset(
        self, repo_id: str, folder: str | Path, *, tags: Sequence[str] = ("v3.0",), branch: str = "main"
    ) -> str:
        """Commit every file under ``folder`` as one commit on ``branch`` (replacing what was there).

        Paths are posix and relative to ``folder``; ``.git/`` and ``.cache/huggingface/`` are left out.
        ``tags`` are created or moved to the new commit. Returns its 40-hex sha.
        """
        root = Path(folder)
        if not root.is_dir():
            raise NotADirectoryError(f"not a folder: {root}")
        files = {}
        for source in sorted(p for p in root.rglob("*") if p.is_file()):
            path = source.relative_to(root).as_posix()
            if not path.startswith(_IGNORED_DIRS):
                files[path] = Blob.of_file(path, source)
        with self._store.lock:
            repo = self._store.repos.setdefault(repo_id, Repo(repo_id, branch))
            commit = repo.commit(branch, files, f"Upload {root.name}")
            for tag in tags:
                repo.tags[tag] = commit.sha
        return commit.sha

    def commit_files(
        self,
        repo_id: str,
        files: Mapping[str, bytes | None],
        *,
        branch: str = "main",
        message: str = "update",
    ) -> str:
        """A new commit on an existing ``branch``, from its head: bytes add or replace, None deletes.

        Raises KeyError for an unknown repo, branch, or deleted path. Returns the commit sha.
        """
        additions = {p: Blob.of_bytes(p, d) for p, d in files.items() if d is not None}
        deletions = [p for p, d in files.items() if d is None]
        try:
            return self._store.change(repo_id, branch, additions, deletions, title=message).sha
        except HttpError as error:
            raise KeyError(error.message) from None

    def tag(self, repo_id: str, tag: str, revision: str) -> None:
        """Point ``tag`` (created or moved) at ``revision`` (a branch, tag or sha)."""
        try:
            commit = self._store.commit_at(repo_id, revision)
        except HttpError as error:
            raise KeyError(error.message) from None
        with self._store.lock:
            self._store.repos[repo_id].tags[tag] = commit.sha

    def branch_head(self, repo_id: str, branch: str) -> str:
        """The commit sha ``branch`` points at (KeyError if the repo or branch is unknown)."""
        try:
            return self._store.branch_head(repo_id, branch).sha
        except HttpError as error:
            raise KeyError(error.message) from None

    def add_bucket(self, bucket_id: str, folder: str | Path) -> None:
        """Create bucket ``owner/name`` if needed and put every file under ``folder`` into it."""
        root = Path(folder)
        if not root.is_dir():
            raise NotADirectoryError(f"not a folder: {root}")
        now = iso(time.time())
        objects = {
            source.relative_to(root).as_posix(): BucketObject(
                Blob.of_file(source.relative_to(root).as_posix(), source), iso(source.stat().st_mtime), now
            )
            for source in sorted(p for p in root.rglob("*") if p.is_file())
        }
        with self._store.lock:
            self._store.buckets.setdefault(bucket_id, Bucket(bucket_id, now)).objects.update(objects)

    def put_bucket_object(self, bucket_id: str, path: str, data: bytes) -> None:
        """Add or replace one object of an existing bucket; new content gets a new ``xetHash``."""
        now = iso(time.time())
        obj = BucketObject(Blob.of_bytes(path, data), now, now)
        with self._store.lock:
            if bucket_id not in self._store.buckets:
                raise KeyError(f"unknown bucket {bucket_id}")
            self._store.buckets[bucket_id].objects[path] = obj

    def hide(self, path_suffix: str) -> None:
        """From now on, resolve and CDN reads of a file whose path is ``path_suffix`` (or ends with
        ``/path_suffix``) answer 404 EntryNotFound, in every repo and bucket. Listings still show
        it: the file vanished after the client listed it.
        """
        with self._store.lock:
            self._store.hidden.add(path_suffix.strip("/"))

    def unhide(self, path_suffix: str) -> None:
        with self._store.lock:
            self._store.hidden.discard(path_suffix.strip("/"))

    def expire_signed_urls(self) -> None:
        """Every CDN URL handed out so far answers 403 from now on; clients must resolve again."""
        self._store.expire_signed_urls()

    # observation

    def write_requests(self) -> list[RequestRecord]:
        """Requests that change state (or try to): POST/PUT/DELETE/PATCH except the read-only
        ``paths-info`` routes, plus Xet write-token requests."""
        return [r for r in self._snapshot() if _is_write(r)]


def _is_write(record: RequestRecord) -> bool:
    if "/xet-write-token" in record.path:
        return True
    return record.method in _WRITE_METHODS and "/paths-info" not in record.path


# ----------------------------------------------------------------------------- command line


def _pair(text: str) -> tuple[str, Path]:
    repo_id, sep, folder = text.partition("=")
    if not sep or repo_id.count("/") != 1 or not folder:
        raise argparse.ArgumentTypeError(f"expected OWNER/NAME=/path/to/folder, got {text!r}")
    return repo_id, Path(folder).expanduser()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lerobot_nodes.testing.hub",
        description="Serve local LeRobot datasets and buckets from a loopback Hugging Face Hub (127.0.0.1 only).",
    )
    parser.add_argument("--dataset", type=_pair, action="append", default=[], metavar="OWNER/NAME=FOLDER")
    parser.add_argument("--bucket", type=_pair, action="append", default=[], metavar="OWNER/B=FOLDER")
    parser.add_argument("--port", type=int, default=0, help="Hub origin port (0: any free port)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before every answer")
    parser.add_argument("--fault-every", type=int, default=0, help="fail every N-th range read (0: never)")
    parser.add_argument(
        "--demo", action="store_true", help=f"serve a small generated dataset as {DEMO_REPO_ID}"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until Ctrl-C or SIGTERM, after printing one line with the endpoint and a command to try."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.dataset and not args.bucket and not args.demo:
        parser.error("give --dataset OWNER/NAME=FOLDER, --bucket OWNER/B=FOLDER or --demo")
    for _, folder in args.dataset + args.bucket:
        if not folder.is_dir():
            parser.error(f"not a folder: {folder}")
    # SIGTERM ends the process like Ctrl-C: a handler that set an Event could deadlock on the lock
    # the main thread holds inside Event.wait when the signal lands there.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with tempfile.TemporaryDirectory(prefix="lerobot-nodes-hub-") as scratch:
            datasets = list(args.dataset)
            if args.demo:
                from lerobot_nodes.testing.dataset import write_dataset

                datasets.append((DEMO_REPO_ID, write_dataset(Path(scratch) / "demo", num_episodes=4)))
            hub = LoopbackHub(latency_s=args.latency_ms / 1000, fault_every=args.fault_every, port=args.port)
            for repo_id, folder in datasets:
                hub.add_dataset(repo_id, folder)
            for bucket_id, folder in args.bucket:
                hub.add_bucket(bucket_id, folder)
            with hub:
                print(_banner(hub, [r for r, _ in datasets], [b for b, _ in args.bucket]), flush=True)
                while True:
                    time.sleep(0.5)
    except KeyboardInterrupt:
        pass  # the with-blocks have stopped the hub and removed the scratch folder
    return 0


def _banner(hub: LoopbackHub, repo_ids: list[str], bucket_ids: list[str]) -> str:
    env = f"HF_ENDPOINT={hub.endpoint} HF_HUB_DISABLE_XET=1"
    if repo_ids:
        command = f"{env} lerobot-nodes stream --dataset.repo_id={repo_ids[0]}"
    else:
        command = f"{env} hf buckets ls {bucket_ids[0]} -R"
    return f"loopback hub at {hub.endpoint} (CDN {hub.cdn_endpoint}); try: {command}"


if __name__ == "__main__":
    raise SystemExit(main())
