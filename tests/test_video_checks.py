"""Metadata that the videos contradict fails at open (and in ``lerobot-nodes inspect``), not mid-epoch.

Each case damages a copy of the LeRobot-written AV1 dataset the way a hand-edited or
half-converted dataset is damaged: ``meta/info.json`` states the wrong codec, frame rate or
size for a camera, or ``meta/episodes`` places an episode past the end of its MP4.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lerobot_nodes import MetadataError, StreamingLeRobotDataset
from lerobot_nodes.cli.main import main as cli_main

TOP = "observation.images.top"
WRIST = "observation.images.wrist"
TOP_FILE = f"videos/{TOP}/chunk-000/file-000.mp4"
INFO = "meta/info.json"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"


@pytest.fixture(autouse=True)
def private_index_cache(tmp_path, monkeypatch):
    """Opening a dataset fills the sidecar cache: keep it out of the user's."""
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lerobot-home"))


def edit_camera_info(root: Path, key: str, block: str = "info", **fields: object) -> None:
    """Set ``video.<name>`` fields of camera ``key`` (None removes one); ``block`` renames its info block."""
    path = root / INFO
    info = json.loads(path.read_text())
    feature = info["features"][key]
    stated = feature.pop("info")
    for name, value in fields.items():
        if value is None:
            stated.pop(f"video.{name}")
        else:
            stated[f"video.{name}"] = value
    feature[block] = stated
    path.write_text(json.dumps(info, indent=4))


def move_span_end(root: Path, episode: int, key: str, to_timestamp: float) -> None:
    """Set ``to_timestamp`` of ``episode``'s span of camera ``key`` in ``meta/episodes``."""
    path = root / EPISODES
    table = pq.read_table(path)
    column = f"videos/{key}/to_timestamp"
    values = table.column(column).to_pylist()
    values[episode] = to_timestamp
    table = table.set_column(table.column_names.index(column), column, pc.cast(values, table.schema.field(column).type))
    pq.write_table(table, path)


def wrong_codec(root: Path) -> None:
    edit_camera_info(root, TOP, codec="h264")


def wrong_fps(root: Path) -> None:
    edit_camera_info(root, TOP, fps=15)


def wrong_size(root: Path) -> None:
    edit_camera_info(root, TOP, width=64, height=48)


def legacy_block_wrong_codec(root: Path) -> None:
    edit_camera_info(root, TOP, block="video_info", codec="hevc")


def span_past_the_end(root: Path) -> None:
    move_span_end(root, 7, TOP, 13.0)


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "codec": (wrong_codec, f"{TOP_FILE} (camera {TOP}): {INFO} says codec h264; the stream has codec av1 (sample entry av01)"),
    "fps": (wrong_fps, f"{TOP_FILE} (camera {TOP}): {INFO} says fps 15; the stream has fps 30"),
    "size": (
        wrong_size,
        f"{TOP_FILE} (camera {TOP}): {INFO} says size 64x48 (video.width x video.height); the stream has size 128x96",
    ),
    "legacy-video_info": (
        legacy_block_wrong_codec,
        f"{TOP_FILE} (camera {TOP}): {INFO} says codec hevc; the stream has codec av1 (sample entry av01)",
    ),
    "span": (
        span_past_the_end,
        f"episode 7 (camera {TOP}): meta/episodes places its frames at [11.633333, 13.000000) s of {TOP_FILE}, "
        "but the file's last frame ends at 12.666667 s (0.333333 s past it; tolerance_s is 0.0001)",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_contradicted_metadata_fails_at_open(dataset_copy, case):
    damage, problem = CASES[case]
    damage(dataset_copy)
    with pytest.raises(MetadataError) as raised:
        StreamingLeRobotDataset(root=dataset_copy)
    assert str(raised.value) == f"{dataset_copy}: {problem}"


@pytest.mark.parametrize("case", ["codec", "span"])
def test_inspect_lists_the_problem(dataset_copy, case):
    damage, problem = CASES[case]
    damage(dataset_copy)
    command = [sys.executable, "-m", "lerobot_nodes.cli.main", "inspect", f"--dataset.root={dataset_copy}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    at = lines.index("video metadata: 1 problem")
    assert lines[at + 1] == f"  {problem}"
    # a span past the end is an episode's problem, which streaming_bad_episodes=skip leaves out; a codec is not
    assert lines[at + 2 :] == ([] if case == "codec" else [
        "--dataset.streaming_bad_episodes=skip leaves out 1 episode of 8:", f"  video span past the end of its MP4: episode 7: {problem}"
    ])  # fmt: skip
    assert "Traceback" not in result.stderr


def test_every_problem_is_counted_at_open_and_listed_by_inspect(dataset_copy, capsys):
    wrong_codec(dataset_copy)
    edit_camera_info(dataset_copy, WRIST, fps=60)
    span_past_the_end(dataset_copy)
    with pytest.raises(MetadataError, match=r"\(and 2 more; `lerobot-nodes inspect` lists them all\)$"):
        StreamingLeRobotDataset(root=dataset_copy)
    assert cli_main(["inspect", f"--dataset.root={dataset_copy}"]) == 1
    lines = capsys.readouterr().out.splitlines()
    lines = lines[: lines.index("--dataset.streaming_bad_episodes=skip leaves out 1 episode of 8:")]  # the span's episode
    assert lines[-4:] == [
        "video metadata: 3 problems",
        f"  {CASES['codec'][1]}",
        f"  videos/{WRIST}/chunk-000/file-000.mp4 (camera {WRIST}): {INFO} says fps 60; the stream has fps 30",
        f"  {CASES['span'][1]}",
    ]


def test_only_selected_episodes_are_checked(dataset_copy):
    span_past_the_end(dataset_copy)
    dataset = StreamingLeRobotDataset(root=dataset_copy, episodes=[0, 3, 6])
    assert dataset.episodes == [0, 3, 6]


def test_unstated_fields_are_not_checked(dataset_copy):
    edit_camera_info(dataset_copy, TOP, codec=None, fps=None, width=None, height=None)
    edit_camera_info(dataset_copy, WRIST, block="video_info")
    StreamingLeRobotDataset(root=dataset_copy)


def test_a_frame_rate_within_tolerance_agrees(dataset_copy):
    edit_camera_info(dataset_copy, TOP, fps=29.97)  # frame periods 33.37 ms and 33.33 ms: within 0.1 ms
    StreamingLeRobotDataset(root=dataset_copy)
    edit_camera_info(dataset_copy, TOP, fps=29.5)
    with pytest.raises(MetadataError, match=r"says fps 29\.5; the stream has fps 30$"):
        StreamingLeRobotDataset(root=dataset_copy)


def test_lerobot_written_datasets_pass(lerobot_written, capsys):
    cameras, episodes = {"lerobot-writer-tiny-av1": (2, 8), "lerobot-writer-tiny-h264": (3, 6)}[lerobot_written.name]
    assert len(StreamingLeRobotDataset(root=lerobot_written.root).episodes) == episodes
    assert cli_main(["inspect", f"--dataset.root={lerobot_written.root}"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"video metadata: the camera info of {cameras} cameras and the video spans of {episodes} episodes agree "
        "with the MP4 streams"
    )
