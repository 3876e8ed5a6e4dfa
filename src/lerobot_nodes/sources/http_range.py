"""Native HTTP range reads: pooled connections, cached redirects, exact ranges, bounded retries.

The Hub answers a payload read with a redirect to a signed CDN URL. Following it on every
read doubles the round trips and spends the Hub's resolver rate limit, so each file's
``Location`` is resolved once and reused until it expires or the CDN answers 403. Every
response is checked (status, ``Content-Range``, length) before its bytes are used.

With a :class:`~.node_cache.LocationStore` the ``Location`` is shared by every process of the
node: one process asks the resolver (the others wait on a per-file lock) and all reuse its answer
until the signed URL's expiry (``Expires=`` or ``X-Amz-Date`` + ``X-Amz-Expires`` in its query),
so a file costs one resolver call per node per URL lifetime.

Faults are survived, not fatal: connection resets and closes, 408/429/5xx (``Retry-After`` and the
Hub's ``RateLimit`` reset honoured, the first 429 of each quota logged once), short bodies (the missing remainder is fetched) and stalls (a read timeout) are
retried with exponential backoff and jitter, up to ``retries`` attempts per range. 404 and a
401/403 that a fresh redirect does not cure are permanent and raised at once, naming the
file and the URL without its query (signed URLs carry credentials).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import urllib3
from urllib3.exceptions import HTTPError as Urllib3Error

from ..errors import SourceAuthError, SourceError, SourceFileNotFoundError, SourceUnavailableError
from .node_cache import LocationStore
from .ranges import ByteRange, coalesce, covering, split
from .rate_limit import note_rate_limit, rate_limit_wait, retry_after_s

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
DEFAULT_LOCATION_TTL_S = 600.0
"""How long a redirect target without a readable expiry is reused."""
LOCATION_EXPIRY_MARGIN_S = 60.0
"""A signed URL is dropped this long before it expires (a tenth of its lifetime when that is shorter)."""
MAX_RETRY_AFTER_S = 60.0
MAX_REDIRECTS = 5
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_CHUNK = 256 * 1024


@dataclass(frozen=True)
class HttpOptions:
    """How the native reader talks HTTP. ``connections`` bounds the open connections of one
    process; ``subranges`` cuts one large range into that many concurrent requests."""

    connections: int = 16
    subranges: int = 1
    retries: int = 8
    timeout_s: float = 30.0
    connect_timeout_s: float = 10.0
    backoff_s: float = 0.25
    backoff_max_s: float = 8.0
    coalesce_gap: int = 64 * 1024
    min_subrange: int = 1 << 20


@dataclass
class HttpStats:
    """What the reader did: requests sent (redirect lookups included), retries and bytes received.

    By the Hub's rate-limit classes: ``api_requests`` (``/api/...``, counted by the Hub sources for
    huggingface_hub's calls), ``resolver_requests`` (requests to the URLs handed in: the Hub's
    ``/resolve/`` and bucket file URLs; a plain HTTP root's files) and ``cdn_requests`` (requests
    to a redirect target). ``rate_limited``: 429 answers waited out.
    """

    requests: int = 0
    retries: int = 0
    redirects: int = 0
    bytes_received: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    api_requests: int = 0
    resolver_requests: int = 0
    cdn_requests: int = 0
    rate_limited: int = 0


class _Retry(Exception):
    """One attempt failed in a way that another attempt may cure (``wait_s``: what the server asked)."""

    def __init__(self, reason: str, wait_s: float | None = None, rate_limited: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.wait_s = wait_s
        self.rate_limited = rate_limited


@dataclass(frozen=True)
class RemoteFile:
    """What one response said about its file: size (``Content-Range`` total or ``Content-Length``)
    and the validators a static server may send (``None`` when absent)."""

    size: int
    etag: str | None = None
    last_modified: str | None = None


@dataclass
class _Location:
    url: str
    expires_at: float
    refreshed: bool = False


def public_url(url: str) -> str:
    """``url`` without query and fragment: signed URLs carry credentials there."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def location_expiry_wall(location: str) -> float:
    """Until when (``time.time()`` seconds) a redirect target may be used, from its query where it says:
    ``Expires=<epoch>`` (CloudFront, the Hub's CDN) or ``X-Amz-Date`` + ``X-Amz-Expires`` (S3,
    ``cas-bridge.xethub.hf.co``), the earlier of the two; less a margin of
    :data:`LOCATION_EXPIRY_MARGIN_S` (a tenth of the URL's lifetime when that is shorter). A target
    that says nothing is used for :data:`DEFAULT_LOCATION_TTL_S` (a 403 drops it earlier)."""
    now = time.time()
    query = {key.lower(): values[-1] for key, values in parse_qs(urlsplit(location).query).items()}
    ends: list[tuple[float, float | None]] = []
    expires = query.get("expires")
    if expires and expires.isdigit():
        ends.append((float(expires), None))
    amz_expires, amz_date = query.get("x-amz-expires"), query.get("x-amz-date")
    if amz_expires and amz_expires.isdigit() and amz_date:
        try:
            signed = time.mktime(time.strptime(amz_date, "%Y%m%dT%H%M%SZ")) - time.timezone
        except ValueError:
            signed = now
        ends.append((signed + float(amz_expires), float(amz_expires)))
    if not ends:
        return now + DEFAULT_LOCATION_TTL_S
    end, lifetime = min(ends, key=lambda pair: pair[0])
    lifetime = lifetime if lifetime is not None else max(0.0, end - now)
    return end - min(LOCATION_EXPIRY_MARGIN_S, lifetime / 10)


def _location_expiry(location: str, now: float) -> float:
    """:func:`location_expiry_wall` on the clock ``now`` is read from (``time.monotonic()``)."""
    return now + (location_expiry_wall(location) - time.time())


_retry_after = retry_after_s


class HttpRangeReader:
    """Reads byte ranges of files addressed by URL; thread-safe, picklable, fork-aware.

    ``headers(url)`` supplies the request headers of a URL handed in (authorization, user agent, a
    request signature). They go to the origin of those URLs only, never to a redirect target on another
    origin. Pickling keeps the options only: connections, cached redirects and statistics
    stay with the process that made them.
    """

    def __init__(
        self, options: HttpOptions | None = None, headers: Callable[[str], Mapping[str, str]] | None = None,
        shared: LocationStore | None = None,
    ) -> None:
        self.options = options or HttpOptions()
        self._headers = headers
        self._shared = shared
        self._setup()

    def _setup(self) -> None:
        self.stats = HttpStats()
        self._lock = threading.Lock()
        self._locations: dict[str, _Location] = {}
        self._identities: dict[str, str] = {}
        self._refreshing: set[str] = set()
        self._pool: urllib3.PoolManager | None = None
        self._executor: ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_headers": self._headers, "_shared": self._shared}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._shared = None
        self.__dict__.update(state)
        self._setup()

    def close(self) -> None:
        with self._lock:
            pool, executor = self._pool, self._executor
            self._pool = self._executor = None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if pool is not None:
            pool.clear()

    # -- public ------------------------------------------------------------------------------
    def read_ranges(
        self, url: str, ranges: Sequence[ByteRange], *, size: int | None, name: str, identity: str | None = None
    ) -> list[bytes]:
        """The bytes of each ``(start, end)`` of the file at ``url`` (``size`` bytes when known).

        Nearby ranges share one request; a large range is split into ``subranges``
        concurrent requests. ``name`` is how errors refer to the file. ``identity`` names the
        file's content: a redirect target is shared with the node only for the same content (a
        bucket object replaced at the same URL gets a new target).
        """
        if not ranges:
            return []
        if identity is not None:
            with self._lock:
                self._identities[url] = identity
        if size is not None:
            for start, end in ranges:
                if end > size:
                    raise SourceError(f"byte range [{start}, {end}) of {name} reaches past its end ({size} bytes)")
        merged = coalesce(ranges, self.options.coalesce_gap)
        pieces = [
            piece
            for byte_range in merged
            for piece in split(byte_range, self.options.subranges, self.options.min_subrange)
        ]
        fetched = []
        if len(pieces) == 1 or not self._knows_target(url):
            # The first read of a file learns its redirect; the others then go straight to it.
            fetched.append(self._read_exact(url, pieces[0], size, name))
        rest = pieces[len(fetched):]
        if len(rest) == 1:
            fetched.append(self._read_exact(url, rest[0], size, name))
        elif rest:
            fetched += self._executor_for().map(lambda piece: self._read_exact(url, piece, size, name), rest)
        by_start = dict(zip((start for start, _ in pieces), fetched, strict=True))
        blobs = [b"".join(by_start[start] for start, _ in pieces if lo <= start < hi) for lo, hi in merged]
        return [
            blobs[position][start - merged[position][0] : end - merged[position][0]]
            for (start, end), position in zip(ranges, covering(ranges, merged), strict=True)
        ]

    def read_all(self, url: str, *, size: int, name: str, identity: str | None = None) -> bytes:
        """The whole file at ``url``, which has ``size`` bytes."""
        if size == 0:
            return b""
        return self.read_ranges(url, [(0, size)], size=size, name=name, identity=identity)[0]

    def probe(self, url: str, *, name: str) -> RemoteFile:
        """Size and validators of the file at ``url``, from a one-byte range read (retried like any
        read). A server that ignores ``Range`` is an error unless the file is that one byte."""
        found: dict[str, str] = {}
        self._read_exact(url, (0, 1), None, name, found)
        return RemoteFile(int(found["size"]), found.get("etag"), found.get("last_modified"))

    # -- one exact range -----------------------------------------------------------------------
    def _read_exact(
        self, url: str, byte_range: ByteRange, size: int | None, name: str, found: dict[str, str] | None = None
    ) -> bytes:
        start, end = byte_range
        received = bytearray()
        attempts = redirects = 0
        while start + len(received) < end:
            position = start + len(received)
            try:
                self._request(url, position, end, size, name, received, found)
            except _Redirected:
                redirects += 1
                if redirects > MAX_REDIRECTS:
                    raise SourceError(f"{name}: {public_url(url)} redirected more than {MAX_REDIRECTS} times") from None
            except _Retry as retry:
                attempts += 1
                kind = retry.reason.split(":")[0]
                with self._lock:
                    self.stats.retries += 1
                    self.stats.faults[kind] = self.stats.faults.get(kind, 0) + 1
                    self.stats.rate_limited += retry.rate_limited
                if attempts >= self.options.retries:
                    source = "" if public_url(url) == name else f" from {public_url(url)}"
                    raise SourceUnavailableError(
                        f"reading bytes [{start}, {end}) of {name}{source} failed {attempts} times; "
                        f"last error: {retry.reason}"
                    ) from None
                time.sleep(self._backoff(attempts, retry.wait_s, retry.rate_limited))
        return bytes(received)

    def _backoff(self, attempt: int, retry_after: float | None, rate_limited: bool = False) -> float:
        if retry_after is not None:
            # A quota's reset is waited out whole (rate_limit_wait bounds it); other hints are capped.
            return retry_after if rate_limited else min(retry_after, MAX_RETRY_AFTER_S)
        ceiling = min(self.options.backoff_max_s, self.options.backoff_s * 2 ** (attempt - 1))
        return random.uniform(ceiling / 2, ceiling)

    def _request(
        self, url: str, start: int, end: int, size: int | None, name: str, received: bytearray,
        found: dict[str, str] | None = None,
    ) -> None:
        """One GET of ``[start, end)``; appends what arrived (all of it, or the first part of a
        short body) to ``received``. Raises :class:`_Retry` for transient failures.

        Asking the resolver (no target known yet) happens under the node's per-file lock when the
        reader shares targets: the processes that waited then use the target it answered."""
        target = self._target(url)
        if target == url and self._shared is not None:
            with self._shared.lock(self._shared_key(url)):
                target = self._target(url)
                if target == url:
                    self._send(url, target, start, end, size, name, received, found)
                    return
        self._send(url, target, start, end, size, name, received, found)

    def _send(
        self, url: str, target: str, start: int, end: int, size: int | None, name: str, received: bytearray,
        found: dict[str, str] | None,
    ) -> None:
        headers = dict(self._headers(target) if self._headers is not None else {})
        if _origin(target) != _origin(url):
            headers.pop("authorization", None)
            headers.pop("Authorization", None)
        headers["Range"] = f"bytes={start}-{end - 1}"
        headers["Accept-Encoding"] = "identity"
        try:
            response = self._pool_for().request(
                "GET", target, headers=headers, redirect=False, retries=False, preload_content=False,
                timeout=urllib3.Timeout(connect=self.options.connect_timeout_s, read=self.options.timeout_s),
            )
        except Urllib3Error as error:
            raise _Retry(f"{type(error).__name__}: {error}") from None
        with self._lock:
            self.stats.requests += 1
            if target == url:
                self.stats.resolver_requests += 1
            else:
                self.stats.cdn_requests += 1
        try:
            self._handle(url, target, response, start, end, size, name, received, found)
        finally:
            response.release_conn()

    def _handle(
        self, url: str, target: str, response: Any, start: int, end: int, size: int | None, name: str,
        received: bytearray, found: dict[str, str] | None = None,
    ) -> None:
        status = response.status
        if status in (301, 302, 303, 307, 308) and target == url:
            location = response.headers.get("Location")
            response.drain_conn()
            if not location:
                raise SourceError(f"{name}: {public_url(url)} answered {status} without a Location")
            absolute = urljoin(url, location)
            expires_wall = location_expiry_wall(absolute)
            with self._lock:
                self.stats.redirects += 1
                refreshed = url in self._refreshing
                self._refreshing.discard(url)
                self._locations[url] = _Location(absolute, time.monotonic() + expires_wall - time.time(), refreshed)
            if self._shared is not None and expires_wall > time.time():
                self._shared.put(self._shared_key(url), absolute, expires_wall)
            raise _Redirected
        if status in (401, 403):
            response.drain_conn()
            if target != url:
                with self._lock:
                    cached = self._locations.pop(url, None)
                    retry = cached is not None and not cached.refreshed
                    if retry:
                        # A signed URL that expired early: resolve once more before calling it permanent.
                        self._refreshing.add(url)
                if self._shared is not None:
                    self._shared.drop(self._shared_key(url), target)
                if retry:
                    raise _Redirected
            where = "the server" if public_url(target) == name else public_url(target)
            raise SourceAuthError(
                f"{name}: {where} answered {status} ({'unauthorized' if status == 401 else 'forbidden'})"
            )
        if status in (404, 410):
            response.drain_conn()
            where = "the server" if public_url(url) == name else public_url(url)
            raise SourceFileNotFoundError(f"{name} not found: {where} answered {status}")
        if status == 416:
            response.drain_conn()
            raise SourceError(f"byte range [{start}, {end}) of {name} is outside the file ({public_url(url)} answered 416)")
        if status in RETRYABLE_STATUS:
            headers = dict(response.headers.items())
            response.drain_conn()
            if status == 429:
                wait = rate_limit_wait(headers)
                note_rate_limit(headers, "resolvers" if target == url else "cdn", public_url(target), wait)
                raise _Retry(f"HTTP {status}", wait, rate_limited=True)
            raise _Retry(f"HTTP {status}", _retry_after(headers.get("Retry-After")))
        if status in (200, 206) and target == url:
            with self._lock:  # served without a redirect: remember that too
                known = url in self._locations
                self._locations.setdefault(url, _Location(url, time.monotonic() + DEFAULT_LOCATION_TTL_S))
            if self._shared is not None and not known:
                self._shared.put(self._shared_key(url), url, time.time() + DEFAULT_LOCATION_TTL_S)
        if status == 200:
            # The server ignored Range: usable only when the whole body is exactly what was asked.
            length = response.headers.get("Content-Length")
            if start != 0 or length is None or not length.isdigit() or int(length) != end - start:
                response.close()  # never read (or drain) a whole file that was not asked for
                raise SourceError(
                    f"{name}: {public_url(target)} does not serve byte ranges (answered 200 to a Range request); "
                    "streaming needs a server with HTTP Range support"
                )
            if found is not None:
                _remember(found, response, int(length))
            self._stream(response, end - start, received, name)
            return
        if status != 206:
            response.drain_conn()
            raise SourceError(f"{name}: {public_url(target)} answered HTTP {status} to a range read")
        match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        if match is None or int(match[1]) != start or int(match[2]) != end - 1:
            response.drain_conn()
            raise SourceError(
                f"{name}: asked for bytes {start}-{end - 1}, {public_url(target)} sent "
                f"Content-Range {response.headers.get('Content-Range')!r}"
            )
        if size is not None and match[3] != "*" and int(match[3]) != size:
            response.drain_conn()
            raise SourceError(
                f"{name} has {match[3]} bytes at {public_url(target)}, the listing said {size}: the file changed "
                "during the run (metadata and payloads must not change while training)"
            )
        if found is not None:
            if match[3] == "*":
                response.drain_conn()
                raise SourceError(f"{name}: {public_url(target)} does not tell the file size (Content-Range "
                                  f"{response.headers.get('Content-Range')!r})")
            _remember(found, response, int(match[3]))
        self._stream(response, end - start, received, name)

    def _stream(self, response: Any, wanted: int, received: bytearray, name: str) -> None:
        """Append up to ``wanted`` body bytes; a body cut short keeps its first part and retries."""
        before = len(received)
        try:
            for chunk in response.stream(_CHUNK):
                received += chunk[: wanted - (len(received) - before)]
                if len(received) - before >= wanted:
                    break
        except Urllib3Error as error:
            got = len(received) - before
            self._count_bytes(got)
            raise _Retry(f"short body: {type(error).__name__} after {got} of {wanted} bytes") from None
        got = len(received) - before
        self._count_bytes(got)
        if got < wanted:
            raise _Retry(f"short body: {got} of {wanted} bytes")

    def _count_bytes(self, nbytes: int) -> None:
        with self._lock:
            self.stats.bytes_received += nbytes

    # -- plumbing ------------------------------------------------------------------------------
    def _shared_key(self, url: str) -> str:
        with self._lock:
            return f"{url}\0{self._identities.get(url, '')}"

    def _knows_target(self, url: str) -> bool:
        self._target(url)  # learns a target another process of the node shared
        with self._lock:
            return url in self._locations

    def _target(self, url: str) -> str:
        with self._lock:
            cached = self._locations.get(url)
            if cached is not None and cached.expires_at <= time.monotonic():
                del self._locations[url]
                cached = None
            if cached is not None:
                return cached.url
            if self._shared is None or url in self._refreshing:
                return url
        shared = self._shared.get(self._shared_key(url))  # another process of the node resolved it
        if shared is None:
            return url
        location, expires_wall = shared
        with self._lock:
            self._locations.setdefault(url, _Location(location, time.monotonic() + expires_wall - time.time()))
            return self._locations[url].url

    def _pool_for(self) -> urllib3.PoolManager:
        with self._lock:
            if self._pool is None:
                self._pool = urllib3.PoolManager(num_pools=8, maxsize=self.options.connections, block=True)
            return self._pool

    def _executor_for(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.options.connections, thread_name_prefix="lerobot-nodes-http")
            return self._executor


def _remember(found: dict[str, str], response: Any, size: int) -> None:
    found["size"] = str(size)
    for key, header in (("etag", "ETag"), ("last_modified", "Last-Modified")):
        value = response.headers.get(header)
        if value:
            found[key] = value.strip()


class _Redirected(Exception):
    """The request learnt (or dropped) the file's redirect target: send it again at once."""
