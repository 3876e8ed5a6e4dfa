"""Sidecar schema v3: the published NPZ archive of a dataset's MP4 sample indexes.

The archive is a ZIP (NumPy ``.npz``) holding one JSON member, ``meta.json``, and for every
indexed video file the arrays of its :meth:`~lerobot_nodes.mp4.VideoIndex.to_arrays`, stored
as plain ``int64`` (integers and flags) so any NumPy reads it. :data:`SCHEMA_DOC` is the
normative description; ``docs/sidecar-schema.md`` embeds it verbatim.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import json
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from ..errors import SidecarFormatError
from ..sources import FileInfo

SCHEMA_VERSION = 3
ARCHIVE_FORMAT = "lerobot-mp4-sidecar"
META_MEMBER = "meta.json"
PUBLISHED_DIR = "meta/mp4-sidecars/"
"""Where a dataset root holds published sidecars (bucket layout; dataset repos use a branch)."""
DEFAULT_ARCHIVE_NAME = f"mp4-sidecar-v{SCHEMA_VERSION}.npz"

# Level 1 deflates index tables 10x faster than the default level 6, for archives ~7 % larger.
_DEFLATE_LEVEL = 1
# Members bigger than this need ZIP64 headers, which must be requested before writing.
_ZIP64_THRESHOLD = 1 << 30

SCHEMA_DOC = """\
## Sidecar schema v3 (NPZ archive)

A sidecar is a ZIP file readable by `numpy.load` (an `.npz`), deflate-compressed (level 1). It holds:

| member | content |
|---|---|
| `meta.json` | UTF-8 JSON object, described below |
| `files/NNNNNN/<name>.npy` | one array of the `NNNNNN`-th indexed video file (six digits, 0-based) |

### `meta.json`

| field | type | meaning |
|---|---|---|
| `format` | string | always `"lerobot-mp4-sidecar"` |
| `schema_version` | int | `3` |
| `dataset_id` | string or null | `OWNER/DATASET` the sidecar was built for |
| `revision` | string or null | the revision the maintainer asked for (branch, tag or commit) |
| `source_commit` | string or null | the commit the video bytes were read from (null for a local folder without one) |
| `complete` | bool | true when every video file of the dataset is indexed; a subset (`false`) cannot be published |
| `builder_version` | string | `lerobot_nodes <version>` that wrote the archive |
| `index_format_version` | int | version of the per-file array layout (`VideoIndex.to_arrays`) |
| `created_utc` | string | ISO 8601 time of the build (informative only) |
| `sample_count` | int | total samples over all files |
| `files` | list | one object per indexed video file, in path order (below) |

Each `files` entry:

| field | type | meaning |
|---|---|---|
| `path` | string | path of the MP4 relative to the dataset root (`videos/<key>/chunk-000/file-000.mp4`) |
| `size` | int | byte size of the MP4 |
| `fingerprint` | string or null | content identity from the store: Hub/Xet content hash or ETag, bucket object hash, or `size-mtime_ns-inode` for local files; null when the store has none |
| `revision` | string or null | commit the file was read at (equals `source_commit`) |
| `samples` | int | number of video samples (frames) in the file |
| `member` | string | member prefix of its arrays, `files/NNNNNN` |
| `arrays` | object | `name -> {"dtype": original NumPy dtype, "shape": [...]}` for every array of the file |

### Per-file arrays

Integer and boolean arrays are stored as **int64** whatever their original dtype (recorded in
`arrays[name].dtype`, e.g. `bool` for `keyframes`, `uint8` for byte strings); floating point
values (seconds) as float64; text as NumPy unicode. Per-sample arrays, one entry per video
sample in decode order:

| array | meaning |
|---|---|
| `offsets` | byte offset of the sample in the MP4 |
| `sizes` | byte size of the sample |
| `dts` | decode time, ticks of `timescale`, edit list applied as FFmpeg does |
| `pts` | presentation time, ticks of `timescale`, edit list applied (exact integers) |
| `durations` | `stts` sample duration, ticks |
| `keyframes` | 1 for a sync sample, else 0 (dense) |

Per-file scalars and blobs (0-d arrays, or int64 byte values for blobs): `index_format_version`,
`file_size`, `width`, `height`, `timescale`, `media_time` (edit list media time, -1 without
edit list), `empty_edit_duration` (leading empty edit in media ticks), `path`, `codec`
(`av1`, `h264`, `hevc`), `sample_entry` (`av01`, `avc1`, ...), `codec_config` (payload of the
av1C/avcC/hvcC box, FFmpeg's extradata) and `stsd` (the verbatim sample description box).

### Guarantees

- The archive never holds a credential, token, signed URL or the URL of the store.
- A reader must reject `format` other than `lerobot-mp4-sidecar` and `schema_version` other
  than the one it reads; older schemas are rebuilt, never reinterpreted.
- A file's arrays may be used only when its `size`, `fingerprint` (when the store has
  fingerprints) and `revision` equal the store's current values.
- Loading never needs pickle (`allow_pickle=False`).
"""


@dataclass(frozen=True)
class SourceIdentity:
    """What a source file was when it was indexed; an index is valid only for the same identity."""

    path: str
    size: int
    fingerprint: str | None
    revision: str | None

    @classmethod
    def of(cls, info: FileInfo, revision: str | None) -> SourceIdentity:
        return cls(path=info.path, size=int(info.size), fingerprint=info.fingerprint, revision=revision)

    def mismatch(self, current: SourceIdentity) -> str | None:
        """Why an index of ``self`` cannot stand for ``current``, or ``None`` when it can.

        The fingerprint is compared whenever the store reports one for ``current``: an index
        without a fingerprint is then stale even if the size matches (a replaced object may
        keep its size).
        """
        if self.path != current.path:
            return f"path {self.path!r} differs from {current.path!r}"
        if self.size != current.size:
            return f"size {self.size} differs from the file's {current.size} bytes"
        if current.fingerprint is not None and self.fingerprint != current.fingerprint:
            if self.fingerprint is None:
                return "the index has no content fingerprint and the store has one"
            return f"content fingerprint {self.fingerprint} differs from the file's {current.fingerprint}"
        if current.revision is not None and self.revision != current.revision:
            return f"revision {self.revision} differs from the pinned {current.revision}"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "fingerprint": self.fingerprint, "revision": self.revision}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> SourceIdentity:
        return cls(
            path=str(value["path"]),
            size=int(value["size"]),
            fingerprint=None if value.get("fingerprint") is None else str(value["fingerprint"]),
            revision=None if value.get("revision") is None else str(value["revision"]),
        )


@dataclass(frozen=True)
class ArchivedFile:
    """One video file's entry in ``meta.json``."""

    identity: SourceIdentity
    samples: int
    member: str
    arrays: dict[str, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {**self.identity.to_json(), "samples": self.samples, "member": self.member, "arrays": self.arrays}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ArchivedFile:
        return cls(
            identity=SourceIdentity.from_json(value),
            samples=int(value["samples"]),
            member=str(value["member"]),
            arrays={str(k): dict(v) for k, v in dict(value["arrays"]).items()},
        )


@dataclass(frozen=True)
class ArchiveMeta:
    """The archive-level fields of ``meta.json``."""

    schema_version: int
    dataset_id: str | None
    revision: str | None
    source_commit: str | None
    complete: bool
    builder_version: str
    index_format_version: int | None
    created_utc: str
    files: tuple[ArchivedFile, ...] = field(default=())

    @property
    def sample_count(self) -> int:
        return sum(f.samples for f in self.files)

    def file(self, path: str) -> ArchivedFile | None:
        for entry in self.files:
            if entry.identity.path == path:
                return entry
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": ARCHIVE_FORMAT,
            "schema_version": self.schema_version,
            "dataset_id": self.dataset_id,
            "revision": self.revision,
            "source_commit": self.source_commit,
            "complete": self.complete,
            "builder_version": self.builder_version,
            "index_format_version": self.index_format_version,
            "created_utc": self.created_utc,
            "sample_count": self.sample_count,
            "files": [f.to_json() for f in self.files],
        }


def builder_version() -> str:
    from .._version import __version__

    return f"lerobot_nodes {__version__}"


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


# -- array conversion ---------------------------------------------------------------------


def to_archive_array(name: str, value: np.ndarray) -> np.ndarray:
    """The stored form of one array: integers and flags as int64, floats as float64, text kept."""
    array = np.asarray(value)
    kind = array.dtype.kind
    if kind in "biu":
        if kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
            raise SidecarFormatError(f"array {name!r} holds values beyond int64")
        return array.astype(np.int64)
    if kind == "f":
        return array.astype(np.float64)
    if kind == "U":
        return array
    raise SidecarFormatError(f"array {name!r} has dtype {array.dtype}, which a sidecar cannot store")


def from_archive_array(name: str, stored: np.ndarray, original_dtype: str, where: str) -> np.ndarray:
    """Undo :func:`to_archive_array`, checking that the values fit the original dtype exactly."""
    try:
        dtype = np.dtype(original_dtype)
    except TypeError:
        raise SidecarFormatError(f"{where}: array {name!r} declares an unknown dtype {original_dtype!r}") from None
    if stored.dtype == dtype:
        return stored
    if dtype.kind in "biu" and stored.dtype.kind in "iu":
        restored = stored.astype(dtype)
        if not np.array_equal(restored.astype(np.int64), stored):
            raise SidecarFormatError(f"{where}: array {name!r} holds values outside its dtype {dtype}")
        return restored
    if dtype.kind == "f" and stored.dtype.kind == "f":
        return stored.astype(dtype)
    raise SidecarFormatError(f"{where}: array {name!r} is stored as {stored.dtype}, expected {dtype}")


# -- writing ------------------------------------------------------------------------------


class ArchiveWriter:
    """Streams per-file indexes into a sidecar archive; ``meta.json`` is written last.

    Only the JSON entries of the files stay in memory; each file's arrays are compressed into
    the archive as soon as :meth:`add` returns. The archive is complete only after
    :meth:`finish`: callers write into a temporary file and install it atomically.
    """

    def __init__(self, handle: IO[bytes]) -> None:
        self._zip = zipfile.ZipFile(
            handle, mode="w", compression=zipfile.ZIP_DEFLATED, compresslevel=_DEFLATE_LEVEL, allowZip64=True
        )
        self._files: list[ArchivedFile] = []

    def add(self, identity: SourceIdentity, arrays: Mapping[str, np.ndarray]) -> ArchivedFile:
        member = f"files/{len(self._files):06d}"
        described: dict[str, dict[str, Any]] = {}
        samples = None
        for name in sorted(arrays):
            original = np.asarray(arrays[name])
            stored = to_archive_array(name, original)
            described[name] = {"dtype": original.dtype.str, "shape": list(original.shape)}
            self._write_array(f"{member}/{name}.npy", stored)
            if name == "offsets":
                samples = len(original)
        if samples is None:
            raise SidecarFormatError(f"{identity.path}: index arrays have no 'offsets' column")
        entry = ArchivedFile(identity=identity, samples=samples, member=member, arrays=described)
        self._files.append(entry)
        return entry

    def _write_array(self, member: str, array: np.ndarray) -> None:
        with self._zip.open(member, mode="w", force_zip64=array.nbytes > _ZIP64_THRESHOLD) as out:
            np.lib.format.write_array(out, np.require(array, requirements="C"), allow_pickle=False)

    def finish(
        self,
        *,
        dataset_id: str | None,
        revision: str | None,
        source_commit: str | None,
        complete: bool,
        index_format_version: int | None,
    ) -> ArchiveMeta:
        meta = ArchiveMeta(
            schema_version=SCHEMA_VERSION,
            dataset_id=dataset_id,
            revision=revision,
            source_commit=source_commit,
            complete=complete,
            builder_version=builder_version(),
            index_format_version=index_format_version,
            created_utc=utc_now(),
            files=tuple(self._files),
        )
        self._zip.writestr(META_MEMBER, json.dumps(meta.to_json(), indent=1, sort_keys=True))
        self._zip.close()
        return meta

    def __enter__(self) -> ArchiveWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, traceback: object) -> None:
        """On an error, close the ZIP now (the caller discards the file) so nothing writes to it later."""
        if kind is not None and self._zip.fp is not None:
            with contextlib.suppress(Exception):
                self._zip.close()


# -- reading ------------------------------------------------------------------------------


def parse_meta(raw: bytes, where: str) -> ArchiveMeta:
    """Parse ``meta.json`` of any schema version far enough to tell the version.

    Raises :class:`SidecarFormatError` for JSON that is not a sidecar's. For a schema other
    than :data:`SCHEMA_VERSION` only ``schema_version`` is meaningful.
    """
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SidecarFormatError(f"{where}: {META_MEMBER} is not valid JSON ({exc})") from None
    if not isinstance(value, dict) or value.get("format") != ARCHIVE_FORMAT:
        raise SidecarFormatError(f"{where}: not a LeRobot MP4 sidecar ({META_MEMBER} has no format {ARCHIVE_FORMAT!r})")
    try:
        version = int(value["schema_version"])
        if version != SCHEMA_VERSION:
            return ArchiveMeta(version, value.get("dataset_id"), value.get("revision"), value.get("source_commit"),
                               bool(value.get("complete")), str(value.get("builder_version")), None, "")
        return ArchiveMeta(
            schema_version=version,
            dataset_id=value["dataset_id"],
            revision=value["revision"],
            source_commit=value["source_commit"],
            complete=bool(value["complete"]),
            builder_version=str(value["builder_version"]),
            index_format_version=value.get("index_format_version"),
            created_utc=str(value.get("created_utc", "")),
            files=tuple(ArchivedFile.from_json(f) for f in value["files"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise SidecarFormatError(f"{where}: {META_MEMBER} is missing or has a malformed field ({exc!r})") from None


class SidecarArchive:
    """A sidecar archive opened for reading; arrays are read (and decompressed) per file on demand.

    ``handle`` may be any seekable binary file, including one that reads a remote store by
    range, so opening an archive reads its ZIP directory and ``meta.json`` only.
    """

    def __init__(self, handle: IO[bytes], where: str) -> None:
        self.where = where
        self._owned: IO[bytes] | None = None
        try:
            self._zip = zipfile.ZipFile(handle, mode="r")
            raw = self._zip.read(META_MEMBER)
        except KeyError:
            raise SidecarFormatError(
                f"{where}: no {META_MEMBER} member (an archive of an older sidecar schema, or not a sidecar)"
            ) from None
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise SidecarFormatError(f"{where}: not a readable sidecar archive ({exc})") from None
        self.meta = parse_meta(raw, where)

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "<memory>") -> SidecarArchive:
        return cls(io.BytesIO(data), where)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> SidecarArchive:
        """Open a local archive file; :meth:`close` closes the file too."""
        handle = open(path, "rb")  # noqa: SIM115 - owned by the archive, closed in close()
        try:
            archive = cls(handle, str(path))
        except BaseException:
            handle.close()
            raise
        archive._owned = handle
        return archive

    def close(self) -> None:
        self._zip.close()
        if self._owned is not None:
            self._owned.close()

    def __enter__(self) -> SidecarArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def paths(self) -> list[str]:
        return [f.identity.path for f in self.meta.files]

    def load_arrays(self, path: str) -> dict[str, np.ndarray]:
        """The arrays of ``path`` in their original dtypes, exactly as the builder received them."""
        if self.meta.schema_version != SCHEMA_VERSION:
            raise SidecarFormatError(f"{self.where}: schema v{self.meta.schema_version} cannot be read as v{SCHEMA_VERSION}")
        entry = self.meta.file(path)
        if entry is None:
            raise SidecarFormatError(f"{self.where}: has no index of {path}")
        where = f"{self.where} ({path})"
        arrays: dict[str, np.ndarray] = {}
        for name, described in entry.arrays.items():
            member = f"{entry.member}/{name}.npy"
            try:
                with self._zip.open(member) as handle:
                    stored = np.lib.format.read_array(handle, allow_pickle=False)
            except KeyError:
                raise SidecarFormatError(f"{where}: member {member} is missing") from None
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
                raise SidecarFormatError(f"{where}: member {member} is unreadable ({exc})") from None
            if list(stored.shape) != list(described.get("shape", [])):
                raise SidecarFormatError(f"{where}: {name} has shape {list(stored.shape)}, meta.json says {described.get('shape')}")
            arrays[name] = from_archive_array(name, stored, str(described.get("dtype")), where)
        if len(arrays.get("offsets", ())) != entry.samples:
            raise SidecarFormatError(f"{where}: {entry.samples} samples declared, offsets holds {len(arrays.get('offsets', ()))}")
        return arrays
