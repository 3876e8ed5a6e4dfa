"""``s3://BUCKET/PREFIX`` read natively: one listing at open, payload by signed HTTP range reads.

The store is listed once with ListObjectsV2 (pages of 1,000 keys); each object's identity is its
ETag, as s3fs reports it, so video indexes cached by an ``s3://`` run through fsspec stay valid.
Reads go through the native range reader the Hub and plain HTTP roots use (pooled connections,
exact ranges, faults retried), each request signed with SigV4 (:mod:`.s3_signing`). No s3fs,
aiobotocore or aiohttp is imported and no event-loop thread started, in the training process or in
any DataLoader worker.

Where it reads:

- the endpoint: ``storage_options`` ``endpoint_url`` (or ``client_kwargs={"endpoint_url": ...}``),
  else ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, else AWS. A custom endpoint (MinIO, moto,
  R2...) is addressed path-style (``ENDPOINT/BUCKET/KEY``); AWS virtual-host style
  (``https://BUCKET.s3.REGION.amazonaws.com/KEY``), path-style for a bucket name with dots;
- the region: ``client_kwargs={"region_name": ...}``, else ``AWS_REGION``, else ``AWS_DEFAULT_REGION``,
  else the profile's, else ``us-east-1``; on AWS a bucket elsewhere answers with its region, which
  the listing then uses;
- the credentials (:class:`S3Auth`): ``key``/``secret``/``token`` in ``storage_options``; ``anon=True``
  for none; else ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``; else
  botocore's chain (profiles, SSO, instance and container roles; refreshed when they expire), with
  ``profile`` or ``AWS_PROFILE``; else unsigned requests (a public bucket).

``storage_options`` holding anything else (s3fs's own options) open the root through fsspec and s3fs
instead (:class:`~.fsspec_source.FsspecSource`), as before.
"""

from __future__ import annotations

import contextlib
import os
import threading
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

from ..errors import (
    ConfigError,
    SourceAuthError,
    SourceError,
    SourceFileNotFoundError,
    SourceUnavailableError,
)
from .base import FileInfo
from .file_cache import default_file_cache_root, slug
from .http_range import RETRYABLE_STATUS, HttpOptions, HttpStats
from .listed import ListedHttpSource
from .s3_signing import S3Keys, signed_headers

NATIVE_OPTIONS = frozenset({"key", "secret", "token", "anon", "endpoint_url", "client_kwargs", "profile"})
"""The ``storage_options`` this source reads; any other sends the root to s3fs."""
NATIVE_CLIENT_KWARGS = frozenset({"endpoint_url", "region_name"})
DEFAULT_REGION = "us-east-1"
S3_NAMESPACE = "{http://s3.amazonaws.com/doc/2006-03-01/}"
LIST_PAGE = 1000
ETAG = "ETag"
"""The fingerprint's name, as :func:`~.fsspec_source.fingerprint_of` names s3fs's ETag."""


def reads_natively(storage_options: Mapping[str, Any] | None) -> bool:
    """Whether an ``s3://`` root with ``storage_options`` is read by :class:`S3Source` (not s3fs)."""
    options = dict(storage_options or {})
    client = options.get("client_kwargs") or {}
    return set(options) <= NATIVE_OPTIONS and isinstance(client, Mapping) and set(client) <= NATIVE_CLIENT_KWARGS


def _dns_compatible(bucket: str) -> bool:
    return "." not in bucket and bucket.lower() == bucket and 3 <= len(bucket) <= 63


@dataclass(frozen=True)
class S3Address:
    """Where a bucket's objects are: ``endpoint`` (custom, addressed path-style) or AWS in ``region``."""

    bucket: str
    prefix: str
    region: str
    endpoint: str | None = None

    @classmethod
    def of(cls, url: str, options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> S3Address:
        scheme, _, rest = url.partition("://")
        bucket, _, prefix = rest.strip("/").partition("/")
        if not bucket or "@" in bucket:
            raise ConfigError(f"{scheme}://{bucket or ''}: expected s3://BUCKET[/PREFIX] (credentials go in the environment)")
        client = dict(options.get("client_kwargs") or {})
        endpoint = (
            options.get("endpoint_url") or client.get("endpoint_url") or environ.get("AWS_ENDPOINT_URL_S3")
            or environ.get("AWS_ENDPOINT_URL")
        )
        region = client.get("region_name") or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
        return cls(bucket, prefix.strip("/"), str(region or ""), str(endpoint).rstrip("/") if endpoint else None)

    def with_region(self, region: str) -> S3Address:
        return S3Address(self.bucket, self.prefix, region, self.endpoint)

    @property
    def signing_region(self) -> str:
        return self.region or DEFAULT_REGION

    def bucket_url(self) -> str:
        """The bucket's URL, ending in ``/`` (a ListObjectsV2 request adds its query)."""
        if self.endpoint is not None:
            return f"{self.endpoint}/{quote(self.bucket)}/"
        host = f"s3.{self.signing_region}.amazonaws.com"
        if _dns_compatible(self.bucket):
            return f"https://{self.bucket}.{host}/"
        return f"https://{host}/{quote(self.bucket)}/"

    def object_url(self, key: str) -> str:
        return self.bucket_url() + quote(key, safe="/~")


class S3Auth:
    """The SigV4 headers of a request (``auth(url)``), from credentials resolved once per process.

    Explicit keys travel with a pickled copy (as fsspec's ``storage_options`` do); credentials from the
    environment or botocore's chain are resolved again where the copy lands. Thread-safe.
    """

    def __init__(
        self, region: str, keys: S3Keys | None = None, anonymous: bool = False, profile: str | None = None
    ) -> None:
        self.region = region
        self.explicit = keys
        self.anonymous = anonymous
        self.profile = profile
        self._setup()

    @classmethod
    def of(cls, options: Mapping[str, Any], region: str) -> S3Auth:
        if options.get("anon"):
            return cls(region, anonymous=True)
        key, secret = options.get("key"), options.get("secret")
        if key and secret:
            return cls(region, S3Keys(str(key), str(secret), options.get("token") or None))
        if key or secret:
            raise ConfigError("S3 storage_options need both 'key' and 'secret' (or neither: the environment's)")
        return cls(region, profile=options.get("profile") or None)

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._resolved = False
        self._provider: Any = None  # botocore's credentials: refreshed by botocore when temporary

    def __getstate__(self) -> dict[str, Any]:
        return {"region": self.region, "explicit": self.explicit, "anonymous": self.anonymous, "profile": self.profile}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def __repr__(self) -> str:
        mode = "anonymous" if self.anonymous else "explicit" if self.explicit else f"default({self.profile or ''})"
        return f"S3Auth({mode}, {self.region})"

    def keys(self) -> S3Keys | None:
        """The credentials requests are signed with now, or None (unsigned requests)."""
        if self.anonymous:
            return None
        if self.explicit is not None:
            return self.explicit
        with self._lock:
            if not self._resolved:
                self._provider = _default_credentials(self.profile)
                self._resolved = True
        provider = self._provider
        if provider is None or isinstance(provider, S3Keys):
            return provider
        frozen = provider.get_frozen_credentials()
        return S3Keys(frozen.access_key, frozen.secret_key, frozen.token or None)

    def __call__(self, url: str) -> dict[str, str]:
        keys = self.keys()
        return {} if keys is None else signed_headers("GET", url, keys, self.region)


def _default_credentials(profile: str | None) -> Any:
    """``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (no profile asked), else botocore's chain, else None."""
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret and not profile:
        return S3Keys(key, secret, os.environ.get("AWS_SESSION_TOKEN") or None)
    try:
        import botocore.session
    except ImportError:
        if profile or os.environ.get("AWS_PROFILE"):
            raise SourceAuthError(
                "an AWS profile needs botocore to read it: pip install botocore (or the s3 extra)"
            ) from None
        return None
    try:
        return botocore.session.Session(profile=profile).get_credentials()
    except Exception as error:  # botocore's profile and SSO errors: one line, named
        raise SourceAuthError(f"AWS credentials could not be resolved: {type(error).__name__}: {error}") from None


def _profile_region(profile: str | None) -> str:
    """The region of the AWS config profile, when botocore is there to read it ("" otherwise)."""
    try:
        import botocore.session
    except ImportError:
        return ""
    try:
        return str(botocore.session.Session(profile=profile).get_config_variable("region") or "")
    except Exception:
        return ""


class S3Source(ListedHttpSource):
    """The files under ``s3://BUCKET/PREFIX``, listed once at open, read by signed range requests."""

    def __init__(
        self, url: str, storage_options: Mapping[str, Any] | None = None, *, http: HttpOptions | None = None,
        cache_root: Path | None = None,
    ) -> None:
        options = dict(storage_options or {})
        if not reads_natively(options):
            raise ConfigError(f"{url}: storage_options {sorted(set(options) - NATIVE_OPTIONS)} are s3fs's: open it with FsspecSource")
        self._url = url.rstrip("/")
        address = S3Address.of(self._url, options)
        if not address.region and address.endpoint is None:
            address = address.with_region(_profile_region(options.get("profile")))
        auth = S3Auth.of(options, address.signing_region)
        stats = HttpStats()
        files, address = _list(address, auth, http or HttpOptions(), stats, self._url)  # auth signs for its region
        self.address = address
        cache = Path(cache_root) if cache_root is not None else default_file_cache_root()
        where = address.endpoint.split("://", 1)[-1] if address.endpoint else "aws"
        super().__init__(files, auth, http, cache / "s3" / slug(f"{where}/{address.bucket}/{address.prefix}"))
        self._add_api_stats(stats)

    @property
    def url(self) -> str:
        return self._url

    def file_url(self, path: str) -> str:
        return self.address.object_url(f"{self.address.prefix}/{path}" if self.address.prefix else path)


def _list(
    address: S3Address, auth: S3Auth, http: HttpOptions, stats: HttpStats, url: str
) -> tuple[list[FileInfo], S3Address]:
    """Every object under ``address.prefix``, and the address they were listed at (a bucket in
    another AWS region answers with its region once)."""
    pool = urllib3.PoolManager(
        num_pools=2,
        retries=urllib3.Retry(
            total=http.retries, backoff_factor=http.backoff_s, backoff_max=http.backoff_max_s,
            status_forcelist=RETRYABLE_STATUS, allowed_methods=("GET",), respect_retry_after_header=True,
            redirect=False, raise_on_status=False,
        ),
        timeout=urllib3.Timeout(connect=http.connect_timeout_s, read=http.timeout_s),
    )
    try:
        listed = _pages(address, auth, pool, stats, url)
        if isinstance(listed, str):  # the bucket is in another AWS region: list it there
            address = address.with_region(listed)
            auth.region = address.signing_region
            listed = _pages(address, auth, pool, stats, url)
        if isinstance(listed, str):
            raise SourceUnavailableError(f"listing {url}: AWS sent it to region {listed} twice")
        return listed, address
    finally:
        pool.clear()


def _pages(
    address: S3Address, auth: S3Auth, pool: urllib3.PoolManager, stats: HttpStats, url: str
) -> list[FileInfo] | str:
    """Every object under the prefix, or the bucket's region when AWS says it is in another one."""
    prefix = f"{address.prefix}/" if address.prefix else ""
    files: list[FileInfo] = []
    token: str | None = None
    while True:
        query = {"list-type": "2", "prefix": prefix, "max-keys": str(LIST_PAGE)}
        if token:
            query["continuation-token"] = token
        request_url = address.bucket_url() + "?" + urlencode(query, quote_via=quote, safe="-_.~")
        try:
            response = pool.request("GET", request_url, headers=auth(request_url))
        except urllib3.exceptions.HTTPError as error:
            raise SourceUnavailableError(f"listing {url}: {type(error).__name__}: {error}") from None
        stats.api_requests += 1
        stats.retries += len(response.retries.history) if response.retries is not None else 0
        if response.status != 200:
            region = bucket_region_answered(response.status, response.headers, response.data)
            if region and address.endpoint is None and region != address.signing_region:
                return region
            _raise_for(response, url, auth)
        root = _parse(response.data, url)
        for item in root.iter(f"{S3_NAMESPACE}Contents"):
            key = item.findtext(f"{S3_NAMESPACE}Key") or ""
            if not key.startswith(prefix) or key.endswith("/"):
                continue  # a folder marker
            etag = (item.findtext(f"{S3_NAMESPACE}ETag") or "").strip('"')
            size = int(item.findtext(f"{S3_NAMESPACE}Size") or 0)
            files.append(FileInfo(key[len(prefix):], size, f"{ETAG}:{etag}" if etag else None))
        token = root.findtext(f"{S3_NAMESPACE}NextContinuationToken")
        if root.findtext(f"{S3_NAMESPACE}IsTruncated") != "true" or not token:
            break
    if not files:
        raise SourceFileNotFoundError(f"{url} holds no files (or does not exist)")
    return files


def _parse(body: bytes, url: str) -> ElementTree.Element:
    try:
        return ElementTree.fromstring(body)
    except ElementTree.ParseError as error:
        raise SourceError(f"listing {url}: the server's answer is not S3 XML ({error})") from None


def bucket_region_answered(status: int, headers: Mapping[str, str], body: bytes) -> str | None:
    """The bucket's region when AWS answered a request sent to another region's endpoint: a 301
    (PermanentRedirect) or 400 (AuthorizationHeaderMalformed) naming it in ``x-amz-bucket-region``
    or in the error's ``Region``; else None."""
    if status not in (301, 400):
        return None
    region = headers.get("x-amz-bucket-region")
    if not region:
        with contextlib.suppress(ElementTree.ParseError):
            region = ElementTree.fromstring(body).findtext("Region")
    return region or None


def _raise_for(response: Any, url: str, auth: S3Auth) -> None:
    code, message = "", ""
    with contextlib.suppress(ElementTree.ParseError):
        error = ElementTree.fromstring(response.data)
        code, message = error.findtext("Code") or "", error.findtext("Message") or ""
    said = f"HTTP {response.status}" + (f" {code}: {message}" if code else "")
    if response.status == 404:
        raise SourceFileNotFoundError(f"{url}: no such bucket or prefix ({said})")
    if response.status in (401, 403):
        found_none = not auth.anonymous and auth.keys() is None
        hint = " (no AWS credentials were found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile)" if found_none else ""
        raise SourceAuthError(f"{url}: access denied ({said}){hint}")
    raise SourceUnavailableError(f"listing {url}: {said}")
