"""The synthetic LeRobot v3.0 writer produces consistent tables and LeRobot-shaped MP4s."""

from __future__ import annotations

import json
import struct
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_nodes.testing import (
    concatenate_videos,
    encode_video,
    ensure_demo_dataset,
    synthetic_frames,
    video_duration_s,
    write_dataset,
)

CAMERAS = ("observation.images.top", "observation.images.wrist")
# Short episodes between long ones so that small limits give both single- and multi-episode files.
ROLLOVER_LENGTHS = [60, 10, 10, 60, 10, 10, 60, 10, 12]


# ----------------------------------------------------------------------------- helpers


def top_level_boxes(path: Path) -> list[str]:
    """Types of the top-level MP4 boxes in file order."""
    data = path.read_bytes()
    boxes, offset = [], 0
    while offset < len(data):
        size, kind = struct.unpack(">I4s", data[offset : offset + 8])
        if size == 1:
            size = struct.unpack(">Q", data[offset + 8 : offset + 16])[0]
        boxes.append(kind.decode())
        offset += size
    return boxes


def read_info(root: Path) -> dict:
    return json.loads((root / "meta" / "info.json").read_text())


def read_episodes(root: Path) -> pa.Table:
    files = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files])


def data_files(root: Path) -> list[Path]:
    return sorted((root / "data").glob("*/*.parquet"))


def video_files(root: Path, camera: str) -> list[Path]:
    return sorted((root / "videos" / camera).glob("*/*.mp4"))


def packets_by_decode_order(path: Path) -> list[av.Packet]:
    with av.open(str(path)) as container:
        return [p for p in container.demux(video=0) if p.size > 0]


def frame_times(path: Path) -> list[Fraction]:
    """Presentation times (seconds, exact) of every decoded frame, in presentation order."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.time_base is not None
        times = []
        for frame in container.decode(stream):
            assert frame.pts is not None
            times.append(frame.pts * stream.time_base)
        return sorted(times)


def packet_pts(packets: list[av.Packet]) -> list[int]:
    """Packet pts in the given order (every stored MP4 sample has one)."""
    pts = [p.pts for p in packets]
    assert all(isinstance(t, int) for t in pts)
    return [int(t) for t in pts if t is not None]


def dataset_bytes(root: Path, pattern: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.glob(pattern))}


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def rollover_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(
        tmp_path_factory.mktemp("rollover") / "ds",
        episode_lengths=ROLLOVER_LENGTHS,
        data_file_size_in_mb=0.008,
        video_files_size_in_mb=0.015,
        chunks_size=2,
        extra_features=True,
        seed=3,
    )


@pytest.fixture(scope="module")
def default_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("default") / "ds")


@pytest.fixture(scope="module")
def h264_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(
        tmp_path_factory.mktemp("h264") / "ds", num_episodes=4, cameras=CAMERAS[:1], codec="h264", seed=5
    )


# ----------------------------------------------------------------------------- tables


@pytest.mark.parametrize("root_fixture", ["default_root", "rollover_root"])
def test_tables_are_consistent(root_fixture: str, request: pytest.FixtureRequest) -> None:
    root: Path = request.getfixturevalue(root_fixture)
    info = read_info(root)
    episodes = read_episodes(root).to_pylist()
    lengths = [e["length"] for e in episodes]

    assert info["codebase_version"] == "v3.0"
    assert [e["episode_index"] for e in episodes] == list(range(info["total_episodes"]))
    assert info["total_frames"] == sum(lengths)
    assert info["splits"] == {"train": f"0:{len(episodes)}"}
    assert [e["dataset_from_index"] for e in episodes] == list(np.cumsum([0, *lengths[:-1]]))
    assert all(e["dataset_to_index"] - e["dataset_from_index"] == e["length"] for e in episodes)

    tasks = pq.read_table(root / "meta" / "tasks.parquet").to_pylist()
    assert [t["task_index"] for t in tasks] == list(range(info["total_tasks"]))
    task_of = {t["task"]: t["task_index"] for t in tasks}

    for episode in episodes:
        path = root / info["data_path"].format(
            chunk_index=episode["data/chunk_index"], file_index=episode["data/file_index"]
        )
        rows = pq.read_table(path).to_pydict()
        selected = [i for i, e in enumerate(rows["episode_index"]) if e == episode["episode_index"]]
        assert len(selected) == episode["length"]
        assert [rows["index"][i] for i in selected] == list(
            range(episode["dataset_from_index"], episode["dataset_to_index"])
        )
        assert {rows["task_index"][i] for i in selected} == {task_of[t] for t in episode["tasks"]}

    all_rows = pa.concat_tables([pq.read_table(f) for f in data_files(root)])
    assert all_rows["index"].to_pylist() == list(range(info["total_frames"]))
    frame_index = np.asarray(all_rows["frame_index"])
    timestamps = np.asarray(all_rows["timestamp"])
    assert timestamps.dtype == np.float32
    np.testing.assert_array_equal(timestamps, (frame_index / info["fps"]).astype(np.float32))


def test_one_row_group_per_episode_and_episode_rows_located(rollover_root: Path) -> None:
    episodes = read_episodes(rollover_root).to_pylist()
    for path in data_files(rollover_root):
        chunk, file = int(path.parent.name[-3:]), int(path.stem[-3:])
        in_file = [e for e in episodes if (e["data/chunk_index"], e["data/file_index"]) == (chunk, file)]
        metadata = pq.ParquetFile(path).metadata
        row_groups = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        assert row_groups == [e["length"] for e in in_file]

    for path in sorted((rollover_root / "meta" / "episodes").glob("*/*.parquet")):
        table = pq.read_table(path).to_pydict()
        assert set(table["meta/episodes/chunk_index"]) == {int(path.parent.name[-3:])}
        assert set(table["meta/episodes/file_index"]) == {int(path.stem[-3:])}


def test_episodes_columns_and_types_match_lerobot(default_root: Path) -> None:
    schema = pq.read_schema(sorted((default_root / "meta" / "episodes").glob("*/*.parquet"))[0])
    expected_leading = [
        "episode_index",
        "tasks",
        "length",
        "data/chunk_index",
        "data/file_index",
        "dataset_from_index",
        "dataset_to_index",
    ]
    assert schema.names[: len(expected_leading)] == expected_leading
    assert schema.names[-2:] == ["meta/episodes/chunk_index", "meta/episodes/file_index"]
    for camera in CAMERAS:
        assert schema.field(f"videos/{camera}/from_timestamp").type == pa.float64()
        assert schema.field(f"stats/{camera}/mean").type == pa.list_(pa.list_(pa.list_(pa.float64())))
    assert schema.field("stats/action/count").type == pa.list_(pa.int64())
    assert schema.field("stats/index/min").type == pa.list_(pa.float64())

    data_schema = pq.read_schema(data_files(default_root)[0])
    assert data_schema.field("action").type == pa.list_(pa.float32(), 6)
    assert data_schema.field("timestamp").type == pa.float32()
    assert data_schema.field("index").type == pa.int64()
    assert b"huggingface" in (data_schema.metadata or {})


def test_extra_features_have_their_dtypes(rollover_root: Path) -> None:
    features = read_info(rollover_root)["features"]
    schema = pq.read_schema(data_files(rollover_root)[0])
    assert features["observation.environment_state"]["dtype"] == "float64"
    assert schema.field("observation.environment_state").type == pa.list_(pa.float64(), 3)
    assert features["next.done"]["dtype"] == "bool"
    assert schema.field("next.done").type == pa.bool_()
    assert features["next.reward"]["dtype"] == "int64"
    assert schema.field("next.reward").type == pa.int64()


def test_stats_json_aggregates_episode_stats(rollover_root: Path) -> None:
    stats = json.loads((rollover_root / "meta" / "stats.json").read_text())
    episodes = read_episodes(rollover_root)
    rows = pa.concat_tables([pq.read_table(f) for f in data_files(rollover_root)])
    total = rows.num_rows

    index = np.asarray(rows["index"], dtype=np.float64)
    assert stats["index"]["count"] == [total]
    assert stats["index"]["min"] == [0.0] and stats["index"]["max"] == [total - 1]
    np.testing.assert_allclose(stats["index"]["mean"], [index.mean()], rtol=1e-12)
    np.testing.assert_allclose(stats["index"]["std"], [index.std()], rtol=1e-12)

    action = np.stack(rows["action"].to_numpy(zero_copy_only=False)).astype(np.float64)
    np.testing.assert_allclose(stats["action"]["mean"], action.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(stats["action"]["std"], action.std(axis=0), rtol=1e-9)
    np.testing.assert_array_equal(stats["action"]["min"], action.min(axis=0))

    for camera in CAMERAS:
        assert np.asarray(stats[camera]["mean"]).shape == (3, 1, 1)
        episode_counts = [c[0] for c in episodes[f"stats/{camera}/count"].to_pylist()]
        assert stats[camera]["count"] == [sum(episode_counts)]
        assert 0.0 <= np.min(stats[camera]["min"]) <= np.max(stats[camera]["max"]) <= 1.0


def test_without_cameras_there_is_no_video(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "ds", num_episodes=2, cameras=())
    info = read_info(root)
    assert info["video_path"] is None
    assert not (root / "videos").exists()
    assert not any(name.startswith("videos/") for name in read_episodes(root).column_names)


def test_invalid_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_episodes"):
        write_dataset(tmp_path / "a", num_episodes=3, episode_lengths=[5, 5])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("occupied")
    with pytest.raises(FileExistsError):
        write_dataset(tmp_path / "b", num_episodes=1)


# ----------------------------------------------------------------------------- rollover


def test_rollover_produces_several_files_and_chunks(rollover_root: Path) -> None:
    episodes = read_episodes(rollover_root).to_pylist()
    assert len(data_files(rollover_root)) >= 3
    assert len(list((rollover_root / "data").iterdir())) >= 2
    assert len(list((rollover_root / "meta" / "episodes").glob("*/*.parquet"))) >= 2
    for camera in CAMERAS:
        files = video_files(rollover_root, camera)
        assert len(files) >= 3
        assert len({f.parent for f in files}) >= 2
        per_file = [
            sum(1 for e in episodes if e[f"videos/{camera}/file_index"] == int(f.stem[-3:]))
            for f in files
            if f.parent.name == "chunk-000"
        ]
        assert max(per_file) >= 2, "expected at least one concatenated multi-episode file"
    data_files_of = [(e["data/chunk_index"], e["data/file_index"]) for e in episodes]
    video_files_of = [
        (e[f"videos/{CAMERAS[0]}/chunk_index"], e[f"videos/{CAMERAS[0]}/file_index"]) for e in episodes
    ]
    assert data_files_of != video_files_of, "data and video files should roll over independently"
    for key in ["data", "meta/episodes", *(f"videos/{c}" for c in CAMERAS)]:
        assert max(e[f"{key}/file_index"] for e in episodes) <= 1  # chunks_size=2


# ----------------------------------------------------------------------------- videos


@pytest.mark.parametrize("root_fixture", ["rollover_root", "h264_root"])
def test_mp4_frames_match_episode_timestamps(root_fixture: str, request: pytest.FixtureRequest) -> None:
    root: Path = request.getfixturevalue(root_fixture)
    info = read_info(root)
    episodes = read_episodes(root).to_pylist()
    cameras = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    for camera in cameras:
        for path in video_files(root, camera):
            chunk, file = int(path.parent.name[-3:]), int(path.stem[-3:])
            in_file = [
                e
                for e in episodes
                if (e[f"videos/{camera}/chunk_index"], e[f"videos/{camera}/file_index"]) == (chunk, file)
            ]
            times = frame_times(path)
            assert len(times) == sum(e["length"] for e in in_file)
            first = 0
            for episode in in_file:
                episode_times = times[first : first + episode["length"]]
                assert abs(float(episode_times[0]) - episode[f"videos/{camera}/from_timestamp"]) < 1e-9
                steps = {b - a for a, b in zip(episode_times, episode_times[1:], strict=False)}
                assert steps <= {Fraction(1, info["fps"])}, f"{path}: non-contiguous pts {steps}"
                first += episode["length"]
            to_timestamps = [e[f"videos/{camera}/to_timestamp"] for e in in_file]
            from_timestamps = [e[f"videos/{camera}/from_timestamp"] for e in in_file]
            assert from_timestamps[0] == 0.0 and from_timestamps[1:] == to_timestamps[:-1]
            assert abs(to_timestamps[-1] - video_duration_s(path)) < 1e-9


def test_av1_keyframe_every_second_frame(rollover_root: Path) -> None:
    episodes = read_episodes(rollover_root).to_pylist()
    camera = CAMERAS[0]
    path = video_files(rollover_root, camera)[0]
    packets = packets_by_decode_order(path)
    assert all(p.pts == p.dts for p in packets)
    lengths = [
        e["length"]
        for e in episodes
        if (e[f"videos/{camera}/chunk_index"], e[f"videos/{camera}/file_index"]) == (0, 0)
    ]
    expected = [i % 2 == 0 for length in lengths for i in range(length)]
    assert [p.is_keyframe for p in packets] == expected


def test_h264_stream_has_b_frames(tmp_path: Path) -> None:
    path = encode_video(tmp_path / "h264.mp4", synthetic_frames(45, 48, 64, seed=2), codec="h264")
    packets = packets_by_decode_order(path)
    assert any(p.pts != p.dts for p in packets)
    pts = packet_pts(packets)
    assert pts != sorted(pts), "B-frames reorder presentation against decode order"
    assert b"ctts" in path.read_bytes()
    assert sum(p.is_keyframe for p in packets) == 2  # g=30 over 45 frames


def test_h264_open_gop_and_explicit_bframes_encode(tmp_path: Path) -> None:
    frames = synthetic_frames(40, 48, 64, seed=4)
    open_gop = encode_video(tmp_path / "open.mp4", frames, codec="h264", g=10, open_gop=True)
    no_b = encode_video(tmp_path / "nob.mp4", frames, codec="h264", bframes=0)
    assert len(frame_times(open_gop)) == 40
    no_b_pts = packet_pts(packets_by_decode_order(no_b))
    assert no_b_pts == sorted(no_b_pts), "without B-frames decode order is presentation order"
    with pytest.raises(ValueError, match="open_gop"):
        encode_video(tmp_path / "av1.mp4", frames, codec="av1", open_gop=True)


def test_moov_position_single_vs_concatenated(rollover_root: Path, tmp_path: Path) -> None:
    episodes = read_episodes(rollover_root).to_pylist()
    camera = CAMERAS[1]
    for path in video_files(rollover_root, camera):
        chunk, file = int(path.parent.name[-3:]), int(path.stem[-3:])
        count = sum(
            (e[f"videos/{camera}/chunk_index"], e[f"videos/{camera}/file_index"]) == (chunk, file)
            for e in episodes
        )
        boxes = top_level_boxes(path)
        moov_first = boxes.index("moov") < boxes.index("mdat")
        assert moov_first == (count > 1), f"{path}: {count} episodes, boxes {boxes}"

    root = write_dataset(
        tmp_path / "ds", episode_lengths=[8, 9, 10], cameras=CAMERAS[:1], video_faststart=False
    )
    (single,) = video_files(root, CAMERAS[0])
    assert top_level_boxes(single)[-1] == "moov"


def test_encode_and_concatenate_layouts(tmp_path: Path) -> None:
    frames = synthetic_frames(20, 32, 48, seed=1)
    plain = encode_video(tmp_path / "plain.mp4", frames[:12])
    fast = encode_video(tmp_path / "fast.mp4", frames[12:], faststart=True)
    assert top_level_boxes(plain) == ["ftyp", "free", "mdat", "moov"]
    assert top_level_boxes(fast)[:2] == ["ftyp", "moov"]

    joined = concatenate_videos([plain, fast], tmp_path / "joined.mp4")
    boxes = top_level_boxes(joined)
    assert boxes.index("moov") < boxes.index("mdat")
    assert frame_times(joined) == [Fraction(i, 30) for i in range(20)]
    assert video_duration_s(plain) == pytest.approx(12 / 30, abs=1e-12)
    assert video_duration_s(joined) == pytest.approx(20 / 30, abs=1e-12)

    in_place = concatenate_videos([plain, plain], plain, faststart=False)
    assert top_level_boxes(in_place)[-1] == "moov"
    assert len(frame_times(in_place)) == 24
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fast.mp4", "joined.mp4", "plain.mp4"]


# ----------------------------------------------------------------------------- frames & determinism


def test_synthetic_frames_are_smooth_and_deterministic() -> None:
    frames = synthetic_frames(30, 48, 64, seed=7)
    assert frames.shape == (30, 48, 64, 3) and frames.dtype == np.uint8
    np.testing.assert_array_equal(frames, synthetic_frames(30, 48, 64, seed=7))
    np.testing.assert_array_equal(frames[10:], synthetic_frames(20, 48, 64, seed=7, start_frame=10))
    assert not np.array_equal(frames, synthetic_frames(30, 48, 64, seed=8))
    as_int = frames.astype(np.int16)
    assert frames.std() > 20, "content should have contrast"
    assert np.abs(np.diff(as_int, axis=2)).mean() < 6, "neighbouring pixels should be similar"
    assert 0 < np.abs(np.diff(as_int, axis=0)).mean() < 12, "content should move smoothly"


def test_same_seed_gives_same_dataset(default_root: Path, tmp_path: Path) -> None:
    again = write_dataset(tmp_path / "again")
    for pattern in ["**/*.parquet", "meta/*.json"]:
        assert dataset_bytes(again, pattern) == dataset_bytes(default_root, pattern)
    for camera in CAMERAS:
        (first,), (second,) = video_files(default_root, camera), video_files(again, camera)
        with av.open(str(first)) as a, av.open(str(second)) as b:
            for frame_a, frame_b in zip(a.decode(video=0), b.decode(video=0), strict=True):
                np.testing.assert_array_equal(
                    frame_a.to_ndarray(format="rgb24"), frame_b.to_ndarray(format="rgb24")
                )

    other = write_dataset(tmp_path / "other", seed=1)
    assert dataset_bytes(other, "data/*/*.parquet") != dataset_bytes(default_root, "data/*/*.parquet")


# ----------------------------------------------------------------------------- demo


def test_demo_dataset_is_written_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    root = ensure_demo_dataset()
    assert root == tmp_path / "home" / "lerobot-nodes-demo" / "v1"
    info = read_info(root)
    assert info["total_episodes"] == 12
    assert info["features"][CAMERAS[0]]["shape"] == [96, 128, 3]
    for camera in CAMERAS:
        assert len(video_files(root, camera)) == 2
    assert [p.name for p in root.parent.iterdir()] == ["v1"], "no partial copies left behind"

    info_mtime = (root / "meta" / "info.json").stat().st_mtime_ns
    assert ensure_demo_dataset() == root
    assert (root / "meta" / "info.json").stat().st_mtime_ns == info_mtime


def test_demo_location_falls_back_to_hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_LEROBOT_HOME", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    existing = tmp_path / "hf" / "lerobot" / "lerobot-nodes-demo" / "v1"
    (existing / "meta").mkdir(parents=True)
    (existing / "meta" / "info.json").write_text("{}")
    assert ensure_demo_dataset() == existing
