"""The local byte source: listing, identity, whole-file and range reads, and clear errors."""

from __future__ import annotations

import os

import pytest

from lerobot_nodes.errors import SourceError, SourceFileNotFoundError
from lerobot_nodes.sources import LocalSource, open_source
from lerobot_nodes.sources.source_file import open_buffered


def test_listing_and_ranges(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "info.json").write_bytes(b"0123456789")
    (tmp_path / "data.bin").write_bytes(bytes(range(256)))
    source = open_source(tmp_path)
    assert [f.path for f in source.list_files()] == ["data.bin", "meta/info.json"]
    assert [f.path for f in source.list_files("meta/")] == ["meta/info.json"]
    assert source.info("data.bin").size == 256
    assert source.read_ranges("data.bin", [(0, 2), (250, 256), (10, 10)]) == [b"\x00\x01", bytes(range(250, 256)), b""]
    assert source.read_file("meta/info.json") == b"0123456789"
    assert source.stats.requests == 2 and source.stats.bytes_read == 18


def test_fingerprint_changes_when_content_is_replaced_with_same_size(tmp_path):
    path = tmp_path / "video.mp4"
    path.write_bytes(b"a" * 100)
    source = LocalSource(tmp_path)
    before = source.info("video.mp4").fingerprint
    replacement = tmp_path / "new.mp4"
    replacement.write_bytes(b"b" * 100)
    os.replace(replacement, path)
    assert source.info("video.mp4").size == 100
    assert source.info("video.mp4").fingerprint != before


def test_errors_name_the_file(tmp_path):
    (tmp_path / "small.bin").write_bytes(b"abc")
    source = LocalSource(tmp_path)
    with pytest.raises(SourceFileNotFoundError, match="missing.bin"):
        source.read_file("missing.bin")
    with pytest.raises(SourceError, match=r"small.bin.*past its end"):
        source.read_ranges("small.bin", [(0, 10)])
    with pytest.raises(SourceError, match="escapes"):
        source.info("../outside")
    with pytest.raises(SourceFileNotFoundError):
        LocalSource(tmp_path / "nope")


def test_buffered_file_object_reads_through_ranges(tmp_path):
    (tmp_path / "blob").write_bytes(bytes(range(256)) * 100)
    source = LocalSource(tmp_path)
    with open_buffered(source, "blob", buffer_size=1024) as handle:
        handle.seek(300)
        assert handle.read(4) == bytes([44, 45, 46, 47])
        handle.seek(-2, os.SEEK_END)
        assert handle.read() == bytes([254, 255])
