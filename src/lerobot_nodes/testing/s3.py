"""An S3-compatible server on loopback: moto's S3 in a thread, with a latency per request.

:class:`LoopbackS3` serves moto's S3 (the ``moto[server]`` extra, a dev dependency) from a
daemon thread on 127.0.0.1. Each answer waits ``latency_s`` first (a round trip to a real
store), and every request is counted by kind (``LIST``, ``GET``, ``HEAD``...) in ``requests``.
:meth:`LoopbackS3.environment` gives the variables that point s3fs (and boto3) at it, for this
process or a child; :meth:`LoopbackS3.upload` copies a folder in.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from .http_server import LOOPBACK_HOST

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
"""What moto accepts: any key and secret."""

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WsgiApp = Callable[[Environ, StartResponse], Iterable[bytes]]


class LoopbackS3:
    """moto's S3 on 127.0.0.1 (a port of its own), ``latency_s`` before every answer."""

    def __init__(self, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s
        self.requests: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` (``""`` until started)."""
        if self._server is None:
            return ""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def environment(self) -> dict[str, str]:
        """The variables that point s3fs and boto3 at this server."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def start(self) -> LoopbackS3:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server(
            LOOPBACK_HOST, 0, self._delayed(app), threaded=True, request_handler=MotoRequestHandler
        )  # fmt: skip
        self._thread = threading.Thread(target=self._server.serve_forever, name="loopback-s3", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> LoopbackS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def clear_records(self) -> None:
        """Forget the requests counted so far."""
        with self._lock:
            self.requests.clear()

    def upload(self, folder: str | Path, url: str) -> None:
        """Copy ``folder`` to ``s3://BUCKET/PREFIX`` on this server (the bucket made if missing)."""
        import s3fs

        fs = s3fs.S3FileSystem(
            key=CREDENTIALS["AWS_ACCESS_KEY_ID"], secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            endpoint_url=self.endpoint, skip_instance_cache=True,
        )  # fmt: skip
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        fs.put(str(folder), f"{bucket}/{prefix}".rstrip("/"), recursive=True)

    def _delayed(self, app: WsgiApp) -> WsgiApp:
        def answer(environ: Environ, start_response: StartResponse) -> Iterator[bytes]:
            with self._lock:
                self.requests[_kind(environ)] += 1
            if self.latency_s:
                time.sleep(self.latency_s)
            yield from app(environ, start_response)

        return answer


def _kind(environ: Environ) -> str:
    """``LIST`` for a bucket listing, else the HTTP method."""
    method = str(environ.get("REQUEST_METHOD", ""))
    query = str(environ.get("QUERY_STRING", ""))
    if method == "GET" and ("list-type=" in query or "prefix=" in query or "delimiter=" in query):
        return "LIST"
    return method
