"""Any fsspec URL (``s3://``, ``gs://``, ``memory://``, ...) as a byte source.

Reads use ``cat_ranges`` (exact ranges, several per call, no read-ahead). Identity comes
from what the backend reports: a generation or version id, an ETag, an MD5/CRC checksum.
A backend that reports none (``memory://``, plain HTTP without ETags) has no stable
identities: its video indexes are rebuilt at every open (SPEC §4). Credentials are the
backend's business (environment, config files); pass secrets that way rather than in
``storage_options``, which fsspec keeps on its filesystem objects.

A copy sent to another process (a DataLoader worker) opens the file system again there, from the URL
and options: an ``s3://`` one with that process's shared session (:mod:`.s3_session`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..errors import SourceAuthError, SourceError, SourceFileNotFoundError, SourceUnavailableError
from .base import ByteRange, ByteSource, FileInfo
from .listing import FileListing
from .s3_session import s3fs_options

IDENTITY_FIELDS = ("generation", "VersionId", "version_id", "ETag", "etag", "md5Hash", "crc32c", "xet_hash", "sha256")
"""``fs.info()`` fields that name a file's content, most specific first."""


def fingerprint_of(info: Mapping[str, Any]) -> str | None:
    """The content identity in an fsspec ``info`` dict, or ``None`` when the backend gives none."""
    for name in IDENTITY_FIELDS:
        value = info.get(name)
        if value not in (None, ""):
            return f"{name}:{str(value).strip(chr(34))}"
    return None


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


class FsspecSource(ByteSource):
    """The files under ``url`` of an fsspec filesystem, listed once at open."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._url = url.rstrip("/")
        self._storage_options = dict(storage_options or {})
        self.fs, self.root = self._open_filesystem()
        with self._errors(self._url):
            listing = self.fs.find(self.root, detail=True)
        if not listing:
            raise SourceFileNotFoundError(f"{self._url} holds no files (or does not exist)")
        self._listing = FileListing(
            (
                FileInfo(self._relative(full), int(info["size"]), fingerprint_of(info))
                for full, info in listing.items()
                if info.get("type", "file") == "file"
            ),
            self._url,
        )
        self.has_stable_identity = all(f.fingerprint is not None for f in self._listing)
        # A local file system reached through fsspec is a local folder: never copied into the byte cache.
        self.caches_bytes = not ({"file", "local"} & set(_protocols(self.fs)))

    def _open_filesystem(self) -> tuple[Any, str]:
        import fsspec

        try:
            fs, root = fsspec.core.url_to_fs(self._url, **s3fs_options(self._url, self._storage_options))
        except (ImportError, ValueError) as error:
            raise SourceError(f"cannot open {self._url} with fsspec: {error}") from None
        return fs, root.rstrip("/")

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        del state["fs"]  # opened again where the copy lands, with that process's session
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.fs, _ = self._open_filesystem()

    @property
    def url(self) -> str:
        return self._url

    def _relative(self, full: str) -> str:
        return full[len(self.root):].lstrip("/") if full.startswith(self.root) else full

    def list_files(self, prefix: str = "") -> list[FileInfo]:
        return self._listing.under(prefix)

    def info(self, path: str) -> FileInfo:
        return self._listing.info(path)

    def _full(self, path: str) -> str:
        return f"{self.root}/{path}"

    def _read_file(self, path: str) -> bytes:
        info = self.info(path)
        return self._read_ranges(path, [(0, info.size)])[0] if info.size else b""

    def _read_ranges(self, path: str, ranges: list[ByteRange]) -> list[bytes]:
        size = self.info(path).size
        for start, end in ranges:
            if end > size:
                raise SourceError(f"byte range [{start}, {end}) of {self._url}/{path} reaches past its end ({size} bytes)")
        full = self._full(path)
        with self._errors(f"{self._url}/{path}"):
            chunks = self.fs.cat_ranges([full] * len(ranges), [s for s, _ in ranges], [e for _, e in ranges])
        for chunk, (start, end) in zip(chunks, ranges, strict=True):
            if isinstance(chunk, BaseException):
                raise SourceUnavailableError(f"reading [{start}, {end}) of {self._url}/{path} failed: {chunk}")
            if len(chunk) != end - start:
                raise SourceError(f"{self._url}/{path}: asked for {end - start} bytes at {start}, got {len(chunk)}")
        return list(chunks)

    @staticmethod
    @contextmanager
    def _errors(what: str) -> Iterator[None]:
        """Map the OS errors of fsspec backends to this package's, naming the file."""
        try:
            yield
        except SourceError:
            raise
        except FileNotFoundError as error:
            raise SourceFileNotFoundError(f"{what} not found ({error})") from None
        except PermissionError as error:
            raise SourceAuthError(f"{what}: permission denied ({error})") from None
        except (OSError, TimeoutError) as error:
            raise SourceUnavailableError(f"{what}: {type(error).__name__}: {error}") from None
