"""The sample index equals FFmpeg's demuxer, packet for packet, and round-trips through NPZ."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from lerobot_nodes.errors import SourceFileNotFoundError, VideoIndexError
from lerobot_nodes.mp4 import (
    VideoIndex,
    decode_clip,
    materialize_clip,
    plan_clip,
    read_index,
    read_index_from_source,
)
from lerobot_nodes.sources import LocalSource
from lerobot_nodes.testing.video import synthetic_frames

from .mp4_edit import Node, move_payload_beyond, read_table, rewrite_moov, stbl, stco_to_co64, table_box
from .mp4_media import decoded_frames, demuxed_packets, encode_with_pts

VARIANTS = [
    "av1", "av1_faststart", "av1_g32", "h264", "h264_faststart", "h264_g2", "h264_open_gop",
    "h264_negative_cts", "h264_starts_at_7", "av1_starts_at_2", "h264_dropped_frames", "hevc",
]  # fmt: skip


def index_rows(index: VideoIndex) -> np.ndarray:
    return np.stack(
        [index.pts, index.dts, index.offsets, index.sizes, index.keyframes.astype(np.int64)], axis=1
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_index_equals_ffmpeg_packets(videos, variant):
    index = read_index(videos[variant])
    expected = demuxed_packets(videos[variant])
    assert index_rows(index).shape == expected.shape
    np.testing.assert_array_equal(index_rows(index), expected)


def test_timing_variants_exercise_the_edit_rules(videos):
    """The fixtures really contain what the rules are about (otherwise the test above proves little)."""
    assert read_index(videos["h264"]).media_time == 1024  # encoder delay: two frames
    assert read_index(videos["h264"]).is_reordered
    assert read_index(videos["h264_starts_at_7"]).empty_edit_duration == 3579  # 233 ms in 1/15360
    assert read_index(videos["av1_starts_at_2"]).pts[0] == 1014  # off the 512-tick grid
    negative = read_index(videos["h264_negative_cts"])
    assert np.any(negative.pts - negative.dts != (negative.pts - negative.dts)[0])
    assert not read_index(videos["av1"]).is_reordered


@pytest.mark.parametrize("name", ["av1", "h264", "h264_moov_at_end"])
def test_many_episodes_per_file_equal_ffmpeg(multi_episode, name):
    path = multi_episode[name].path
    index = read_index(path)
    np.testing.assert_array_equal(index_rows(index), demuxed_packets(path))
    assert len(index) == sum(multi_episode[name].lengths)


SAMPLE_ENTRIES = {"av1": "av01", "h264": "avc1"}


def test_lerobot_written_files_equal_ffmpeg(lerobot_written):
    info = json.loads((lerobot_written.root / "meta/info.json").read_text())
    paths = sorted(lerobot_written.root.glob("videos/*/chunk-*/file-*.mp4"))
    assert len(paths) == {"lerobot-writer-tiny-av1": 2, "lerobot-writer-tiny-h264": 8}[lerobot_written.name]
    for path in paths:
        index = read_index(path)
        np.testing.assert_array_equal(index_rows(index), demuxed_packets(path))
        written = info["features"][path.parts[-3]]["info"]  # what the writer declared for this camera
        assert index.codec == written["video.codec"] and index.sample_entry == SAMPLE_ENTRIES[index.codec]
        assert (index.width, index.height) == (written["video.width"], written["video.height"]) == (128, 96)


def test_index_through_a_source_names_relative_path(lerobot_av1):
    source = LocalSource(lerobot_av1)
    path = "videos/observation.images.top/chunk-000/file-000.mp4"
    index = read_index_from_source(source, path)
    assert index.path == path
    assert (
        read_index(path, source=source).file_size
        == index.file_size
        == (lerobot_av1 / path).stat().st_size
    )


def test_codec_configuration_is_ffmpeg_extradata(videos):
    import av

    for variant in ("av1", "h264"):
        with av.open(str(videos[variant])) as container:
            extradata = container.streams.video[0].codec_context.extradata
        index = read_index(videos[variant])
        assert index.codec_config == extradata
        assert index.stsd[4:8] == b"stsd"


def test_arrays_round_trip_through_npz(videos, tmp_path):
    index = read_index(videos["h264_starts_at_7"])
    np.savez(tmp_path / "index.npz", **index.to_arrays())
    with np.load(tmp_path / "index.npz", allow_pickle=False) as loaded:
        rebuilt = VideoIndex.from_arrays(loaded)
    for name, value in index.to_arrays().items():
        np.testing.assert_array_equal(rebuilt.to_arrays()[name], value, err_msg=name)
    assert (rebuilt.codec, rebuilt.stsd, rebuilt.codec_config) == (
        index.codec,
        index.stsd,
        index.codec_config,
    )
    assert plan_clip(rebuilt, 0.5, 1.5).size == plan_clip(index, 0.5, 1.5).size


def test_from_arrays_rejects_inconsistent_arrays(videos):
    arrays = read_index(videos["av1"]).to_arrays()
    broken = dict(arrays, sizes=arrays["sizes"][:-1])
    with pytest.raises(VideoIndexError, match="lengths"):
        VideoIndex.from_arrays(broken)
    with pytest.raises(VideoIndexError, match="lack the field"):
        VideoIndex.from_arrays({k: v for k, v in arrays.items() if k != "pts"})
    with pytest.raises(VideoIndexError, match="presented before"):
        VideoIndex.from_arrays(dict(arrays, pts=arrays["pts"] - 1))


def test_co64_chunk_offsets(videos, tmp_path):
    rewritten = rewrite_moov(videos["h264"], tmp_path / "co64.mp4", stco_to_co64)
    index = read_index(rewritten)
    np.testing.assert_array_equal(index_rows(index), demuxed_packets(rewritten))
    np.testing.assert_array_equal(index.offsets, read_index(videos["h264"]).offsets)


def test_samples_beyond_4_gib(videos, tmp_path):
    """64-bit mdat size and co64 offsets above 2**32, in a sparse file that costs no disk."""
    gap = 5 * 2**30
    big = move_payload_beyond(videos["av1"], tmp_path / "big.mp4", gap)
    assert big.stat().st_blocks * 512 <= 64 * 2**20, "this test needs a file system with sparse files"
    index = read_index(big)
    original = read_index(videos["av1"])
    assert index.offsets.min() > 2**32
    np.testing.assert_array_equal(index.offsets - index.offsets[0], original.offsets - original.offsets[0])
    np.testing.assert_array_equal(index.pts, original.pts)
    np.testing.assert_array_equal(index_rows(index), demuxed_packets(big))
    plan = plan_clip(index, 0.3, 1.0)
    source = LocalSource(big.parent)
    clip = materialize_clip(plan, source.read_ranges(big.name, plan.byte_ranges))
    reference = decoded_frames(videos["av1"])
    timestamps = [pts / index.timescale for pts in sorted(reference) if 0.3 <= pts / index.timescale < 0.99]
    frames = decode_clip(clip, timestamps)
    for pts_s, frame in zip(timestamps, frames.numpy(), strict=True):
        np.testing.assert_array_equal(frame.transpose(1, 2, 0), reference[round(pts_s * index.timescale)])


# -- rejections --------------------------------------------------------------------------


def _edit(source: Path, tmp_path: Path, change) -> Path:
    return rewrite_moov(source, tmp_path / "edited.mp4", change)


def _set_elst(entries: list[tuple[int, int, int]]):
    def change(moov: Node) -> None:
        edts = moov.find("trak/edts")
        edts.children = [table_box(b"elst", entries, "IiI")]

    return change


def _check_rejected(path: Path, reason: str) -> None:
    with pytest.raises(VideoIndexError, match=reason) as raised:
        read_index(path)
    assert path.name in str(raised.value)


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        ([(1000, 0, 0x10000), (1000, 0, 0x10000)], "2 non-empty edits"),
        ([(2500, 0, 0x20000)], "media rate 2"),
        ([(2500, 0, 0x10000), (100, -1, 0x10000)], "empty edit after"),
        ([(2500, 512, 0x10000)], "starts after the first frame"),
        ([(1000, 0, 0x10000)], "ends before the last frame"),
        ([(0, 0, 0x10000)], "zero duration"),
        ([(100, -1, 0x10000)], "0 non-empty edits"),
    ],
)
def test_unsupported_edit_lists_are_rejected(videos, tmp_path, entries, reason):
    _check_rejected(_edit(videos["av1"], tmp_path, _set_elst(entries)), reason)


def test_accepted_edit_list_rewrites_still_match_ffmpeg(videos, tmp_path):
    """A leading empty edit added by hand shifts every timestamp exactly as FFmpeg does."""
    path = _edit(videos["av1"], tmp_path, _set_elst([(50, -1, 0x10000), (2500, 0, 0x10000)]))
    index = read_index(path)
    assert index.empty_edit_duration == 768
    np.testing.assert_array_equal(index_rows(index), demuxed_packets(path))


def test_no_video_track(videos, tmp_path):
    def to_sound(moov: Node) -> None:
        hdlr = moov.find("trak/mdia/hdlr")
        hdlr.payload = hdlr.payload[:8] + b"soun" + hdlr.payload[12:]

    _check_rejected(_edit(videos["av1"], tmp_path, to_sound), "no video track")


def test_fragmented_mp4(tmp_path):
    path = encode_with_pts(
        tmp_path / "fragmented.mp4", synthetic_frames(20, 64, 64), "libx264", {"g": "10"},
        movflags="frag_keyframe+empty_moov",
    )  # fmt: skip
    _check_rejected(path, "fragmented")


def _replace(path: str, build):
    def change(moov: Node) -> None:
        parent_path, _, name = path.rpartition("/")
        parent = moov.find(parent_path)
        old = parent.find(name)
        parent.children[parent.children.index(old)] = build(old)

    return change


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_replace("trak/mdia/minf/stbl/stsz", lambda old: Node(b"stsz", old.payload[:8] + struct.pack(">I", 10**6) + old.payload[12:])), "stsz declares"),
        (_replace("trak/mdia/minf/stbl/stts", lambda old: table_box(b"stts", [(10, 512)], "II")), "stts describes 10 samples"),
        (_replace("trak/mdia/minf/stbl/stsc", lambda old: table_box(b"stsc", [(1, 1, 1)], "III")), "describe"),
        (_replace("trak/mdia/minf/stbl/stss", lambda old: table_box(b"stss", [], "I")), "stss.* empty"),
        (_replace("trak/mdia/minf/stbl/stss", lambda old: table_box(b"stss", [(1,), (9999,)], "I")), "stss entries"),
        (_replace("trak/mdia/minf/stbl/stco", lambda old: table_box(b"stco", [(2**32 - 100,)] + read_table(old, "I")[1:], "I")), "beyond the end"),
        (_replace("trak/mdia/minf/stbl/ctts", lambda old: table_box(b"ctts", [(75, 2**29)], "II")), "composition offset"),
        (_replace("trak/mdia/minf/stbl/stsd", lambda old: Node(b"stsd", old.payload[:4] + struct.pack(">I", 2) + old.payload[8:])), "2 sample descriptions"),
        (_replace("trak/mdia/minf/stbl/stsd", lambda old: Node(b"stsd", old.payload.replace(b"avc1", b"mp4v", 1))), "unsupported video sample entry"),
        (_replace("trak/mdia/minf/stbl/stsd", lambda old: Node(b"stsd", old.payload.replace(b"avcC", b"xxxx", 1))), "has no avcC box"),
        (_replace("trak/mdia/mdhd", lambda old: Node(b"mdhd", old.payload[:12] + bytes(4) + old.payload[16:])), "timescale is 0"),
    ],
)  # fmt: skip
def test_inconsistent_tables_are_rejected(videos, tmp_path, change, reason):
    _check_rejected(_edit(videos["h264"], tmp_path, change), reason)


def test_missing_required_box(videos, tmp_path):
    def drop_stts(moov: Node) -> None:
        table = stbl(moov)
        table.children = [child for child in table.children if child.type != b"stts"]

    _check_rejected(_edit(videos["av1"], tmp_path, drop_stts), "no 'stts'")


def test_truncated_file(videos, tmp_path):
    data = videos["av1_faststart"].read_bytes()
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(data[: len(data) - 1000])
    _check_rejected(truncated, "truncated")
    truncated.write_bytes(data[:5])
    _check_rejected(truncated, "too small")
    moov_at_end = videos["av1"].read_bytes()
    truncated.write_bytes(moov_at_end[:-10])
    _check_rejected(truncated, "truncated")


def test_not_an_mp4(tmp_path):
    path = tmp_path / "text.mp4"
    path.write_bytes(b"hello, this is not a video file at all" * 10)
    with pytest.raises(VideoIndexError):
        read_index(path)


def test_missing_file_is_the_source_error(tmp_path):
    with pytest.raises(SourceFileNotFoundError):
        read_index(tmp_path / "missing.mp4")
