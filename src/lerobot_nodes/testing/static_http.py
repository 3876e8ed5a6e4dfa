"""A static file server on 127.0.0.1 with byte ranges, like nginx or an S3 static website serving a
dataset folder, for tests and demos of plain ``http://`` dataset roots.

It runs on the HTTP plumbing of :mod:`~lerobot_nodes.testing.http_server`, as the loopback Hub
does: HTTP/1.1 keep-alive, every request recorded, latency and injected faults on range reads
(503, 429, TCP reset, close, short body, stall). It knows nothing of the Hub. Files are read from disk at each request, so a test
may replace one while the server runs; validators follow nginx: ``ETag`` is ``"<size>-<mtime>"``
(hex; strong, weak or absent) and ``Last-Modified`` the file's mtime (or absent). There is no
directory listing, as on a static server with ``autoindex off``. With ``redirect`` every file
answers a 302 to ``/_objects/<path>`` on the same server, as raw-file hosts send clients on to
their storage.

Run ``python -m lerobot_nodes.testing.static_http FOLDER`` to serve a folder from the shell.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from urllib.parse import quote

from lerobot_nodes.testing.http_server import HttpError, LoopbackServers, Origin, Request, Response, content

__all__ = ["ETAG_MODES", "StaticHttpServer", "main"]

ETAG_MODES = ("strong", "weak", "none")
OBJECTS = "_objects"


class StaticHttpServer(LoopbackServers):
    """Serves ``folder`` at ``{url}`` (``http://127.0.0.1:PORT{mount}``), GET and HEAD only, with ``Range``.

    ``etag``: ``"strong"``, ``"weak"`` (``W/"..."``) or ``"none"``; ``last_modified``: send the
    header or not; ``redirect``: answer files with a 302 to ``/_objects/<path>``. All three may be
    changed while the server runs. ``hide(path)`` makes a file answer
    404 and ``forbid(path)`` 403 (``path`` relative to ``folder``).
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        mount: str = "/ds",
        etag: str = "strong",
        last_modified: bool = True,
        redirect: bool = False,
        latency_s: float = 0.0,
        fault_every: int = 0,
        fault_kinds: Sequence[str] = ("503", "reset", "close", "short", "stall"),
        stall_s: float = 3.0,
        port: int = 0,
    ) -> None:
        super().__init__(latency_s=latency_s, fault_every=fault_every, fault_kinds=fault_kinds, stall_s=stall_s)
        self.folder = Path(folder).resolve()
        if not self.folder.is_dir():
            raise NotADirectoryError(f"not a folder: {self.folder}")
        self.mount = "/" + mount.strip("/") if mount.strip("/") else ""
        self.etag = etag
        self.last_modified = last_modified
        self.redirect = redirect
        self.port = port
        self.endpoint = ""
        self._hidden: set[str] = set()
        self._forbidden: set[str] = set()
        self._lock = threading.Lock()

    @property
    def etag(self) -> str:
        return self._etag

    @etag.setter
    def etag(self, mode: str) -> None:
        if mode not in ETAG_MODES:
            raise ValueError(f"etag must be one of {ETAG_MODES}, got {mode!r}")
        self._etag = mode

    @property
    def url(self) -> str:
        """The dataset root URL (the served folder)."""
        return f"{self.endpoint}{self.mount}"

    def start(self) -> StaticHttpServer:
        """Bind 127.0.0.1 and serve from daemon threads. A server starts once."""
        servers = self._bind([Origin("static", _StaticRoutes(self), self.port)])
        self.endpoint = servers[0].url
        self._serve(servers)
        return self

    def __enter__(self) -> StaticHttpServer:
        return self.start()

    def hide(self, path: str) -> None:
        """``path`` (relative to the folder) answers 404 from now on."""
        with self._lock:
            self._hidden.add(path.strip("/"))

    def forbid(self, path: str) -> None:
        """``path`` (relative to the folder) answers 403 from now on."""
        with self._lock:
            self._forbidden.add(path.strip("/"))

    def _blocked(self, path: str) -> int | None:
        with self._lock:
            if path in self._forbidden:
                return 403
            if path in self._hidden:
                return 404
        return None


class _StaticRoutes:
    def __init__(self, server: StaticHttpServer) -> None:
        self.server = server

    def handle(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            raise HttpError(405, "Method Not Allowed", headers={"Allow": "GET, HEAD"})
        mount = [s for s in self.server.mount.split("/") if s]
        redirected = request.segments[:1] == [OBJECTS]
        if redirected:
            mount = [OBJECTS]
        if request.segments[: len(mount)] != mount:
            raise HttpError(404, "Not Found")
        segments = request.segments[len(mount):]
        if not segments or any(s in (".", "..") or "/" in s or "\0" in s for s in segments):
            raise HttpError(404, "Not Found")
        path = "/".join(segments)
        blocked = self.server._blocked(path)
        if blocked is not None:
            raise HttpError(blocked, "Forbidden" if blocked == 403 else "Not Found")
        full = self.server.folder / path
        try:
            stat = full.stat()
        except OSError:
            raise HttpError(404, "Not Found") from None
        if not full.is_file():
            raise HttpError(404, "Not Found")
        if self.server.redirect and not redirected:
            return Response(302, {"Location": f"/{OBJECTS}/{quote(path)}"})
        headers = {}
        tag = f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'
        if self.server.etag == "strong":
            headers["ETag"] = tag
        elif self.server.etag == "weak":
            headers["ETag"] = f"W/{tag}"
        if self.server.last_modified:
            headers["Last-Modified"] = formatdate(stat.st_mtime, usegmt=True)
        # Read from disk at each request: no hashing, the file may be replaced between requests.
        return content(_FileOnDisk(full, stat.st_size), request.headers.get("Range"), headers)


@dataclass(frozen=True)
class _FileOnDisk:
    """A file's bytes, read from disk at each read (a :class:`~lerobot_nodes.testing.http_server.Payload`)."""

    path: Path
    size: int

    def read(self, start: int, end: int) -> bytes:
        with open(self.path, "rb") as file:
            file.seek(start)
            return file.read(end - start)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a folder until Ctrl-C or SIGTERM, after printing its URL."""
    parser = argparse.ArgumentParser(
        prog="python -m lerobot_nodes.testing.static_http",
        description="Serve a local dataset folder over plain HTTP with Range support (127.0.0.1 only).",
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--mount", default="/ds", help="URL path of the folder (default /ds)")
    parser.add_argument("--port", type=int, default=0, help="port (0: any free port)")
    parser.add_argument("--etag", choices=ETAG_MODES, default="strong")
    parser.add_argument("--no-last-modified", action="store_true")
    parser.add_argument("--redirect", action="store_true", help="answer every file with a 302 to /_objects/PATH")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before every answer")
    parser.add_argument("--fault-every", type=int, default=0, help="fail every N-th range read (0: never)")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        parser.error(f"not a folder: {args.folder}")
    # SIGTERM ends the process like Ctrl-C: a handler that set an Event could deadlock on the lock
    # the main thread holds inside Event.wait when the signal lands there.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    server = StaticHttpServer(
        args.folder, mount=args.mount, etag=args.etag, last_modified=not args.no_last_modified, redirect=args.redirect,
        latency_s=args.latency_ms / 1000, fault_every=args.fault_every, port=args.port,
    )
    try:
        with server:
            print(f"serving {args.folder} at {server.url}; try: lerobot-nodes stream --dataset.root={server.url}",
                  flush=True)
            while True:
                time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
