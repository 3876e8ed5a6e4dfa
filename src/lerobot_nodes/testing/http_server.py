"""The HTTP plumbing every loopback test server shares: origins, requests, answers, faults.

:class:`LoopbackServers` runs one or more threaded HTTP/1.1 origins on loopback (keep-alive,
Nagle off), each answering through its :class:`Routes`: a route gets a parsed :class:`Request`
and returns a :class:`Response`, or raises :class:`HttpError` for an error answer (sent with
``X-Error-Message`` / ``X-Error-Code`` headers). :func:`content` answers byte ranges of any
:class:`Payload` (200, 206 or 416), :func:`json_answer` and :func:`error_answer` the rest.

Every request on every origin is recorded as a :class:`RequestRecord` just before its answer
(or its fault) reaches the client. Every answer waits ``latency_s`` first, and every
``fault_every``-th range read gets the next of ``fault_kinds`` in rotation (503, 429, TCP reset,
close, short body, stall). ``stop()`` ends every server and connection thread, stalled and
keep-alive ones included.

What is served, and from which address, is the subclasses' business (the loopback Hub in
:mod:`~lerobot_nodes.testing.hub`, the static file server in
:mod:`~lerobot_nodes.testing.static_http`); this module knows only HTTP.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import struct
import sys
import threading
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote

__all__ = [
    "FAULT_KINDS",
    "LOOPBACK_HOST",
    "HttpError",
    "LoopbackServers",
    "Origin",
    "Payload",
    "Request",
    "RequestRecord",
    "Response",
    "Routes",
    "content",
    "error_answer",
    "json_answer",
]

LOOPBACK_HOST = "127.0.0.1"
FAULT_KINDS = ("503", "429", "reset", "close", "short", "stall")
_CHUNK = 1024 * 1024  # the largest piece of a body written at once


class HttpError(Exception):
    """An error answer: status, message (sent as ``X-Error-Message``) and optional ``X-Error-Code``."""

    def __init__(
        self, status: int, message: str, code: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})


class Payload(Protocol):
    """Bytes that can be served in ranges (a Hub blob, a file on disk)."""

    @property
    def size(self) -> int: ...

    def read(self, start: int, end: int) -> bytes: ...


@dataclass
class Request:
    method: str
    raw_path: str
    segments: list[str]  # the raw path split on "/", each piece unquoted
    query: dict[str, list[str]]
    headers: Message
    body: bytes
    repo_revision: str | None = None  # set by the Hub's router on repo resolve requests

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None

    def flag(self, name: str) -> bool:
        return (self.param(name) or "").lower() in ("1", "true")

    def json_object(self) -> dict[str, Any]:
        """The body as a JSON object (``{}`` when empty); 400 for anything else."""
        try:
            payload = json.loads(self.body or b"{}")
        except ValueError as error:
            raise HttpError(400, f"invalid JSON body: {error}") from None
        if not isinstance(payload, dict):
            raise HttpError(400, "the JSON body must be an object")
        return payload


@dataclass
class Response:
    """An answer; the body is either ``body`` or the ``[start, end)`` slice of ``payload``."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    payload: Payload | None = None
    start: int = 0
    end: int = 0

    @property
    def length(self) -> int:
        return self.end - self.start if self.payload is not None else len(self.body)

    def chunks(self, limit: int) -> Iterator[bytes]:
        """The first ``limit`` body bytes, in pieces of at most 1 MiB."""
        if self.payload is None:
            yield self.body[:limit]
            return
        position, stop = self.start, self.start + min(limit, self.length)
        while position < stop:
            chunk = self.payload.read(position, min(position + _CHUNK, stop))
            if not chunk:
                return
            position += len(chunk)
            yield chunk


class Routes(Protocol):
    """What one origin answers."""

    def handle(self, request: Request) -> Response: ...


def json_answer(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    body = json.dumps(payload).encode()
    return Response(status, {"Content-Type": "application/json", **(headers or {})}, body)


def error_answer(error: HttpError) -> Response:
    headers = {"X-Error-Message": error.message, **error.headers}
    if error.code is not None:
        headers["X-Error-Code"] = error.code
    return json_answer({"error": error.message}, error.status, headers)


def content(payload: Payload, range_header: str | None, headers: Mapping[str, str]) -> Response:
    """200 with the whole payload, or 206 with the requested range (416 raised when unsatisfiable)."""
    headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **headers}
    try:
        span = _parse_range(range_header, payload.size)
    except HttpError as error:
        error.headers = {**headers, **error.headers}
        raise
    if span is None:
        return Response(200, headers, payload=payload, start=0, end=payload.size)
    start, end = span
    headers["Content-Range"] = f"bytes {start}-{end - 1}/{payload.size}"
    return Response(206, headers, payload=payload, start=start, end=end)


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``[start, end)`` of a single ``bytes=`` range, None to send everything (absent or malformed).

    Raises 416 when the range starts at or past the end. Malformed or multi-range headers are
    ignored, as RFC 9110 allows (and as CDNs do).
    """
    if header is None:
        return None
    match = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if match is None or not (match[1] or match[2]):
        return None
    unsatisfiable = HttpError(416, "Range Not Satisfiable", headers={"Content-Range": f"bytes */{size}"})
    if not match[1]:  # suffix range: the last N bytes
        suffix = int(match[2])
        if suffix == 0 or size == 0:
            raise unsatisfiable
        return max(0, size - suffix), size
    start = int(match[1])
    if match[2] and int(match[2]) < start:
        return None
    if start >= size:
        raise unsatisfiable
    return start, min(int(match[2]) + 1, size) if match[2] else size


@dataclass
class RequestRecord:
    """One request handled by any origin.

    Appended to ``LoopbackServers.records`` just before its answer (or its fault) reaches the
    client, so a client that has its answer always finds the record.
    """

    origin: str  # the origin's name: "hub" or "cdn" (a static server: "static")
    method: str
    path: str  # raw request path, still quoted, without the query
    query: str
    status: int  # 0 when a fault dropped the connection without any answer
    range: str | None  # the Range header as sent
    bytes_sent: int  # body bytes written (lowered if the client hung up mid-body)
    authorization: bool  # whether an Authorization header was present
    fault: str | None  # injected fault kind
    repo_revision: str | None  # repo resolve requests: the revision segment of the URL, unquoted


@dataclass(frozen=True)
class Origin:
    """One server to bind: its name in the records, its routes, and where it listens.

    ``port`` 0 takes any free port. Where ``host`` cannot be bound (another 127.x address off
    Linux), the origin falls back to 127.0.0.1.
    """

    name: str
    routes: Routes
    port: int = 0
    host: str = LOOPBACK_HOST


# ----------------------------------------------------------------------------- one connection


class _Handler(BaseHTTPRequestHandler):
    """One connection: answers requests until the client or ``stop()`` closes it."""

    protocol_version = "HTTP/1.1"  # keep-alive, so client pools reuse connections
    # Without it headers and body leave as two segments and Nagle + delayed ACK add ~40 ms.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: tests read ``records`` instead, and nothing (no token) ever reaches a log."""

    def do_GET(self) -> None:
        self._handle()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_GET

    def _handle(self) -> None:
        """Answer one request. Its record is appended *before* the answer (or the fault) reaches
        the client, so a client that got an answer always finds the record in ``records``."""
        servers = self.server.owner
        raw_path, _, query = self.path.partition("?")
        range_header = self.headers.get("Range")
        authorization = "Authorization" in self.headers
        record = RequestRecord(
            self.server.origin, self.command, raw_path, query, 0, range_header, 0, authorization, None, None
        )
        recorded = False
        servers._arrived()
        try:
            request = Request(
                self.command,
                raw_path,
                [unquote(s) for s in raw_path.split("/") if s],
                parse_qs(query, keep_blank_values=True),
                self.headers,
                self._read_body(),
            )
            servers._pause(servers.latency_s)
            fault = record.fault = servers._take_fault() if range_header is not None else None
            if fault == "stall":
                servers._pause(servers.stall_s)
            if servers._stopping.is_set():  # stop() cut a sleep short: close instead of answering
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
                    servers._defer_fault(fault)
                    fault = record.fault = None
            if response is not None:
                record.status = response.status
                # Counted ahead of the writes for the same reason; a failed write corrects it.
                record.bytes_sent = _body_bytes(response, self.command, half=fault == "short")
            servers._record(record)
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
                servers._record(record)
            servers._left()

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


# ----------------------------------------------------------------------------- one origin


class _Server(ThreadingHTTPServer):
    """A threaded server that tracks its connections, so ``stop()`` can end every handler thread.

    Keep-alive handler threads otherwise sit in ``readline`` for as long as a client pool holds
    the connection open, outliving the servers.
    """

    daemon_threads = True

    def __init__(self, owner: LoopbackServers, origin: Origin) -> None:
        self.owner = owner
        self.origin = origin.name
        self.routes = origin.routes
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        try:
            super().__init__((origin.host, origin.port), _Handler)
        except OSError:
            super().__init__((LOOPBACK_HOST, origin.port), _Handler)

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


# ----------------------------------------------------------------------------- the servers


class LoopbackServers:
    """What every loopback test server shares: threaded HTTP/1.1 origins on loopback, a record of
    every request, latency and injected faults on range reads, and a ``stop()`` that ends every
    server and connection thread. ``latency_s``, ``fault_every``, ``fault_kinds`` and ``stall_s``
    may be changed while the servers run.

    A subclass's ``start()`` binds its origins with ``_bind`` (all of them or none), reads their
    URLs, then serves them with ``_serve``.
    """

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
        self._answering = 0
        self.peak_answering = 0
        """The most requests answered at once (arrived, answer not yet written) since the last
        :meth:`clear_records`: how many a client keeps in flight, seen from the server."""
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

    def _bind(self, origins: Sequence[Origin]) -> list[_Server]:
        """Bind every origin, in order; if one cannot be bound, close the others and raise. Servers
        start once: ``stop()`` cannot be undone, its sleeps would not wait."""
        if self._servers or self._stopping.is_set():
            raise RuntimeError(f"a {type(self).__name__} starts once")
        servers: list[_Server] = []
        try:
            for origin in origins:
                servers.append(_Server(self, origin))
        except OSError:  # e.g. a port already taken
            for server in servers:
                server.server_close()
            raise
        return servers

    def _serve(self, servers: list[_Server]) -> None:
        """Serve servers bound by ``_bind`` from daemon threads."""
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
            self.peak_answering = self._answering

    def range_reads(self) -> list[RequestRecord]:
        """Requests that carried a Range header, on every origin."""
        return [r for r in self._snapshot() if r.range is not None]

    def bytes_sent(self) -> int:
        """Body bytes written by every origin."""
        return sum(r.bytes_sent for r in self._snapshot())

    def _snapshot(self) -> list[RequestRecord]:
        with self._records_lock:
            return list(self.records)

    # used by the handler threads

    def _record(self, record: RequestRecord) -> None:
        with self._records_lock:
            self.records.append(record)

    def _arrived(self) -> None:
        with self._records_lock:
            self._answering += 1
            self.peak_answering = max(self.peak_answering, self._answering)

    def _left(self) -> None:
        with self._records_lock:
            self._answering -= 1

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
