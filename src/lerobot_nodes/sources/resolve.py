"""One resolver for every source: LeRobot's ``repo_id`` / ``root`` / ``revision`` arguments,
or a URL, become one :class:`ByteSource`; metadata and payloads then come from it alone.

- ``repo_id=OWNER/NAME`` (``root`` unset): the Hub dataset repo, pinned to a commit at open.
  A local copy in ``$HF_LEROBOT_HOME`` is used instead only with ``HF_HUB_OFFLINE=1`` (logged).
- ``repo_id=OWNER/BUCKET, repo_type="bucket"``, or ``root="hf://buckets/OWNER/BUCKET[/prefix]"``.
- ``root="hf://datasets/OWNER/NAME[@REV]"``: the same as ``repo_id`` + ``revision``.
- ``root="http(s)://HOST/PATH"``: a static HTTP server with Range support, read by the native
  range reader (files listed from the metadata, no credentials sent).
- ``root="s3://BUCKET[/PREFIX]"``: read natively (:class:`~.s3.S3Source`: ListObjectsV2 at open,
  SigV4-signed range reads), unless ``storage_options`` holds s3fs's own options: then fsspec.
- ``root`` with any other scheme (``gs://``, ``memory://``, ...): fsspec; ``file://``
  and plain paths: the local folder. :func:`register_scheme` adds or replaces a scheme.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, SourceError
from ..home import lerobot_home
from .base import ByteSource
from .fsspec_source import FsspecSource
from .http_range import HttpOptions
from .http_root import HttpRootSource
from .hub import HubBucketSource, HubRepoSource
from .hub_auth import hub_offline
from .local import LocalSource
from .s3 import S3Source, reads_natively

log = logging.getLogger("lerobot_nodes.sources")

REPO_TYPES = ("dataset", "bucket")
_HF_DATASET = re.compile(r"^hf://datasets/(?P<id>[^/@]+/[^/@]+)(?:@(?P<rev>[^/]+))?/?$")
_HF_BUCKET = re.compile(r"^hf://buckets/(?P<id>[^/]+/[^/]+)(?:/(?P<prefix>.*))?$")
_SCHEME = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*)://")


@dataclass(frozen=True)
class SourceRequest:
    """Everything a scheme opener may need besides the URL."""

    revision: str | None = None
    token: str | bool | None = None
    http: HttpOptions | None = None
    storage_options: dict[str, Any] | None = None


SchemeOpener = Callable[[str, SourceRequest], ByteSource]
_SCHEMES: dict[str, SchemeOpener] = {}


def register_scheme(scheme: str, opener: SchemeOpener) -> None:
    """Open roots ``scheme://...`` with ``opener(url, request)`` (replaces a previous opener)."""
    _SCHEMES[scheme.lower()] = opener


def _open_hf(url: str, request: SourceRequest) -> ByteSource:
    bucket = _HF_BUCKET.match(url)
    if bucket:
        return HubBucketSource(bucket["id"], bucket["prefix"] or "", token=request.token, http=request.http)
    dataset = _HF_DATASET.match(url)
    if dataset:
        revision = dataset["rev"] or request.revision
        if dataset["rev"] and request.revision and dataset["rev"] != request.revision:
            raise ConfigError(f"root {url} names revision {dataset['rev']}, --dataset.revision says {request.revision}")
        return HubRepoSource(dataset["id"], revision, token=request.token, http=request.http)
    raise ConfigError(f"cannot read {url}: expected hf://datasets/OWNER/NAME[@REVISION] or hf://buckets/OWNER/BUCKET")


def _open_file_url(url: str, request: SourceRequest) -> ByteSource:
    return LocalSource(url[len("file://"):])


def _open_fsspec(url: str, request: SourceRequest) -> ByteSource:
    return FsspecSource(url, request.storage_options)


def _open_s3(url: str, request: SourceRequest) -> ByteSource:
    if not reads_natively(request.storage_options):
        return FsspecSource(url, request.storage_options)
    return S3Source(url, request.storage_options, http=request.http)


def _open_http(url: str, request: SourceRequest) -> ByteSource:
    if request.storage_options:
        raise ConfigError(f"{url}: plain http(s) roots take no storage_options (no credentials or custom headers "
                          "are sent to them)")
    return HttpRootSource(url, http=request.http)


register_scheme("hf", _open_hf)
register_scheme("http", _open_http)
register_scheme("https", _open_http)
register_scheme("file", _open_file_url)
register_scheme("s3", _open_s3)
register_scheme("s3a", _open_s3)


def open_source(
    root: str | os.PathLike[str] | ByteSource | None = None,
    *,
    repo_id: str | None = None,
    revision: str | None = None,
    repo_type: str = "dataset",
    token: str | bool | None = None,
    http: HttpOptions | None = None,
    storage_options: dict[str, Any] | None = None,
) -> ByteSource:
    """The byte source of a dataset (see the module docstring for the rules)."""
    if isinstance(root, ByteSource):
        return root
    request = SourceRequest(revision=revision, token=token, http=http, storage_options=storage_options)
    if root is not None:
        text = os.fspath(root)
        scheme = _SCHEME.match(text)
        if scheme is None:
            return LocalSource(text)
        return _SCHEMES.get(scheme["scheme"].lower(), _open_fsspec)(text, request)
    if repo_id is None:
        raise ConfigError("give --dataset.repo_id=OWNER/NAME or --dataset.root=PATH_OR_URL")
    if repo_type not in REPO_TYPES:
        raise ConfigError(f"--dataset.repo_type must be one of {', '.join(REPO_TYPES)}, got {repo_type!r}")
    if repo_type == "bucket":
        return HubBucketSource(repo_id, token=token, http=http)
    if hub_offline():
        return _offline_copy(repo_id)
    return HubRepoSource(repo_id, revision, token=token, http=http)


def _offline_copy(repo_id: str) -> ByteSource:
    local = lerobot_home() / repo_id
    if not local.is_dir():
        raise SourceError(
            f"HF_HUB_OFFLINE is set and {repo_id} has no local copy at {local}: unset HF_HUB_OFFLINE to stream it "
            "from the Hub, or pass --dataset.root=/path/to/dataset"
        )
    log.warning("HF_HUB_OFFLINE is set: reading the local copy of %s at %s instead of the Hub", repo_id, local)
    return LocalSource(local)

