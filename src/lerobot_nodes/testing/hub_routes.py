"""The loopback Hub's routes: what each origin answers, as huggingface_hub 2.4.0 expects it.

:class:`HubRoutes` answers the Hub origin: ``/api/...`` for dataset repos and buckets, the
``/resolve/`` reads (LFS and bucket payloads through a 302 to a signed CDN URL), and the few
writes that publish sidecars. :class:`CdnRoutes` answers the CDN origin's signed URLs. Both work
over a :class:`~lerobot_nodes.testing.hub_store.Store`; the Hub routes read the rest of what
they need (the origins' URLs, redirects, signed URL lifetime, required token) from a
:class:`HubSettings` at each request, so a change to it applies from the next request on.

Routes raise :class:`~lerobot_nodes.testing.http_server.HttpError` for error answers; the
server turns them into responses with ``X-Error-Code`` / ``X-Error-Message`` headers, which the
client maps to its exception classes. Latency, faults and request records are the server's
business, not the routes'.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from lerobot_nodes.testing.http_server import HttpError, Request, Response, content, json_answer
from lerobot_nodes.testing.hub_store import Blob, Bucket, BucketObject, Commit, Store, repo_not_found

# The Hub pages tree listings at 1000 entries, 50 when each entry is expanded with its last commit.
_TREE_PAGE = 1000
_TREE_PAGE_EXPANDED = 50
# What S3/CloudFront answer for an expired or tampered signed URL.
_ACCESS_DENIED = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>"


@dataclass
class HubSettings:
    """What the Hub routes read at each request. The hub owns it; its options may change while
    the hub serves, and the endpoints are filled in once the origins are bound."""

    store: Store
    redirect: bool = True  # LFS and bucket payloads answer a 302 to a signed CDN URL
    signed_url_ttl_s: float = 3600.0
    require_token: str | None = None  # None: anonymous reads; else "Bearer <token>" is required
    endpoint: str = ""  # the Hub origin's URL, known once it is bound
    cdn_endpoint: str = ""  # the CDN origin's URL, likewise
    # The Hub's per-user quotas: request class ("api", "resolvers") -> (requests, window in seconds).
    rate_limits: dict[str, tuple[int, float]] = field(default_factory=dict)
    _windows: dict[str, tuple[float, int]] = field(default_factory=dict, repr=False)
    _windows_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self, kind: str) -> None:
        """Count one request of class ``kind`` in its fixed window; over quota, raise the Hub's 429
        (``RateLimit: "<kind>";r=0;t=<seconds to reset>``, ``RateLimit-Policy``, ``Retry-After``)."""
        limit = self.rate_limits.get(kind)
        if limit is None:
            return
        quota, window = limit
        now = time.monotonic()
        with self._windows_lock:
            start, used = self._windows.get(kind, (now, 0))
            if now >= start + window:
                start, used = now, 0
            used += 1
            self._windows[kind] = (start, used)
        if used <= quota:
            return
        reset = max(1, math.ceil(start + window - now))
        raise HttpError(
            429,
            f"You have been rate-limited: the {kind!r} quota of {quota} requests per {window:g} s is used up",
            None,
            {
                "RateLimit": f'"{kind}";r=0;t={reset}',
                "RateLimit-Policy": f'"fixed window";"{kind}";q={quota};w={math.ceil(window)}',
                "Retry-After": str(reset),
            },
        )


def request_class(segments: list[str]) -> str | None:
    """The Hub's rate-limit class of a Hub-origin request: ``api``, ``resolvers`` or ``None``."""
    if segments[:1] == ["api"]:
        return None if segments[1:2] == ["agent-harnesses"] else "api"
    if "resolve" in segments[:5]:
        return "resolvers"
    return None


def _file_entry(path: str, blob: Blob) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "file", "oid": blob.git_oid, "size": blob.size, "path": path}
    if blob.lfs:
        entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": blob.pointer_size}
        entry["xetHash"] = blob.xet_hash
    return entry


def _tree_entry(commit: Commit, path: str, expand: bool) -> dict[str, Any]:
    blob = commit.files.get(path)
    if blob is not None:
        entry = _file_entry(path, blob)
    else:
        entry = {"type": "directory", "oid": commit.dir_oids[path], "size": 0, "path": path}
    if expand:
        last = commit.last_change(path)
        entry["lastCommit"] = {"id": last.sha, "title": last.title, "date": last.date}
        if blob is not None:
            entry["securityFileStatus"] = {
                "status": "safe",
                "avScan": {"virusFound": False},
                "pickleImportScan": None,
            }
    return entry


def _bucket_file_entry(path: str, obj: BucketObject) -> dict[str, Any]:
    return {
        "type": "file",
        "path": path,
        "size": obj.blob.size,
        "xetHash": obj.blob.xet_hash,
        "mtime": obj.mtime,
        "uploadedAt": obj.uploaded_at,
    }


def _bucket_listing(bucket: Bucket, prefix: str, recursive: bool) -> list[dict[str, Any]]:
    """The Hub's bucket tree: a lexical prefix match; recursive lists files only, else one level.

    The level is the one below the prefix's folder: ``sub`` lists ``sub/a`` and folder ``sub/x``
    (and, lexically, ``sub_extra/...`` at the same depth, which HfFileSystem filters out).
    """
    matches = sorted((p, o) for p, o in bucket.objects.items() if p.startswith(prefix))
    if recursive:
        return [_bucket_file_entry(p, o) for p, o in matches]
    depth = prefix.rstrip("/").count("/") + 2 if prefix.rstrip("/") else 1
    files: list[dict[str, Any]] = []
    folders: dict[str, str] = {}
    for path, obj in matches:
        parts = path.split("/")
        if len(parts) <= depth:
            files.append(_bucket_file_entry(path, obj))
        else:
            folder = "/".join(parts[:depth])
            folders[folder] = max(folders.get(folder, ""), obj.uploaded_at)
    return [{"type": "directory", "path": f, "uploadedAt": u} for f, u in sorted(folders.items())] + files


@dataclass
class _CommitOperations:
    """The ndjson body of ``POST .../commit/{rev}``: a header line, then one line per operation."""

    header: dict[str, Any] = field(default_factory=dict)
    additions: dict[str, Blob] = field(default_factory=dict)
    deletions: list[str] = field(default_factory=list)
    deleted_folders: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, body: bytes) -> _CommitOperations:
        operations = cls()
        for line in filter(None, (raw.strip() for raw in body.splitlines())):
            try:
                operations._add(json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError):  # binascii.Error is a ValueError
                raise HttpError(400, "invalid commit payload line") from None
        return operations

    def _add(self, item: dict[str, Any]) -> None:
        key, value = item["key"], item["value"]
        if key == "header":
            self.header = dict(value)
        elif key == "file":
            content = value["content"]
            data = (
                base64.b64decode(content, validate=True)
                if value.get("encoding") == "base64"
                else content.encode()
            )
            self.additions[value["path"]] = Blob.of_bytes(value["path"], data)
        elif key == "deletedFile":
            self.deletions.append(value["path"])
        elif key == "deletedFolder":
            self.deleted_folders.append(value["path"].strip("/"))
        else:  # lfsFile: preupload never asks for LFS, so its bytes were never uploaded anywhere
            raise HttpError(400, f"unsupported commit operation {key!r} on the loopback hub")


# ----------------------------------------------------------------------------- routes


class HubRoutes:
    """The Hub origin: ``/api/...`` and ``/resolve/`` routes over the store."""

    def __init__(self, settings: HubSettings) -> None:
        self.settings = settings
        self.store = settings.store

    def handle(self, request: Request) -> Response:
        kind = request_class(request.segments)
        if kind is not None:
            self.settings.take(kind)
        self._check_token(request)
        match request.segments:
            case ["api", "agent-harnesses"]:
                raise HttpError(404, "not served by the loopback hub")
            case ["api", "datasets", owner, name, *rest]:
                return self._dataset_api(request, f"{owner}/{name}", rest)
            case ["api", "buckets", owner, name, *rest]:
                return self._bucket_api(request, f"{owner}/{name}", rest)
            case ["api", "models" | "spaces", owner, name, *_]:
                raise repo_not_found(f"{owner}/{name}")
            case ["datasets", owner, name, "resolve", revision, *path] if path:
                request.repo_revision = revision
                return self._resolve(request, f"{owner}/{name}", revision, "/".join(path))
            case ["buckets", owner, name, "resolve", *path] if path:
                return self._bucket_resolve(request, f"{owner}/{name}", "/".join(path))
            case ["spaces", owner, name, "resolve", *_] | [owner, name, "resolve", *_]:
                raise repo_not_found(f"{owner}/{name}")
        raise _unknown_route(request)

    def _check_token(self, request: Request) -> None:
        token = self.settings.require_token
        if token is None:
            return
        sent = request.headers.get("Authorization")
        if sent is None:
            # What the Hub answers anonymous clients of a private repo.
            raise HttpError(401, "Authorization required", "RepoNotFound")
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            raise HttpError(401, "Invalid credentials in Authorization header")

    # datasets

    def _dataset_api(self, request: Request, repo_id: str, rest: list[str]) -> Response:
        method = request.method
        match rest:
            case [] if method == "GET":
                with self.store.lock:
                    default = self.store.repo(repo_id).default_branch
                return self._info(request, repo_id, default)
            case ["revision", *revision] if method == "GET" and revision:
                return self._info(request, repo_id, "/".join(revision))
            case ["tree", revision, *path] if method == "GET":
                return self._tree(request, repo_id, revision, "/".join(path).strip("/"))
            case ["paths-info", revision] if method == "POST":
                return self._paths_info(request, repo_id, revision)
            case ["refs"] if method == "GET":
                return self._refs(request, repo_id)
            case ["commits", revision] if method == "GET":
                return self._commits(repo_id, revision)
            case ["branch", *branch] if method in ("POST", "DELETE") and branch:
                return self._branch(request, repo_id, "/".join(branch))
            case ["preupload", revision] if method == "POST":
                return self._preupload(request, repo_id, revision)
            case ["commit", revision] if method == "POST":
                return self._commit(request, repo_id, revision)
            case ["xet-read-token" | "xet-write-token", *_]:
                raise HttpError(501, "the loopback hub has no Xet storage: set HF_HUB_DISABLE_XET=1")
        raise _unknown_route(request)

    def _info(self, request: Request, repo_id: str, revision: str) -> Response:
        commit = self.store.commit_at(repo_id, revision)
        siblings = []
        for path in sorted(commit.files):
            sibling: dict[str, Any] = {"rfilename": path}
            if request.flag("blobs"):
                blob = commit.files[path]
                sibling.update(size=blob.size, blobId=blob.git_oid)
                if blob.lfs:
                    sibling["lfs"] = {
                        "size": blob.size,
                        "sha256": blob.sha256,
                        "pointerSize": blob.pointer_size,
                    }
            siblings.append(sibling)
        with self.store.lock:
            created_at = self.store.repo(repo_id).created_at
        return json_answer(
            {
                "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "author": repo_id.split("/")[0],
                "sha": commit.sha,
                "lastModified": commit.date,
                "createdAt": created_at,
                "private": self.settings.require_token is not None,
                "gated": False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "usedStorage": sum(b.size for b in commit.files.values()),
                "siblings": siblings,
            }
        )

    def _tree(self, request: Request, repo_id: str, revision: str, path: str) -> Response:
        commit = self.store.commit_at(repo_id, revision)
        if path not in commit.dir_oids:  # a missing path or a file: the Hub lists folders only
            raise HttpError(404, f"{path} is not a folder at {revision}", "EntryNotFound")
        expand = request.flag("expand")
        paths = commit.listing(path, request.flag("recursive"))
        try:
            cursor = int(request.param("cursor") or 0)
        except ValueError:
            raise HttpError(400, "invalid cursor") from None
        page = _TREE_PAGE_EXPANDED if expand else _TREE_PAGE
        headers = {}
        if cursor + page < len(paths):
            query = urlencode(
                {"recursive": request.flag("recursive"), "expand": expand, "cursor": cursor + page}
            )
            headers["Link"] = f'<{self.settings.endpoint}{request.raw_path}?{query.lower()}>; rel="next"'
        entries = [_tree_entry(commit, p, expand) for p in paths[cursor : cursor + page]]
        return json_answer(entries, headers=headers)

    def _paths_info(self, request: Request, repo_id: str, revision: str) -> Response:
        commit = self.store.commit_at(repo_id, revision)
        if "json" in request.headers.get("Content-Type", ""):
            body = request.json_object()
            paths, expand = list(body.get("paths", [])), bool(body.get("expand"))
        else:  # what HfApi.get_paths_info sends: paths=a&paths=b&expand=false
            form = parse_qs(request.body.decode(), keep_blank_values=True)
            paths, expand = form.get("paths", []), form.get("expand", [""])[-1].lower() in ("1", "true")
        known = [
            p.strip("/") for p in paths if p.strip("/") in commit.files or p.strip("/") in commit.dir_oids
        ]
        return json_answer([_tree_entry(commit, p, expand) for p in known if p])

    def _refs(self, request: Request, repo_id: str) -> Response:
        with self.store.lock:
            repo = self.store.repo(repo_id)
            branches = sorted(repo.branches.items())
            tags = sorted(repo.tags.items())
        payload: dict[str, Any] = {
            "branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": s} for n, s in branches],
            "converts": [],
            "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": s} for n, s in tags],
        }
        if request.flag("include_prs"):
            payload["pullRequests"] = []
        return json_answer(payload)

    def _commits(self, repo_id: str, revision: str) -> Response:
        commit: Commit | None = self.store.commit_at(repo_id, revision)
        history = []
        while commit is not None:
            history.append(
                {
                    "id": commit.sha,
                    "title": commit.title,
                    "message": "",
                    "authors": [{"user": "loopback"}],
                    "date": commit.date,
                }
            )
            commit = commit.parent
        return json_answer(history)

    def _branch(self, request: Request, repo_id: str, branch: str) -> Response:
        with self.store.lock:
            repo = self.store.repo(repo_id)
            if request.method == "DELETE":
                if branch not in repo.branches:
                    raise HttpError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
                if branch == repo.default_branch:
                    raise HttpError(403, "the default branch cannot be deleted")
                del repo.branches[branch]
                return json_answer({})
            if branch in repo.branches:
                raise HttpError(409, "Reference already exists")
            starting_point = request.json_object().get("startingPoint") or repo.default_branch
            start = self.store.commit_at(repo_id, starting_point)
            repo.branches[branch] = start.sha
        return json_answer({"name": branch, "ref": f"refs/heads/{branch}", "targetCommit": start.sha})

    def _preupload(self, request: Request, repo_id: str, revision: str) -> Response:
        if request.flag("create_pr"):
            raise HttpError(501, "pull requests are not supported by the loopback hub")
        head = self.store.branch_head(repo_id, revision)
        files = request.json_object().get("files", [])
        # Every file is "regular": its bytes then come inline with the commit, no LFS server needed.
        return json_answer(
            {
                "files": [
                    {
                        "path": f["path"],
                        "uploadMode": "regular",
                        "shouldIgnore": False,
                        "oid": head.files[f["path"]].git_oid if f["path"] in head.files else None,
                    }
                    for f in files
                ]
            }
        )

    def _commit(self, request: Request, repo_id: str, revision: str) -> Response:
        if request.flag("create_pr"):
            raise HttpError(501, "pull requests are not supported by the loopback hub")
        operations = _CommitOperations.parse(request.body)
        commit = self.store.change(
            repo_id,
            revision,
            operations.additions,
            operations.deletions,
            operations.deleted_folders,
            title=operations.header.get("summary") or "update",
            parent=operations.header.get("parentCommit"),
        )
        url = f"{self.settings.endpoint}/datasets/{repo_id}/commit/{commit.sha}"
        return json_answer({"commitOid": commit.sha, "commitUrl": url, "pullRequestUrl": None})

    def _resolve(self, request: Request, repo_id: str, revision: str, path: str) -> Response:
        _require_read(request)
        commit = self.store.commit_at(repo_id, revision)
        # X-Repo-Commit even on a 404 lets the client cache the file's absence at this commit.
        headers = {"X-Repo-Commit": commit.sha, "Accept-Ranges": "bytes"}
        blob = commit.files.get(path)
        if blob is None or self.store.is_hidden(path):
            raise HttpError(404, f"Entry not found: {path}", "EntryNotFound", headers)
        if not blob.lfs:
            return content(blob, request.headers.get("Range"), {**headers, "ETag": f'"{blob.git_oid}"'})
        etag = f'"{blob.sha256}"'
        headers.update(
            {
                "ETag": etag,
                "X-Linked-Etag": etag,
                "X-Linked-Size": str(blob.size),
                "X-Xet-Hash": blob.xet_hash,
                "Link": f'<{self.settings.endpoint}/api/datasets/{repo_id}/xet-read-token/{commit.sha}>; rel="xet-auth"',
            }
        )
        return self._payload(request, path, blob, etag, headers)

    def _payload(
        self, request: Request, path: str, blob: Blob, etag: str, headers: dict[str, str]
    ) -> Response:
        """A 302 to a fresh signed CDN URL, or the content itself when redirects are off."""
        if not self.settings.redirect:
            return content(blob, request.headers.get("Range"), headers)
        ttl = self.settings.signed_url_ttl_s
        token = self.store.sign(path, blob, etag, ttl)
        # The expiry in the query, as the Hub's CDNs sign it (S3 style and CloudFront style); the CDN
        # route reads only the token. Rounded down: a client never believes it later than it is.
        now = time.time()
        query = urlencode({
            "X-Amz-Date": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)), "X-Amz-Expires": int(ttl),
            "Expires": int(now + ttl),
        })
        headers["Location"] = f"{self.settings.cdn_endpoint}/{token}/{quote(path)}?{query}"
        return Response(302, headers)

    # buckets

    def _bucket_api(self, request: Request, bucket_id: str, rest: list[str]) -> Response:
        method = request.method
        match rest:
            case [] if method == "GET":
                with self.store.lock:
                    objects = list(self.store.bucket(bucket_id).objects.values())
                    created_at = self.store.buckets[bucket_id].created_at
                return json_answer(
                    {
                        "id": bucket_id,
                        "private": self.settings.require_token is not None,
                        "createdAt": created_at,
                        "size": sum(o.blob.size for o in objects),
                        "totalFiles": len(objects),
                    }
                )
            case ["tree", *prefix] if method == "GET":
                with self.store.lock:
                    listing = _bucket_listing(
                        self.store.bucket(bucket_id), "/".join(prefix), request.flag("recursive")
                    )
                return json_answer(listing)
            case ["paths-info"] if method == "POST":
                paths = request.json_object().get("paths", [])
                with self.store.lock:
                    found = self.store.bucket(bucket_id).objects
                    return json_answer([_bucket_file_entry(p, found[p]) for p in paths if p in found])
            case ["batch"] | ["xet-write-token", *_] | ["xet-read-token", *_] | []:
                with self.store.lock:
                    self.store.bucket(bucket_id)
                raise HttpError(
                    501, "bucket writes and Xet reads need Xet storage, which the loopback hub lacks"
                )
        raise _unknown_route(request)

    def _bucket_resolve(self, request: Request, bucket_id: str, path: str) -> Response:
        _require_read(request)
        with self.store.lock:
            obj = self.store.bucket(bucket_id).objects.get(path)
        if obj is None or self.store.is_hidden(path):
            raise HttpError(404, f"Entry not found: {path}", "EntryNotFound")
        etag = f'"{obj.blob.xet_hash}"'
        headers = {
            "Accept-Ranges": "bytes",
            "ETag": etag,
            "X-Linked-Etag": etag,
            "X-Linked-Size": str(obj.blob.size),
            "X-Xet-Hash": obj.blob.xet_hash,
            "Link": f'<{self.settings.endpoint}/api/buckets/{bucket_id}/xet-read-token>; rel="xet-auth"',
        }
        return self._payload(request, path, obj.blob, etag, headers)


class CdnRoutes:
    """The CDN origin: ``GET/HEAD /{token}/{path}``; it never looks at Authorization."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def handle(self, request: Request) -> Response:
        _require_read(request)
        if len(request.segments) < 2:
            raise HttpError(404, "not found")
        token, path = request.segments[0], "/".join(request.segments[1:])
        signed = self.store.signed(token)
        if signed is None or signed.path != path:
            return Response(403, {"Content-Type": "application/xml"}, _ACCESS_DENIED)
        if self.store.is_hidden(signed.path):
            raise HttpError(404, f"Entry not found: {path}", "EntryNotFound")
        return content(signed.blob, request.headers.get("Range"), {"ETag": signed.etag})


def _require_read(request: Request) -> None:
    if request.method not in ("GET", "HEAD"):
        raise HttpError(405, f"{request.method} is not allowed here")


def _unknown_route(request: Request) -> HttpError:
    # 404/501, never a retried 5xx: a client retrying an unimplemented route would stall ~23 s.
    if request.method in ("GET", "HEAD"):
        return HttpError(404, f"the loopback hub does not serve {request.raw_path}")
    return HttpError(501, f"the loopback hub does not implement {request.method} {request.raw_path}")
