"""Locating moov by range reads: counted round trips, and clean errors on malformed box headers."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from lerobot_nodes.errors import VideoIndexError
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.mp4 import read_index_from_source
from lerobot_nodes.mp4.boxes import HEAD_WINDOW, iter_boxes, locate_moov
from lerobot_nodes.sources import LocalSource
from lerobot_nodes.testing.video import concatenate_videos, encode_video, synthetic_frames


@pytest.fixture(scope="module")
def long_files(tmp_path_factory) -> dict[str, Path]:
    """15 000 samples: the moov (about 90 KB) is larger than the head and tail windows."""
    root = tmp_path_factory.mktemp("long")
    episode = encode_video(root / "episode.mp4", synthetic_frames(60, 64, 64), codec="av1")
    return {
        "faststart": concatenate_videos([episode] * 250, root / "long-faststart.mp4", faststart=True),
        "moov_at_end": concatenate_videos([episode] * 250, root / "long-moov-at-end.mp4", faststart=False),
    }


def _moov_size(path: Path) -> int:
    data = path.read_bytes()
    return next(box.size for box in iter_boxes(data, 0, len(data), str(path)) if box.type == "moov")


def _index_counting(path: Path) -> LocalSource:
    source = LocalSource(path.parent)
    read_index_from_source(source, path.name)
    return source


@pytest.mark.parametrize("variant", ["av1", "av1_faststart", "h264", "h264_faststart"])
def test_small_moov_is_read_in_one_round_trip_at_the_front_two_at_the_end(videos, variant):
    path = videos[variant]
    source = _index_counting(path)
    assert source.stats.requests == (1 if variant.endswith("faststart") else 2)
    assert source.stats.whole_file_reads == 0
    # The head read and the moov, nothing more: at the end the moov is read exactly.
    assert source.stats.bytes_read <= HEAD_WINDOW + _moov_size(path)


@pytest.mark.parametrize("layout", ["faststart", "moov_at_end"])
def test_large_moov_needs_two_round_trips(long_files, layout):
    path = long_files[layout]
    moov = _moov_size(path)
    assert moov > HEAD_WINDOW
    source = _index_counting(path)
    assert source.stats.requests == 2
    # One head window plus the moov: nothing is read twice.
    assert source.stats.bytes_read <= HEAD_WINDOW + moov + 64


def test_lerobot_written_file_needs_at_most_two_round_trips(lerobot_written):
    source = LocalSource(lerobot_written.root)
    paths = load_meta(source).video_files()
    assert paths
    for path in paths:
        before, read_before = source.stats.requests, source.stats.bytes_read
        read_index_from_source(source, path)
        assert source.stats.requests - before <= 2
        assert source.stats.bytes_read - read_before <= HEAD_WINDOW + _moov_size(Path(lerobot_written.root) / path)


@pytest.mark.parametrize("head,tail", [(16, 16), (64, 32), (4096, 0), (1, 100_000)])
def test_any_window_sizes_find_the_same_moov(long_files, head, tail):
    path = long_files["moov_at_end"]
    data = path.read_bytes()
    calls: list[list[tuple[int, int]]] = []

    def read(ranges):
        calls.append(list(ranges))
        return [data[a:b] for a, b in ranges]

    location = locate_moov(read, len(data), str(path), head_window=head, tail_window=tail)
    assert location.moov == data[location.offset : location.offset + _moov_size(path)]
    assert location.round_trips == len(calls) <= 3


def _file(*boxes: bytes) -> bytes:
    return b"".join(boxes)


def _box(box_type: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">I4s", 8 + len(payload), box_type) + payload


def _locate(data: bytes):
    return locate_moov(lambda ranges: [data[a:b] for a, b in ranges], len(data), "test.mp4")


def test_box_headers_64_bit_and_to_end_of_file():
    moov = _box(b"moov", _box(b"mvhd", bytes(100)))
    large_mdat = struct.pack(">I4sQ", 1, b"mdat", 16 + 5) + bytes(5)
    to_end = struct.pack(">I4s", 0, b"free") + bytes(7)
    location = _locate(_file(_box(b"ftyp", b"isom"), large_mdat, moov, to_end))
    assert location.moov == moov
    assert location.top_level == ("ftyp", "mdat", "moov")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_file(_box(b"ftyp", b"isom"), _box(b"mdat", bytes(10))), "no moov box"),
        (_file(_box(b"ftyp", b"isom"), struct.pack(">I4s", 4, b"mdat") + bytes(20)), "invalid size 4"),
        (_file(_box(b"ftyp", b"isom"), struct.pack(">I4s", 500, b"mdat") + bytes(20)), "truncated"),
        (
            _file(_box(b"ftyp", b"isom"), struct.pack(">I4s", 1, b"mdat") + bytes(4)),
            "truncated 64-bit box header",
        ),
        (_file(_box(b"ftyp", b"isom"), _box(b"moof", bytes(8)), _box(b"moov")), "fragmented"),
        (_file(_box(b"ftyp", b"isom"), b"\x00\x00"), "truncated box header"),
        (b"\x00\x00\x00", "too small"),
    ],
)
def test_malformed_top_level_boxes(data, reason):
    with pytest.raises(VideoIndexError, match=reason):
        _locate(data)


def test_moov_box_tree_errors_name_the_file(tmp_path):
    path = tmp_path / "broken.mp4"
    path.write_bytes(_file(_box(b"ftyp", b"isom"), _box(b"moov", struct.pack(">I4s", 99, b"trak"))))
    with pytest.raises(VideoIndexError, match="broken.mp4.*trak") as raised:
        read_index_from_source(LocalSource(tmp_path), "broken.mp4")
    assert "broken.mp4" in str(raised.value)
