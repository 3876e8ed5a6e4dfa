"""A plain ``http(s)://`` dataset root served by any static HTTP server with byte ranges (nginx,
an S3 static website, a raw-file host, ``python -m lerobot_nodes.testing.static_http``).

A static server has no listing protocol, so the listing is derived from the metadata itself:
``meta/info.json``; the ``meta/episodes/chunk-CCC/file-FFF.parquet`` files in LeRobot's order
(file index first, rolling over into the next chunk after ``chunks_size`` files) until their rows
reach ``total_episodes``; ``meta/tasks.parquet`` and ``meta/stats.json`` when present; then every
data and video file the episodes point to, through the ``data_path`` / ``video_path`` templates.
Each file is probed once, with a one-byte range read (``Range`` support is checked on the way):
its size is the ``Content-Range`` total, its identity a strong ``ETag``, else ``Last-Modified``
plus the size, else none. Without an identity on every file the source has no stable identity:
video indexes are rebuilt at every open and nothing is cached (SPEC §4). Payloads are then read
by the native range reader like Hub payloads, and metadata is cached locally when its identity
is known. No token is ever sent: ``HF_TOKEN`` is for the Hub, not for arbitrary hosts.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from ..errors import ConfigError, MetadataError, SourceFileNotFoundError
from .base import ByteSource, FileInfo
from .file_cache import default_file_cache_root, slug
from .http_range import HttpOptions, RemoteFile
from .hub_auth import HubCredentials
from .listed import ListedHttpSource
from .listing import FileListing

log = logging.getLogger("lerobot_nodes.sources")

INFO_PATH = "meta/info.json"
OPTIONAL_META = ("meta/tasks.parquet", "meta/stats.json")
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
"""LeRobot v3's name of the episode metadata files (``DEFAULT_EPISODES_PATH``)."""
DEFAULT_CHUNKS_SIZE = 1000
_warned_unstable: set[str] = set()


def fingerprint_of(remote: RemoteFile) -> str | None:
    """A strong ``ETag``; else ``Last-Modified`` with the size; else ``None`` (a weak ETag names no content)."""
    if remote.etag and not remote.etag.startswith("W/"):
        return f"etag:{remote.etag.strip(chr(34))}"
    if remote.last_modified:
        return f"last-modified:{remote.last_modified}:{remote.size}"
    return None


class HttpRootSource(ListedHttpSource):
    """The LeRobot v3 dataset under a plain ``http(s)://`` URL; files listed from its metadata at open."""

    def __init__(self, url: str, *, http: HttpOptions | None = None, cache_root: Path | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"not an http(s) URL: {url}")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ConfigError(
                "plain http(s) dataset roots take no query, fragment or user:password (the URL is logged and "
                f"used in cache paths): {parts.scheme}://{parts.hostname}{parts.path}"
            )
        self._url = url.rstrip("/")
        cache = Path(cache_root) if cache_root is not None else default_file_cache_root()
        # Anonymous: user agent only, never the Hub token, whatever the environment holds.
        super().__init__([], HubCredentials(False), http, cache / "http" / slug(self._url.split("://", 1)[1]))
        self._opened: dict[str, bytes] = {}
        self._discover()
        self.has_stable_identity = all(f.fingerprint is not None for f in self._listing)
        if not self.has_stable_identity:
            self._cache = None  # one rule for the whole root: nothing of it is cached
        if not self.has_stable_identity and self._url not in _warned_unstable:
            _warned_unstable.add(self._url)
            log.warning(
                "%s sends neither a strong ETag nor Last-Modified for every file: its video indexes are rebuilt "
                "at every open and its metadata is not cached", self._url,
            )

    @property
    def url(self) -> str:
        return self._url

    def file_url(self, path: str) -> str:
        return f"{self._url}/{quote(path)}"

    def published_sidecar_source(self) -> ByteSource | None:
        """None: published sidecars are found by listing ``meta/mp4-sidecars/``, which a static server
        cannot do; indexes are built locally (and cached when identities are stable)."""
        return None

    # -- discovery ---------------------------------------------------------------------------------
    def _discover(self) -> None:
        try:
            self._add(self._probe([INFO_PATH]))
        except SourceFileNotFoundError as error:
            raise SourceFileNotFoundError(
                f"{error}: {self._url} is not a LeRobotDataset root (expected meta/info.json, meta/episodes/, "
                "data/ and videos/)"
            ) from None
        info = self._info_json()
        chunks_size = int(info.get("chunks_size") or DEFAULT_CHUNKS_SIZE)
        total_episodes = int(info["total_episodes"])
        self._add(self._probe(OPTIONAL_META, optional=True))
        video_keys = [k for k, f in info["features"].items() if isinstance(f, dict) and f.get("dtype") == "video"]
        payload: set[str] = set()
        rows, chunk_index, file_index = 0, 0, 0
        while rows < total_episodes:
            path = EPISODES_PATH.format(chunk_index=chunk_index, file_index=file_index)
            try:
                self._add(self._probe([path]))
            except SourceFileNotFoundError as error:
                raise SourceFileNotFoundError(
                    f"{error}; info.json says {total_episodes} episodes, the episode metadata files before it "
                    f"hold {rows}"
                ) from None
            rows += self._payload_of(path, info, video_keys, payload)
            file_index += 1
            if file_index == chunks_size:
                chunk_index, file_index = chunk_index + 1, 0
        try:
            self._add(self._probe(sorted(payload)))
        except SourceFileNotFoundError as error:
            raise SourceFileNotFoundError(f"{error} (the episode metadata points to it)") from None

    def _info_json(self) -> dict[str, Any]:
        try:
            info = json.loads(self._read_and_keep(INFO_PATH))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise MetadataError(f"{INFO_PATH} in {self._url} is not valid JSON: {error}") from None
        if not isinstance(info, dict):
            raise MetadataError(f"{INFO_PATH} in {self._url} must hold a JSON object")
        for key, kind in {"total_episodes": int, "data_path": str, "features": dict}.items():
            if not isinstance(info.get(key), kind):
                raise MetadataError(f"{INFO_PATH} in {self._url}: field {key!r} must be {kind.__name__}, "
                                    f"got {info.get(key)!r}")
        return info

    def _payload_of(self, path: str, info: dict[str, Any], video_keys: list[str], payload: set[str]) -> int:
        """Add the data and video files the rows of episode file ``path`` point to; return its row count.

        Columns it lacks are skipped here: loading the metadata names them in its own error.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(io.BytesIO(self._read_and_keep(path)))
            names = set(parquet.schema_arrow.names)
            locations: list[tuple[str, str, dict[str, str]]] = [("data", str(info["data_path"]), {})]
            if video_keys and isinstance(info.get("video_path"), str):
                locations += [(f"videos/{key}", str(info["video_path"]), {"video_key": key}) for key in video_keys]
            wanted = [p for p, _, _ in locations if f"{p}/chunk_index" in names and f"{p}/file_index" in names]
            columns = [f"{p}/{c}" for p in wanted for c in ("chunk_index", "file_index")]
            table = parquet.read(columns=columns) if columns else None
        except (pa.ArrowException, OSError, ValueError) as error:
            raise MetadataError(f"{path} in {self._url} is not a readable Parquet file: {error}") from None
        for prefix, template, extra in locations:
            if table is None or prefix not in wanted:
                continue
            chunks = table.column(f"{prefix}/chunk_index").to_pylist()
            files = table.column(f"{prefix}/file_index").to_pylist()
            for chunk_index, file_index in set(zip(chunks, files, strict=True)):
                if chunk_index is None or file_index is None:
                    continue
                try:
                    payload.add(template.format(chunk_index=int(chunk_index), file_index=int(file_index), **extra))
                except (KeyError, IndexError, ValueError) as error:
                    raise MetadataError(f"{INFO_PATH} in {self._url}: cannot fill the path template {template!r} "
                                        f"({type(error).__name__}: {error})") from None
        return int(parquet.metadata.num_rows)

    def _probe(self, paths: Iterable[str], optional: bool = False) -> list[FileInfo]:
        """Size and identity of each file (concurrently); absent optional files are left out."""
        paths = list(paths)

        def one(path: str) -> FileInfo | None:
            try:
                remote = self.reader.probe(self.file_url(path), name=self._name(path))
            except SourceFileNotFoundError:
                if optional:
                    return None
                raise
            return FileInfo(path, remote.size, fingerprint_of(remote))

        if len(paths) <= 1:
            found = [one(path) for path in paths]
        else:
            with ThreadPoolExecutor(min(len(paths), self.reader.options.connections),
                                    thread_name_prefix="lerobot-nodes-probe") as pool:
                found = list(pool.map(one, paths))
        return [f for f in found if f is not None]

    def byte_identity(self, path: str) -> str | None:
        """Only a strong ETag names bytes well enough for the byte cache (``Last-Modified`` has
        one-second resolution: a file replaced within the same second would be served stale)."""
        fingerprint = self.info(path).fingerprint
        return super().byte_identity(path) if fingerprint is not None and fingerprint.startswith("etag:") else None

    def _add(self, files: list[FileInfo]) -> None:
        self._listing = FileListing([*self._listing, *files], self.url)

    def _read_and_keep(self, path: str) -> bytes:
        """Read a metadata file during discovery and keep it for the metadata loader's read, once
        (counted in :attr:`stats` then, when the loader reads it)."""
        data = super()._read_file(path)
        self._opened[path] = data
        return data

    def _read_file(self, path: str) -> bytes:
        kept = self._opened.pop(path, None)
        return kept if kept is not None else super()._read_file(path)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_opened"] = {}
        return state
