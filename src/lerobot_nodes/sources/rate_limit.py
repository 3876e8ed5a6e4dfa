"""The Hub's rate limits: its request classes, its ``429`` answers, and how long to wait.

The Hub limits each user (anonymous: each IP) per fixed 5-minute window, per class of request:
``api`` (``/api/...``: revisions, refs, tree listings), ``resolvers`` (``/resolve/...`` file reads,
bucket file URLs) and ``pages``. Reads that follow a resolver's redirect to the CDN count in none.
A request over quota is answered ``429`` with the IETF draft headers huggingface_hub parses too::

    RateLimit: "api";r=0;t=55                       # class, requests remaining, seconds until reset
    RateLimit-Policy: "fixed window";"api";q=1000;w=300

and possibly ``Retry-After``. :func:`rate_limit_wait` reads them; :func:`note_rate_limit` logs the
first ``429`` of each class once per process, naming the class, the quota and the reset time.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

log = logging.getLogger("lerobot_nodes.sources")

MAX_RATE_LIMIT_WAIT_S = 330.0
"""The longest single wait for a quota to reset: one Hub window (300 s) and a margin."""
RESET_JITTER_S = 1.0
"""Up to this much is added to a reset wait, so the processes of a node do not all retry at the same instant."""

_RATELIMIT = re.compile(r"\"(?P<kind>[\w-]+)\"\s*;\s*r\s*=\s*(?P<r>\d+)\s*;\s*t\s*=\s*(?P<t>\d+)")
_POLICY = re.compile(r"q\s*=\s*(?P<q>\d+).*?w\s*=\s*(?P<w>\d+)")
_logged: set[str] = set()
_logged_lock = threading.Lock()


@dataclass(frozen=True)
class RateLimit:
    """What a ``RateLimit`` header said: the class, requests left, seconds until the window resets,
    and, from ``RateLimit-Policy``, the quota and the window (``None`` when absent)."""

    kind: str
    remaining: int
    reset_s: int
    quota: int | None = None
    window_s: int | None = None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        lower = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lower), None)
    return value


def parse_rate_limit(headers: Mapping[str, str]) -> RateLimit | None:
    """The ``RateLimit`` (and ``RateLimit-Policy``) headers of an answer, or ``None``."""
    match = _RATELIMIT.search(_header(headers, "RateLimit") or "")
    if match is None:
        return None
    policy = _POLICY.search(_header(headers, "RateLimit-Policy") or "")
    return RateLimit(
        match["kind"], int(match["r"]), int(match["t"]),
        int(policy["q"]) if policy else None, int(policy["w"]) if policy else None,
    )


def retry_after_s(value: str | None) -> float | None:
    """``Retry-After`` in seconds (a number or an HTTP date), or ``None``."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def rate_limit_wait(headers: Mapping[str, str]) -> float | None:
    """How long to wait before retrying a ``429``/``503`` answer with ``headers``: the quota's reset
    (``t=`` of an exhausted ``RateLimit``) or ``Retry-After``, whichever is later, plus a little
    jitter for a reset; ``None`` when the answer says neither."""
    limit = parse_rate_limit(headers)
    after = retry_after_s(_header(headers, "Retry-After"))
    reset = float(limit.reset_s) if limit is not None and limit.remaining == 0 else None
    waits = [w for w in (reset, after) if w is not None]
    if not waits:
        return None
    wait = max(waits) + (random.uniform(0.0, RESET_JITTER_S) if reset is not None else 0.0)
    return min(wait, MAX_RATE_LIMIT_WAIT_S)


def note_rate_limit(headers: Mapping[str, str], kind: str, where: str, wait_s: float | None) -> None:
    """Log the first ``429`` of request class ``kind`` (the header's own class when it names one) in
    this process: which quota, when it resets, and that the request waits and is retried."""
    limit = parse_rate_limit(headers)
    name = limit.kind if limit is not None else kind
    with _logged_lock:
        if name in _logged:
            return
        _logged.add(name)
    quota = ""
    if limit is not None and limit.quota is not None:
        quota = f" ({limit.quota} requests per {limit.window_s} s)"
    reset = time.strftime("%H:%M:%S", time.localtime(time.time() + (wait_s or 0.0)))
    log.warning(
        "the Hub's %r rate limit%s is used up (429 from %s): waiting %.0f s, until about %s, then retrying "
        "(logged once per process; the rest of this process's 429s of this class are retried silently)",
        name, quota, where, wait_s or 0.0, reset,
    )
