"""The loopback Hub's content: git-like dataset repos, storage buckets and signed CDN URLs.

A :class:`Blob` is one file's bytes (in memory, or read from disk when served) with the
identities the Hub reports for it: git oid, sha256, a stand-in Xet hash, and whether the Hub's
default ``.gitattributes`` would put it in LFS. A :class:`Repo` is a chain of immutable
:class:`Commit` snapshots with branches and tags; a :class:`Bucket` is a flat map of objects.
The :class:`Store` holds them all, plus hidden paths and the signed URLs handed to the CDN.

Everything here is guarded by ``Store.lock``; commits and blobs are immutable once created, so
handler threads can read them without the lock once they hold a reference. Lookups that fail
raise :class:`~lerobot_nodes.testing.http_server.HttpError` with the Hub's own status and
``X-Error-Code``, ready to be answered as they are. This module knows nothing of HTTP routes.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from lerobot_nodes.testing.http_server import HttpError

# The Hub's default .gitattributes routes these to LFS whatever their size.
_LFS_SUFFIXES = frozenset(
    {".parquet", ".mp4", ".npz", ".npy", ".arrow", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5"}
    | {".zip", ".tar", ".gz", ".zst", ".png", ".jpg", ".jpeg", ".webp", ".avi", ".mkv", ".webm"}
)
_TEXT_SUFFIXES = frozenset({".json", ".jsonl", ".md", ".txt", ".yaml", ".yml", ".csv"})
_SMALL_FILE = 10 * 1024
_TEXT_FILE_LIMIT = 10 * 1024 * 1024  # the Hub refuses larger non-LFS files
_READ_CHUNK = 1024 * 1024  # what hashing a file reads at once


def iso(ts: float) -> str:
    """The Hub's timestamp format: ``2026-01-02T03:04:05.678Z``."""
    moment = datetime.fromtimestamp(ts, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _is_lfs(path: str, size: int) -> bool:
    """Binary payloads always go to LFS, text stays in git unless huge, anything else from 10 KB."""
    suffix = Path(path).suffix.lower()
    if suffix in _LFS_SUFFIXES:
        return True
    if suffix in _TEXT_SUFFIXES:
        return size >= _TEXT_FILE_LIMIT
    return size >= _SMALL_FILE


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class Blob:
    """One file's bytes (in memory or on disk) and its identities.

    ``git_oid`` is the git blob sha1 of the content for regular files and of the LFS pointer for
    LFS files, like the Hub's tree ``oid``. ``xet_hash`` is a 64-hex content hash distinct from
    ``sha256`` (a real Xet hash differs from the sha256 too), so clients cannot mix them up.
    """

    size: int
    git_oid: str
    sha256: str
    xet_hash: str
    lfs: bool
    # Where the bytes are; blobs compare by content identity only.
    data: bytes | None = field(default=None, repr=False, compare=False)
    source: Path | None = field(default=None, compare=False)

    @classmethod
    def of_bytes(cls, path: str, data: bytes) -> Blob:
        return cls._hashed(path, [data], len(data), data=data)

    @classmethod
    def of_file(cls, path: str, source: Path) -> Blob:
        size = source.stat().st_size

        def chunks() -> Iterator[bytes]:
            with open(source, "rb") as file:
                while chunk := file.read(_READ_CHUNK):
                    yield chunk

        return cls._hashed(path, chunks(), size, source=source)

    @classmethod
    def _hashed(cls, path: str, chunks: Any, size: int, **storage: Any) -> Blob:
        git = hashlib.sha1(f"blob {size}\0".encode())
        sha256 = hashlib.sha256()
        xet = hashlib.sha256(b"loopback-xet\0")
        for chunk in chunks:
            git.update(chunk)
            sha256.update(chunk)
            xet.update(chunk)
        lfs = _is_lfs(path, size)
        git_oid = git.hexdigest()
        if lfs:
            pointer = _lfs_pointer(sha256.hexdigest(), size)
            git_oid = hashlib.sha1(f"blob {len(pointer)}\0".encode() + pointer).hexdigest()
        return cls(size, git_oid, sha256.hexdigest(), xet.hexdigest(), lfs, **storage)

    @property
    def pointer_size(self) -> int:
        return len(_lfs_pointer(self.sha256, self.size))

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        assert self.source is not None
        with open(self.source, "rb") as file:
            file.seek(start)
            return file.read(end - start)


class Commit:
    """An immutable snapshot of every file of a repo, with its parent chain."""

    def __init__(
        self, sha: str, parent: Commit | None, files: Mapping[str, Blob], title: str, date: str
    ) -> None:
        self.sha = sha
        self.parent = parent
        self.files = dict(files)
        self.title = title
        self.date = date
        old = parent.files if parent is not None else {}
        self.changed = frozenset(p for p in self.files.keys() | old.keys() if self.files.get(p) != old.get(p))

    @cached_property
    def dir_oids(self) -> dict[str, str]:
        """Every directory (``""`` is the root) mapped to a sha1 over its files' paths and oids."""
        members: dict[str, list[str]] = {}
        for path in sorted(self.files):
            parts = path.split("/")
            for depth in range(len(parts)):
                members.setdefault("/".join(parts[:depth]), []).append(f"{path} {self.files[path].git_oid}")
        return {d: hashlib.sha1("\n".join([d, *lines]).encode()).hexdigest() for d, lines in members.items()}

    def listing(self, directory: str, recursive: bool) -> list[str]:
        """Paths of the files and directories below ``directory`` (children only unless recursive)."""
        prefix = f"{directory}/" if directory else ""
        paths = [p for p in sorted(self.files.keys() | (self.dir_oids.keys() - {""})) if p.startswith(prefix)]
        return paths if recursive else [p for p in paths if "/" not in p[len(prefix) :]]

    def last_change(self, path: str) -> Commit:
        """The newest commit in this commit's history that changed ``path`` or anything below it."""
        commit: Commit | None = self
        while commit is not None:
            if path in commit.changed or any(p.startswith(f"{path}/") for p in commit.changed):
                return commit
            commit = commit.parent
        return self


class Repo:
    """A dataset repo: commits, branches and tags. The caller holds the store lock."""

    def __init__(self, repo_id: str, default_branch: str) -> None:
        self.repo_id = repo_id
        self.created_at = iso(time.time())
        self.default_branch = default_branch
        self.commits: dict[str, Commit] = {}
        self.branches: dict[str, str] = {}
        self.tags: dict[str, str] = {}

    def resolve(self, revision: str) -> Commit | None:
        """A branch, then a tag, then a full commit sha (as the Hub resolves revisions)."""
        sha = self.branches.get(revision) or self.tags.get(revision) or revision
        return self.commits.get(sha)

    def commit(self, branch: str, files: Mapping[str, Blob], title: str) -> Commit:
        """Add a commit with exactly ``files`` on ``branch`` (created when missing)."""
        head = self.branches.get(branch)
        parent = self.commits[head] if head is not None else None
        digest = hashlib.sha1(f"{self.repo_id}\0{head}\0{title}\0{len(self.commits)}".encode())
        for path in sorted(files):
            digest.update(f"\0{path}\0{files[path].git_oid}".encode())
        commit = Commit(digest.hexdigest(), parent, files, title, iso(time.time()))
        self.commits[commit.sha] = commit
        self.branches[branch] = commit.sha
        return commit


@dataclass(frozen=True)
class BucketObject:
    blob: Blob
    mtime: str
    uploaded_at: str


@dataclass
class Bucket:
    bucket_id: str
    created_at: str
    objects: dict[str, BucketObject] = field(default_factory=dict)


@dataclass(frozen=True)
class SignedUrl:
    """What one CDN URL serves: pinned content (like the real CDN's content-addressed URLs)."""

    path: str
    blob: Blob
    etag: str
    expires_at: float  # time.monotonic()


def repo_not_found(repo_id: str) -> HttpError:
    return HttpError(404, f"Repository {repo_id} not found", "RepoNotFound")


class Store:
    """Repos, buckets, hidden paths and signed URLs, behind one lock (handler threads share it)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.repos: dict[str, Repo] = {}
        self.buckets: dict[str, Bucket] = {}
        self.hidden: set[str] = set()
        self._signed: dict[str, SignedUrl] = {}
        self._prune_at = 10_000

    def repo(self, repo_id: str) -> Repo:
        repo = self.repos.get(repo_id)
        if repo is None:
            raise repo_not_found(repo_id)
        return repo

    def commit_at(self, repo_id: str, revision: str) -> Commit:
        with self.lock:
            commit = self.repo(repo_id).resolve(revision)
        if commit is None:
            raise HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    def branch_head(self, repo_id: str, branch: str) -> Commit:
        """The head of a branch; tags and shas are not writable, so they are not found here."""
        with self.lock:
            repo = self.repo(repo_id)
            sha = repo.branches.get(branch)
            if sha is None:
                raise HttpError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            return repo.commits[sha]

    def bucket(self, bucket_id: str) -> Bucket:
        bucket = self.buckets.get(bucket_id)
        if bucket is None:
            raise HttpError(404, f"Bucket {bucket_id} not found", "RepoNotFound")
        return bucket

    def change(
        self,
        repo_id: str,
        branch: str,
        additions: Mapping[str, Blob],
        deletions: Sequence[str] = (),
        deleted_folders: Sequence[str] = (),
        title: str = "update",
        parent: str | None = None,
    ) -> Commit:
        """A new commit on an existing branch: its head's files, minus deletions, plus additions."""
        with self.lock:
            head = self.branch_head(repo_id, branch)
            if parent is not None and parent != head.sha:
                raise HttpError(412, f"parent commit {parent} is not the head of {branch} ({head.sha})")
            files = dict(head.files)
            for folder in deleted_folders:
                below = [p for p in files if p.startswith(f"{folder}/")]
                if not below:
                    raise HttpError(404, f"A folder with this name doesn't exist: {folder}", "EntryNotFound")
                for path in below:
                    del files[path]
            for path in deletions:
                if files.pop(path, None) is None:
                    raise HttpError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
            files.update(additions)
            return self.repos[repo_id].commit(branch, files, title)

    def is_hidden(self, path: str) -> bool:
        with self.lock:
            return any(path == h or path.endswith(f"/{h}") for h in self.hidden)

    def sign(self, path: str, blob: Blob, etag: str, ttl_s: float) -> str:
        """A fresh token for one CDN URL (the real Hub signs a new URL at every resolve)."""
        token = secrets.token_hex(16)
        with self.lock:
            if len(self._signed) >= self._prune_at:  # long benchmarks: forget expired URLs now and then
                now = time.monotonic()
                self._signed = {t: s for t, s in self._signed.items() if s.expires_at > now}
                self._prune_at = max(10_000, 2 * len(self._signed))
            self._signed[token] = SignedUrl(path, blob, etag, time.monotonic() + ttl_s)
        return token

    def signed(self, token: str) -> SignedUrl | None:
        """The URL's target, or None when it is unknown, expired or revoked."""
        with self.lock:
            signed = self._signed.get(token)
        if signed is None or time.monotonic() >= signed.expires_at:
            return None
        return signed

    def expire_signed_urls(self) -> None:
        with self.lock:
            self._signed.clear()
