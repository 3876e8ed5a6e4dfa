"""AWS Signature Version 4 for S3 requests without a body (GET, HEAD): the headers that sign one.

This is the signing botocore's ``S3SigV4Auth`` does for such a request, written with ``hmac`` and
``hashlib`` because importing ``botocore.auth`` costs about 0.13 s (it pulls in pyOpenSSL and
``cryptography``), once in the training process and again in every DataLoader worker, to sign a
handful of headers. ``tests/sources/test_s3_signing.py`` checks every signature against
botocore's for the same request, and a moto server that verifies signatures accepts them.

Signed: the method, the URL's path as sent (S3 signs the encoded path once, without normalising
it), its query, and the headers ``host``, ``x-amz-content-sha256``, ``x-amz-date`` and, with
temporary credentials, ``x-amz-security-token``. ``Range`` and the other headers go unsigned. Each
request is signed when it is sent (S3 refuses a signature more than 15 minutes old).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "s3"
EMPTY_BODY_SHA256 = hashlib.sha256(b"").hexdigest()
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class S3Keys:
    """One set of credentials: access key, secret and, for temporary ones, the session token."""

    access_key: str
    secret_key: str
    session_token: str | None = None

    def __repr__(self) -> str:  # never the secret or the token
        return f"S3Keys({self.access_key[:4]}...)"


def amz_date(when: float) -> str:
    """``when`` (seconds since the epoch) as SigV4's ``YYYYMMDDTHHMMSSZ``."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))


def host_header(url: str) -> str:
    """The ``Host`` an HTTP client sends for ``url``: the port only when it is not the scheme's default."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    if parts.port is not None and parts.port != DEFAULT_PORTS.get(parts.scheme.lower()):
        return f"{host}:{parts.port}"
    return host


def canonical_query(query: str) -> str:
    """SigV4's query: every parameter and value percent-encoded (unreserved characters kept), sorted."""
    pairs = [(quote(name, safe="-_.~"), quote(value, safe="-_.~")) for name, value in parse_qsl(query, keep_blank_values=True)]
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def signing_key(secret_key: str, day: str, region: str) -> bytes:
    key = hmac.new(f"AWS4{secret_key}".encode(), day.encode(), hashlib.sha256).digest()
    for part in (region, SERVICE, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def signed_headers(method: str, url: str, keys: S3Keys, region: str, when: float | None = None) -> dict[str, str]:
    """The headers that sign a body-less ``method`` request of ``url`` with ``keys`` in ``region``,
    at ``when`` (now by default): ``X-Amz-Date``, ``X-Amz-Content-SHA256``, ``Authorization`` and,
    with a session token, ``X-Amz-Security-Token``. ``url``'s path must be percent-encoded as sent."""
    stamp = amz_date(time.time() if when is None else when)
    day = stamp[:8]
    parts = urlsplit(url)
    headers = {"host": host_header(url), "x-amz-content-sha256": EMPTY_BODY_SHA256, "x-amz-date": stamp}
    if keys.session_token:
        headers["x-amz-security-token"] = keys.session_token
    names = sorted(headers)
    canonical = "\n".join(
        [
            method.upper(),
            parts.path or "/",
            canonical_query(parts.query),
            "".join(f"{name}:{' '.join(headers[name].split())}\n" for name in names),
            ";".join(names),
            EMPTY_BODY_SHA256,
        ]
    )
    scope = f"{day}/{region}/{SERVICE}/aws4_request"
    to_sign = f"{ALGORITHM}\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    signature = hmac.new(signing_key(keys.secret_key, day, region), to_sign.encode(), hashlib.sha256).hexdigest()
    out = {
        "X-Amz-Date": stamp,
        "X-Amz-Content-SHA256": EMPTY_BODY_SHA256,
        "Authorization": (
            f"{ALGORITHM} Credential={keys.access_key}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
        ),
    }
    if keys.session_token:
        out["X-Amz-Security-Token"] = keys.session_token
    return out
