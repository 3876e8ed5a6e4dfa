"""Schema v3 archives: content, round trip, no credentials, documentation kept in sync."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from lerobot_nodes.errors import SidecarFormatError
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.mp4.index import read_index_from_source
from lerobot_nodes.sidecar import SCHEMA_DOC, SCHEMA_VERSION, SidecarArchive, build_archive
from lerobot_nodes.sidecar.schema import SourceIdentity
from lerobot_nodes.sources import FileInfo, LocalSource

DOCS = Path(__file__).resolve().parents[2] / "docs" / "sidecar-schema.md"


class _SourceWithSecretUrl(LocalSource):
    """A store whose address carries a credential, as a signed or token-bearing URL would."""

    @property
    def url(self) -> str:
        return f"https://user:hunter2-secret@example.com/{self.root.name}?token=hf_SECRET_TOKEN&X-Amz-Signature=SIGNED"

    @property
    def revision(self) -> str | None:
        return "0123456789abcdef0123456789abcdef01234567"


def test_archive_holds_plain_int64_tables_and_full_metadata(lerobot_written, tmp_path: Path) -> None:
    source = LocalSource(lerobot_written.root)
    output = tmp_path / "sidecar.npz"
    summary = build_archive(source, output, dataset_id="lerobot/tiny", revision="v1", show_progress=False)
    meta = load_meta(source)
    assert summary.complete and summary.files == len(meta.video_files())

    with np.load(output, allow_pickle=False) as npz:  # any NumPy reads it, no pickle
        assert npz["files/000000/offsets"].dtype == np.int64
        assert npz["files/000000/keyframes"].dtype == np.int64
    with SidecarArchive.from_path(output) as archive:
        assert archive.meta.schema_version == SCHEMA_VERSION == 3
        assert archive.meta.dataset_id == "lerobot/tiny"
        assert archive.meta.revision == "v1" and archive.meta.source_commit == "v1"
        assert archive.meta.complete is True
        assert archive.meta.builder_version.startswith("lerobot_nodes ")
        assert archive.paths == meta.video_files()
        for path in archive.paths:
            expected = read_index_from_source(source, path).to_arrays()
            loaded = archive.load_arrays(path)
            assert loaded.keys() == expected.keys()
            for name, value in expected.items():
                assert loaded[name].dtype == value.dtype, name
                assert np.array_equal(loaded[name], value), name
            entry = archive.meta.file(path)
            assert entry is not None
            assert entry.identity == SourceIdentity.of(source.info(path), "v1")
            assert entry.samples == len(expected["offsets"])


def test_archive_never_contains_credentials_or_the_store_url(av1_dataset: Path, tmp_path: Path) -> None:
    output = tmp_path / "sidecar.npz"
    build_archive(_SourceWithSecretUrl(av1_dataset), output, dataset_id="o/d", show_progress=False)
    with zipfile.ZipFile(output) as archive:
        content = b"".join(archive.read(name) for name in archive.namelist())
    for secret in (b"hunter2", b"SECRET", b"SIGNED", b"example.com", b"token"):
        assert secret not in content
    meta = json.loads(zipfile.ZipFile(output).read("meta.json"))
    assert meta["source_commit"] == "0123456789abcdef0123456789abcdef01234567"


def test_identity_mismatch_reasons() -> None:
    built = SourceIdentity("v.mp4", 100, "fp-1", "c1")
    assert built.mismatch(SourceIdentity("v.mp4", 100, "fp-1", "c1")) is None
    assert "size" in (built.mismatch(SourceIdentity("v.mp4", 101, "fp-1", "c1")) or "")
    assert "fingerprint" in (built.mismatch(SourceIdentity("v.mp4", 100, "fp-2", "c1")) or "")
    assert "revision" in (built.mismatch(SourceIdentity("v.mp4", 100, "fp-1", "c2")) or "")
    # An index without a fingerprint is stale once the store has fingerprints (old bucket sidecars).
    assert "no content fingerprint" in (SourceIdentity("v.mp4", 100, None, "c1").mismatch(built) or "")
    # A store without fingerprints can only compare sizes (and revisions).
    assert built.mismatch(SourceIdentity.of(FileInfo("v.mp4", 100, None), None)) is None


def test_unreadable_and_foreign_archives_are_clean_errors(tmp_path: Path) -> None:
    with pytest.raises(SidecarFormatError, match="not a readable sidecar"):
        SidecarArchive.from_bytes(b"not a zip at all", "junk.npz")
    plain = tmp_path / "plain.npz"
    np.savez(plain, offsets=np.arange(3))
    with pytest.raises(SidecarFormatError, match="older sidecar schema, or not a sidecar"):
        SidecarArchive.from_path(plain)
    foreign = tmp_path / "foreign.npz"
    with zipfile.ZipFile(foreign, "w") as archive:
        archive.writestr("meta.json", json.dumps({"format": "something-else"}))
    with pytest.raises(SidecarFormatError, match="not a LeRobot MP4 sidecar"):
        SidecarArchive.from_path(foreign)


def test_truncated_archive_is_a_clean_error(av1_dataset: Path, tmp_path: Path) -> None:
    output = tmp_path / "sidecar.npz"
    build_archive(LocalSource(av1_dataset), output, show_progress=False)
    data = output.read_bytes()
    for cut in (len(data) // 3, len(data) - 30):
        with pytest.raises(SidecarFormatError):
            archive = SidecarArchive.from_bytes(data[:cut], "cut.npz")
            for path in archive.paths:
                archive.load_arrays(path)


def test_schema_documentation_is_in_sync() -> None:
    assert DOCS.is_file(), "docs/sidecar-schema.md is missing"
    assert SCHEMA_DOC in DOCS.read_text(), "docs/sidecar-schema.md must embed sidecar.schema.SCHEMA_DOC verbatim"
