"""Hub dataset repos (pinned to one commit) and Hub storage buckets as byte sources.

huggingface_hub stays in charge of what it is for (revisions, listings, auth); payload bytes
go through the native range reader of :mod:`.http_range`.

- A dataset repo's revision (branch, tag or sha) is resolved **once, at open, to a commit
  sha**; the tree is listed at that sha and every read goes to ``resolve/<sha>/...``. With
  no revision, LeRobot's own rule picks the codebase-version tag (``v3.0``), so the same
  flags give the same data as LeRobot.
- A bucket has no revisions: each object's ``xetHash`` from the listing taken at open is its
  identity, so an object replaced at the same path (even with the same size) is detected.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..errors import SourceAuthError, SourceError, SourceFileNotFoundError, SourceUnavailableError
from .base import FileInfo
from .file_cache import FileCache, default_file_cache_root, slug
from .http_range import HttpOptions
from .hub_auth import HubCredentials, hub_endpoint
from .listed import ListedHttpSource

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


def lerobot_safe_revision(api: Any, repo_id: str, version: str = CODEBASE_VERSION) -> str:
    """The revision LeRobot reads when none is given: the tag or branch of codebase ``version``,
    else the highest same-major one with a lower minor; LeRobot's errors otherwise."""
    from packaging.version import InvalidVersion, Version

    refs = api.list_repo_refs(repo_id, repo_type="dataset")
    versions = {}
    for ref in [*refs.branches, *refs.tags]:
        try:
            versions[Version(ref.name)] = ref.name
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
        with hub_errors(what, self.endpoint):
            self.requested_revision = revision if revision is not None else lerobot_safe_revision(api, repo_id)
            self.sha = str(api.repo_info(repo_id, repo_type="dataset", revision=self.requested_revision).sha)
        cache = Path(cache_root) if cache_root is not None else default_file_cache_root()
        self._cache_root = cache
        folder = cache / "datasets" / slug(repo_id) / self.sha
        files = _cached_listing(FileCache(folder), self.sha, lambda: self._list(api, what))
        super().__init__(files, credentials, http, folder)
        if self.requested_revision != self.sha:
            log.info("%s: revision %s is commit %s; every read is pinned to it", what, self.requested_revision, self.sha)

    def _list(self, api: Any, what: str) -> list[FileInfo]:
        from huggingface_hub.hf_api import RepoFile

        with hub_errors(what, self.endpoint):
            entries = api.list_repo_tree(self.repo_id, recursive=True, revision=self.sha, repo_type="dataset")
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
        with hub_errors(what, self.endpoint):
            if not hasattr(api, "list_bucket_tree"):
                raise SourceError("reading Hub buckets needs huggingface_hub >= 1.0 with bucket support: "
                                  "pip install -U huggingface_hub")
            base = f"{self.prefix}/" if self.prefix else ""
            files = [
                FileInfo(entry.path[len(base):], int(entry.size), str(entry.xet_hash))
                for entry in api.list_bucket_tree(bucket_id, prefix=self.prefix or None, recursive=True)
                if getattr(entry, "type", "file") == "file" and entry.path.startswith(base)
            ]
        cache = Path(cache_root) if cache_root is not None else default_file_cache_root()
        super().__init__(files, credentials, http, cache / "buckets" / slug(bucket_id))

    @property
    def url(self) -> str:
        return f"hf://buckets/{self.bucket_id}" + (f"/{self.prefix}" if self.prefix else "")

    def file_url(self, path: str) -> str:
        full = f"{self.prefix}/{path}" if self.prefix else path
        return f"{self.endpoint}/buckets/{self.bucket_id}/resolve/{quote(full)}"


def _cached_listing(cache: FileCache, sha: str, list_files: Any) -> list[FileInfo]:
    """The tree at commit ``sha``: immutable, so listed once and kept beside the metadata."""
    cached = cache.get(".tree.json", sha)
    if cached is not None:
        try:
            return [FileInfo(path, size, fingerprint) for path, size, fingerprint in json.loads(cached)]
        except (ValueError, TypeError):
            pass
    files = list_files()
    cache.put(".tree.json", sha, json.dumps([[f.path, f.size, f.fingerprint] for f in files]).encode())
    return files
