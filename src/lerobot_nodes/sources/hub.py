"""Hub dataset repos (pinned to one commit) and Hub storage buckets as byte sources.

huggingface_hub stays in charge of what it is for (revisions, listings, auth); payload bytes
go through the native range reader of :mod:`.http_range`.

- A dataset repo's revision (branch, tag or sha) is resolved **once, at open, to a commit
  sha**; the tree is listed at that sha and every read goes to ``resolve/<sha>/...``. With
  no revision, LeRobot's own rule picks the codebase-version tag (``v3.0``), so the same
  flags give the same data as LeRobot.
- A bucket has no revisions: each object's ``xetHash`` from the listing taken at open is its
  identity, so an object replaced at the same path (even with the same size) is detected.
- **Once per node**: revision lookups, ref listings, tree listings and ``meta/`` reads are fetched
  by one process of the node and shared with the others through :mod:`.node_cache` (what a sha
  pins: forever; what a branch or tag resolves to: by the ranks of one job for ``moving_ttl_s()``);
  each file's signed redirect target likewise, until it expires.
- **Rate limits**: huggingface_hub's ``repo_info`` and ``list_repo_refs`` do not retry; a ``429``
  of any API call here is waited out (the ``RateLimit`` reset or ``Retry-After``, logged once per
  quota) and retried, up to the reader's retry budget (``--dataset.streaming_http_retries``).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..errors import SourceAuthError, SourceError, SourceFileNotFoundError, SourceUnavailableError
from .base import FileInfo
from .file_cache import FileCache, default_file_cache_root, slug
from .http_range import HttpOptions, HttpStats
from .hub_auth import HubCredentials, hub_endpoint
from .listed import ListedHttpSource
from .node_cache import LocationStore, NodeCache, job_id, moving_ttl_s
from .rate_limit import note_rate_limit, rate_limit_wait

TREE_PAGE = 1000
"""Entries per page of the Hub's tree listings (each page is one API call)."""
_SHA = re.compile(r"^[0-9a-f]{40}$")

log = logging.getLogger("lerobot_nodes.sources")

CODEBASE_VERSION = "v3.0"
"""The LeRobot dataset format this package reads; also the default revision tag, as in LeRobot."""
PUBLISHED_SIDECAR_BRANCH = "lerobot-sidecars"


@contextmanager
def hub_errors(what: str, endpoint: str):
    """Turn huggingface_hub's exceptions into this package's, naming ``what`` (never a token)."""
    from huggingface_hub import errors

    try:
        yield
    except errors.RevisionNotFoundError as error:
        raise SourceFileNotFoundError(f"{what}: revision not found ({_first_line(error)})") from None
    except errors.GatedRepoError as error:
        raise SourceAuthError(f"{what}: the repo is gated and this token has no access ({_first_line(error)})") from None
    except errors.RepositoryNotFoundError as error:
        if _status(error) == 401:
            raise SourceAuthError(
                f"{what}: {endpoint} answered 401: the repo is private or does not exist, and the request had no "
                f"valid token ({_first_line(error)})"
            ) from None
        raise SourceFileNotFoundError(
            f"{what}: not found at {endpoint}, or private and the token has no access ({_first_line(error)})"
        ) from None
    except errors.HfHubHTTPError as error:
        status = _status(error)
        if status in (401, 403):
            raise SourceAuthError(f"{what}: {endpoint} answered {status} ({_first_line(error)})") from None
        if status == 404:
            raise SourceFileNotFoundError(f"{what}: not found at {endpoint} ({_first_line(error)})") from None
        raise SourceUnavailableError(f"{what}: {endpoint} answered {status} ({_first_line(error)})") from None
    except SourceError:  # our own errors are OSErrors too: keep them as they are
        raise
    except OSError as error:
        raise SourceUnavailableError(f"{what}: cannot reach the Hub at {endpoint} ({type(error).__name__}: "
                                     f"{_first_line(error)})") from None


def _status(error: BaseException) -> int | None:
    return getattr(getattr(error, "response", None), "status_code", None)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def hf_api(endpoint: str, credentials: HubCredentials) -> Any:
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=credentials.api_token(), library_name="lerobot_nodes")


def api_call(call: Callable[[], Any], stats: HttpStats, *, retries: int, where: str, pages: Callable[[Any], int] | None = None) -> Any:
    """``call()`` (huggingface_hub API requests), counted in ``stats.api_requests`` (``pages(result)``
    requests for a paginated answer), its ``429`` answers waited out and retried up to ``retries``
    attempts in all (the ``RateLimit`` reset or ``Retry-After``; the first logged once per quota)."""
    from huggingface_hub import errors

    attempts = 0
    while True:
        attempts += 1
        try:
            result = call()
        except errors.HfHubHTTPError as error:
            stats.api_requests += 1
            response = getattr(error, "response", None)
            if _status(error) != 429 or attempts >= max(1, retries):
                raise
            headers = dict(getattr(response, "headers", {}) or {})
            wait = rate_limit_wait(headers)
            wait = wait if wait is not None else min(8.0, 0.5 * 2 ** (attempts - 1))
            note_rate_limit(headers, "api", where, wait)
            stats.retries += 1
            stats.rate_limited += 1
            time.sleep(wait)
            continue
        stats.api_requests += pages(result) if pages is not None else 1
        return result


def _tree_pages(entries: list[Any]) -> int:
    return max(1, -(-len(entries) // TREE_PAGE))


def _credential_key(credentials: HubCredentials) -> str:
    """What of the credentials a shared answer depends on: whether a token is sent (never the token)."""
    return "token" if credentials.token() else "anonymous"


def lerobot_safe_revision(
    api: Any, repo_id: str, version: str = CODEBASE_VERSION, ref_names: list[str] | None = None
) -> str:
    """The revision LeRobot reads when none is given: the tag or branch of codebase ``version``,
    else the highest same-major one with a lower minor; LeRobot's errors otherwise.
    ``ref_names`` (the repo's branch and tag names) saves the ref listing when known."""
    from packaging.version import InvalidVersion, Version

    if ref_names is None:
        refs = api.list_repo_refs(repo_id, repo_type="dataset")
        ref_names = [ref.name for ref in [*refs.branches, *refs.tags]]
    versions = {}
    for name in ref_names:
        try:
            versions[Version(name)] = name
        except InvalidVersion:
            continue
    target = Version(version)
    if not versions:
        raise SourceError(
            f"{repo_id} has no codebase-version tag: LeRobot reads the tag {version} when no revision is given. "
            f"Tag the dataset (HfApi().create_tag({repo_id!r}, tag={version!r}, repo_type='dataset')) or pass "
            "--dataset.revision=BRANCH_TAG_OR_SHA"
        )
    if target in versions:
        return versions[target]
    compatible = [v for v in versions if v.major == target.major and v.minor <= target.minor]
    if compatible:
        best = max(compatible)
        log.warning("revision %s of %s not found, using %s (as LeRobot does)", version, repo_id, versions[best])
        return versions[best]
    older = [v for v in versions if v.major < target.major]
    if older:
        raise SourceError(
            f"{repo_id} is tagged {versions[max(older)]} only, an older LeRobot format: convert it to v3.0 with "
            "LeRobot's convert_dataset_v21_to_v30"
        )
    newer = min(v for v in versions if v > target)
    raise SourceError(f"{repo_id} is tagged {versions[newer]}, a newer format than this reader's {version}: "
                      "upgrade lerobot_nodes")


class HubRepoSource(ListedHttpSource):
    """A Hub dataset repo at one commit. ``revision`` (branch, tag, sha or ``None`` for LeRobot's
    codebase-version tag) is resolved to the commit sha once, here."""

    credentials: HubCredentials

    def __init__(
        self,
        repo_id: str,
        revision: str | None = None,
        *,
        token: str | bool | None = None,
        endpoint: str | None = None,
        http: HttpOptions | None = None,
        cache_root: Path | None = None,
        credentials: HubCredentials | None = None,
    ) -> None:
        self.repo_id = repo_id
        self.endpoint = hub_endpoint(endpoint)
        credentials = credentials or HubCredentials(token)
        api = hf_api(self.endpoint, credentials)
        what = f"dataset repo {repo_id}"
        cache = Path(cache_root) if cache_root is not None else default_file_cache_root()
        self._cache_root = cache
        node = NodeCache(cache / "hub")
        stats = HttpStats()
        retries = (http or HttpOptions()).retries
        scope = f"{self.endpoint}\0dataset\0{repo_id}\0{_credential_key(credentials)}"
        job = f"\0{job_id()}"  # what may move is shared within one job only

        def call(function: Callable[[], Any], pages: Callable[[Any], int] | None = None) -> Any:
            with hub_errors(what, self.endpoint):
                return api_call(function, stats, retries=retries, where=f"{self.endpoint}/api/datasets/{repo_id}",
                                pages=pages)

        if revision is None:
            names = node.shared(f"refs\0{scope}{job}", lambda: _ref_names(call(
                lambda: api.list_repo_refs(repo_id, repo_type="dataset"))), ttl_s=moving_ttl_s())
            with hub_errors(what, self.endpoint):
                revision = lerobot_safe_revision(api, repo_id, ref_names=names)
        self.requested_revision = revision
        self.sha = str(node.shared(
            f"revision\0{scope}\0{revision}" + ("" if _SHA.match(revision) else job),
            lambda: str(call(lambda: api.repo_info(repo_id, repo_type="dataset", revision=revision)).sha),
            ttl_s=None if _SHA.match(revision) else moving_ttl_s(),
        ))
        folder = cache / "datasets" / slug(repo_id) / self.sha
        files = _cached_listing(FileCache(folder), self.sha, lambda: self._list(api, call))
        super().__init__(files, credentials, http, folder, LocationStore(cache / "hub"))
        self._add_api_stats(stats)
        if self.requested_revision != self.sha:
            log.info("%s: revision %s is commit %s; every read is pinned to it", what, self.requested_revision, self.sha)

    def _list(self, api: Any, call: Callable[..., Any]) -> list[FileInfo]:
        from huggingface_hub.hf_api import RepoFile

        entries = call(
            lambda: list(api.list_repo_tree(self.repo_id, recursive=True, revision=self.sha, repo_type="dataset")),
            _tree_pages,
        )
        return [
            FileInfo(entry.path, int(entry.size), entry.lfs.sha256 if entry.lfs is not None else entry.blob_id)
            for entry in entries
            if isinstance(entry, RepoFile)
        ]

    @property
    def url(self) -> str:
        return f"hf://datasets/{self.repo_id}@{self.sha}"

    @property
    def revision(self) -> str:
        return self.sha

    @property
    def byte_cache_group(self) -> str:
        return slug(self.repo_id)

    def file_url(self, path: str) -> str:
        return f"{self.endpoint}/datasets/{self.repo_id}/resolve/{self.sha}/{quote(path)}"

    def published_sidecar_source(self) -> HubRepoSource | None:
        """The ``lerobot-sidecars`` branch, where maintainers publish verified sidecars, if it exists."""
        try:
            return HubRepoSource(
                self.repo_id, PUBLISHED_SIDECAR_BRANCH, endpoint=self.endpoint, http=self.reader.options,
                credentials=self.credentials, cache_root=self._cache_root,
            )
        except SourceFileNotFoundError:
            return None


class HubBucketSource(ListedHttpSource):
    """A Hub storage bucket (or a folder of one). Identity: each object's ``xetHash`` from the
    listing taken here; metadata, Parquet and videos live under the same root."""

    credentials: HubCredentials

    def __init__(
        self,
        bucket_id: str,
        prefix: str = "",
        *,
        token: str | bool | None = None,
        endpoint: str | None = None,
        http: HttpOptions | None = None,
        cache_root: Path | None = None,
    ) -> None:
        self.bucket_id = bucket_id
        self.prefix = prefix.strip("/")
        self.endpoint = hub_endpoint(endpoint)
        credentials = HubCredentials(token)
        api = hf_api(self.endpoint, credentials)
        what = f"bucket {bucket_id}"
        cache = Path(cache_root) if cache_root is not None else default_file_cache_root()
        stats = HttpStats()
        retries = (http or HttpOptions()).retries
        base = f"{self.prefix}/" if self.prefix else ""

        def listing() -> list[list[Any]]:
            with hub_errors(what, self.endpoint):
                if not hasattr(api, "list_bucket_tree"):
                    raise SourceError("reading Hub buckets needs huggingface_hub >= 1.0 with bucket support: "
                                      "pip install -U huggingface_hub")
                entries = api_call(
                    lambda: list(api.list_bucket_tree(bucket_id, prefix=self.prefix or None, recursive=True)),
                    stats, retries=retries, where=f"{self.endpoint}/api/buckets/{bucket_id}", pages=_tree_pages,
                )
            return [
                [entry.path[len(base):], int(entry.size), str(entry.xet_hash)]
                for entry in entries
                if getattr(entry, "type", "file") == "file" and entry.path.startswith(base)
            ]

        # A bucket is mutable: its listing is shared by the processes that wait for it, and, within one
        # job (torchrun, SLURM, ...), by the job's ranks for moving_ttl_s(), so they see one snapshot.
        key = f"bucket\0{self.endpoint}\0{bucket_id}\0{self.prefix}\0{_credential_key(credentials)}\0{job_id()}"
        rows = NodeCache(cache / "hub").shared(key, listing, ttl_s=moving_ttl_s())
        files = [FileInfo(path, size, fingerprint) for path, size, fingerprint in rows]
        super().__init__(files, credentials, http, cache / "buckets" / slug(bucket_id), LocationStore(cache / "hub"))
        self._add_api_stats(stats)

    @property
    def url(self) -> str:
        return f"hf://buckets/{self.bucket_id}" + (f"/{self.prefix}" if self.prefix else "")

    @property
    def byte_cache_group(self) -> str:
        return slug(self.bucket_id)

    def file_url(self, path: str) -> str:
        full = f"{self.prefix}/{path}" if self.prefix else path
        return f"{self.endpoint}/buckets/{self.bucket_id}/resolve/{quote(full)}"


def _ref_names(refs: Any) -> list[str]:
    return [ref.name for ref in [*refs.branches, *refs.tags]]


def _cached_listing(cache: FileCache, sha: str, list_files: Any) -> list[FileInfo]:
    """The tree at commit ``sha``: immutable, so listed once per node (the other processes wait for
    it) and kept beside the metadata."""

    def valid(data: bytes) -> bool:
        try:
            json.loads(data)
        except ValueError:
            return False
        return True

    def fetch() -> bytes:
        return json.dumps([[f.path, f.size, f.fingerprint] for f in list_files()]).encode()

    data = cache.get_or_fetch(".tree.json", sha, fetch, valid)
    return [FileInfo(path, size, fingerprint) for path, size, fingerprint in json.loads(data)]
