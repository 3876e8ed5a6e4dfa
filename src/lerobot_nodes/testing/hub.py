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

Run ``python -m lerobot_nodes.testing.hub --demo`` to serve a generated dataset from the shell.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote

from lerobot_nodes.testing._hub_routes import (
    CdnRoutes,
    HubRoutes,
    Request,
    Response,
    error_answer,
    json_answer,
)
from lerobot_nodes.testing._hub_store import Blob, Bucket, BucketObject, HttpError, Repo, Store, iso

__all__ = ["FAULT_KINDS", "LoopbackHub", "LoopbackServers", "RequestRecord", "main"]

HUB_HOST = "127.0.0.1"
CDN_HOST = "127.0.0.2"
FAULT_KINDS = ("503", "429", "reset", "close", "short", "stall")
DEMO_REPO_ID = "lerobot-nodes/demo"

_WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})
_IGNORED_DIRS = (".git/", ".cache/huggingface/")  # what upload_folder leaves out too


@dataclass
class RequestRecord:
    """One request handled by either origin.

    Appended to ``LoopbackHub.records`` just before its answer (or its fault) reaches the client,
    so a client that has its answer always finds the record.
    """

    origin: str  # "hub" or "cdn" (a static server: "static")
    method: str
    path: str  # raw request path, still quoted, without the query
    query: str
    status: int  # 0 when a fault dropped the connection without any answer
    range: str | None  # the Range header as sent
    bytes_sent: int  # body bytes written (lowered if the client hung up mid-body)
    authorization: bool  # whether an Authorization header was present
    fault: str | None  # injected fault kind
    repo_revision: str | None  # repo resolve requests: the revision segment of the URL, unquoted


# ----------------------------------------------------------------------------- HTTP plumbing


class _Handler(BaseHTTPRequestHandler):
    """One connection: answers requests until the client or ``stop()`` closes it."""

    protocol_version = "HTTP/1.1"  # keep-alive, so client pools reuse connections
    # Without it headers and body leave as two segments and Nagle + delayed ACK add ~40 ms.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: tests read ``hub.records`` instead, and nothing (no token) ever reaches a log."""

    def do_GET(self) -> None:
        self._handle()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_GET

    def _handle(self) -> None:
        """Answer one request. Its record is appended *before* the answer (or the fault) reaches
        the client, so a client that got an answer always finds the record in ``hub.records``."""
        hub = self.server.hub
        raw_path, _, query = self.path.partition("?")
        range_header = self.headers.get("Range")
        authorization = "Authorization" in self.headers
        record = RequestRecord(
            self.server.origin, self.command, raw_path, query, 0, range_header, 0, authorization, None, None
        )
        recorded = False
        try:
            request = Request(
                self.command,
                raw_path,
                [unquote(s) for s in raw_path.split("/") if s],
                parse_qs(query, keep_blank_values=True),
                self.headers,
                self._read_body(),
            )
            hub._pause(hub.latency_s)
            fault = record.fault = hub._take_fault() if range_header is not None else None
            if fault == "stall":
                hub._pause(hub.stall_s)
            if hub._stopping.is_set():  # stop() cut a sleep short: close instead of answering
                raise ConnectionAbortedError
            response = None
            if fault in ("503", "429"):
                response = json_answer({"error": "injected fault"}, int(fault), {"Retry-After": "0"})
            elif fault not in ("reset", "close"):
                response = self._route(request)
                record.repo_revision = request.repo_revision
                if fault == "short" and (response.length == 0 or self.command == "HEAD"):
                    # Nothing to cut short (a redirect, a HEAD): the next range read gets it instead,
                    # so which kinds are served does not depend on the order of concurrent reads.
                    hub._defer_fault(fault)
                    fault = record.fault = None
            if response is not None:
                record.status = response.status
                # Counted ahead of the writes for the same reason; a failed write corrects it.
                record.bytes_sent = _body_bytes(response, self.command, half=fault == "short")
            hub._record(record)
            recorded = True
            if response is None:
                self._drop(reset=fault == "reset")
                return
            self._send(response, record)
            if fault == "short":
                self.close_connection = True
        except OSError:  # the client went away mid-answer (its timeout, a fault, or stop())
            self.close_connection = True
        finally:
            if not recorded:
                hub._record(record)

    def _route(self, request: Request) -> Response:
        try:
            return self.server.routes.handle(request)
        except HttpError as error:
            return error_answer(error)
        except Exception as error:
            # A bug here must fail fast: 501 is not retried by the client, 500 would be (~23 s).
            traceback.print_exc(file=sys.stderr)
            return error_answer(HttpError(501, f"loopback hub error: {type(error).__name__}"))

    def _read_body(self) -> bytes:
        """Always consume the body, so the next request on this connection starts in sync."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return b"".join(parts)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, response: Response, record: RequestRecord) -> None:
        """Write the answer; the body is cut to ``record.bytes_sent`` (half of it for "short")."""
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(response.length))  # always: keeps keep-alive working
        self.end_headers()
        written = 0
        try:
            for chunk in response.chunks(record.bytes_sent):
                self.wfile.write(chunk)
                written += len(chunk)
        except OSError:
            record.bytes_sent = written
            raise

    def _drop(self, reset: bool) -> None:
        """Close without any answer: a FIN, or with ``reset`` an RST (SO_LINGER 0 then close)."""
        self.close_connection = True
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # Close now: the server's own shutdown_request would send a FIN before the RST.
            self.rfile.close()
            self.connection.close()


def _body_bytes(response: Response, method: str, half: bool) -> int:
    if method == "HEAD":
        return 0
    return response.length // 2 if half else response.length


class _Routes(Protocol):
    def handle(self, request: Request) -> Response: ...


class _Server(ThreadingHTTPServer):
    """A threaded server that tracks its connections, so ``stop()`` can end every handler thread.

    Keep-alive handler threads otherwise sit in ``readline`` for as long as a client pool holds
    the connection open, outliving the hub.
    """

    daemon_threads = True

    def __init__(self, hub: LoopbackServers, origin: str, routes: _Routes, port: int = 0) -> None:
        self.hub = hub
        self.origin = origin
        self.routes = routes
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        # The CDN gets a host of its own, as on the real Hub: clients that follow only same-host
        # redirects (huggingface_hub 1.x's HEAD) must see it as another origin. Any 127.x address
        # is loopback on Linux; elsewhere fall back to 127.0.0.1.
        host = CDN_HOST if origin == "cdn" else HUB_HOST
        try:
            super().__init__((host, port), _Handler)
        except OSError:
            super().__init__((HUB_HOST, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve_connection,
            args=(request, client_address),
            name=f"loopback-hub-{self.origin}-connection",
            daemon=True,
        )
        with self._connections_lock:
            self._connections[request] = thread
        thread.start()

    def _serve_connection(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._connections_lock:
                self._connections.pop(request, None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up (faults, timeouts, stop()) are routine here, not worth a traceback.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def close_connections(self, timeout: float) -> None:
        with self._connections_lock:
            connections = list(self._connections.items())
        for connection, _ in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for _, thread in connections:
            thread.join(timeout)


# ----------------------------------------------------------------------------- the hub


class LoopbackServers:
    """What every loopback test server shares: threaded HTTP/1.1 origins on loopback, a record of
    every request, latency and injected faults on range reads, and a ``stop()`` that ends every
    server and connection thread. ``latency_s``, ``fault_every``, ``fault_kinds`` and ``stall_s``
    may be changed while the servers run."""

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        fault_every: int = 0,
        fault_kinds: Sequence[str] = ("503", "reset", "close", "short", "stall"),
        stall_s: float = 3.0,
    ) -> None:
        self.latency_s = latency_s
        self.fault_every = fault_every
        self.fault_kinds = fault_kinds
        self.stall_s = stall_s
        self.records: list[RequestRecord] = []
        self._records_lock = threading.Lock()
        self._faults_lock = threading.Lock()
        self._range_reads = 0
        self._faults_injected = 0
        self._deferred_faults: list[str] = []
        self._stopping = threading.Event()
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []

    @property
    def fault_kinds(self) -> tuple[str, ...]:
        return self._fault_kinds

    @fault_kinds.setter
    def fault_kinds(self, kinds: Sequence[str]) -> None:
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {list(FAULT_KINDS)}")
        self._fault_kinds = tuple(kinds)

    # lifecycle

    def start(self) -> LoopbackServers:
        raise NotImplementedError

    def _serve(self, servers: list[_Server]) -> None:
        """Serve ``servers`` from daemon threads. Servers start once."""
        if self._servers or self._stopping.is_set():  # stop() cannot be undone: sleeps would not wait
            for server in servers:
                server.server_close()
            raise RuntimeError(f"a {type(self).__name__} starts once")
        self._servers = servers
        for server in self._servers:
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"loopback-hub-{server.origin}-server",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop every origin and end every connection, including stalled and keep-alive ones."""
        self._stopping.set()  # wakes latency and stall sleeps
        for server in self._servers:
            server.shutdown()
            server.server_close()
            server.close_connections(timeout=5.0)
        for thread in self._threads:
            thread.join(5.0)
        self._servers, self._threads = [], []

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # observation

    def clear_records(self) -> None:
        with self._records_lock:
            self.records.clear()

    def range_reads(self) -> list[RequestRecord]:
        """Requests that carried a Range header, on every origin."""
        return [r for r in self._snapshot() if r.range is not None]

    def bytes_sent(self) -> int:
        """Body bytes written by every origin."""
        return sum(r.bytes_sent for r in self._snapshot())

    # used by the handler threads

    def _snapshot(self) -> list[RequestRecord]:
        with self._records_lock:
            return list(self.records)

    def _record(self, record: RequestRecord) -> None:
        with self._records_lock:
            self.records.append(record)

    def _pause(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)  # stop() cuts it short

    def _take_fault(self) -> str | None:
        """Count one range read; every ``fault_every``-th one gets the next fault kind in rotation,
        and a deferred fault goes to the very next range read."""
        with self._faults_lock:
            self._range_reads += 1
            every, kinds = self.fault_every, self.fault_kinds
            if every > 0 and self._deferred_faults:
                return self._deferred_faults.pop(0)
            if every <= 0 or not kinds or self._range_reads % every:
                return None
            kind = kinds[self._faults_injected % len(kinds)]
            self._faults_injected += 1
            return kind

    def _defer_fault(self, kind: str) -> None:
        """Hand a fault this request could not carry to the next range read."""
        with self._faults_lock:
            self._deferred_faults.append(kind)


class LoopbackHub(LoopbackServers):
    """A Hugging Face Hub on 127.0.0.1 for the real client: dataset repos, buckets, a CDN, faults.

    Guarantees: repos behave like git (commits are immutable snapshots; branches move, tags and
    shas pin); LFS payloads (parquet, mp4, npz, ... and other files of 10 KB or more) are served
    through a 302 to the CDN origin when ``redirect`` is on; every request on either origin is
    recorded; ``stop()`` ends every server and connection thread. ``latency_s``, ``fault_every``,
    ``fault_kinds`` and ``stall_s`` may be changed while the hub runs.
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
        self.redirect = redirect
        self.signed_url_ttl_s = signed_url_ttl_s
        self.require_token = require_token
        self.port = port
        self.endpoint = ""
        self.cdn_endpoint = ""
        self._store = Store()

    def start(self) -> LoopbackHub:
        """Bind both origins and serve them from daemon threads. A hub starts once."""
        if self._servers or self._stopping.is_set():  # stop() cannot be undone: sleeps would not wait
            raise RuntimeError("a LoopbackHub starts once")
        cdn = _Server(self, "cdn", CdnRoutes(self))
        try:
            hub = _Server(self, "hub", HubRoutes(self), self.port)
        except OSError:  # e.g. --port already taken
            cdn.server_close()
            raise
        self.endpoint, self.cdn_endpoint = hub.url, cdn.url
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
