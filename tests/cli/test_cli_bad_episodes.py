"""``--dataset.streaming_bad_episodes=raise|skip`` through the real ``lerobot-nodes`` in a subprocess.

The damage is that of ``tests/test_bad_episodes.py`` (``lerobot_nodes.testing.damage``): an MP4
deleted (episode 2), a span past its MP4's end (episode 5), a data Parquet cut in half (episode 6).
"""

from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path

import pytest

from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.damage import cut_parquet, damage_frame, delete_mp4, episode_files, lengthen_span

from .cli_process import assert_one_line_error, run_cli

LENGTHS = [40, 50, 45, 60, 35, 55, 42, 48]
CAMERA = "observation.images.top"
MISSING_MP4, LONG_SPAN, CUT_PARQUET = 2, 5, 6
DAMAGED_MID_EPOCH = 1  # 16 bytes over its frame 20's picture data: the open's checks pass, decoding fails
BAD = {MISSING_MP4, LONG_SPAN, CUT_PARQUET}
GOOD = [e for e in range(len(LENGTHS)) if e not in BAD]
FULL_EPOCH_STEPS = sum(LENGTHS[e] for e in GOOD) // 4 + 1  # batches of 4 over the good episodes' frames, rounded up


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(
        tmp_path_factory.mktemp("bad-episodes-cli") / "dataset", episode_lengths=LENGTHS, seed=3, cameras=(CAMERA,),
        data_file_size_in_mb=0.003, video_files_size_in_mb=0.01,
    )  # fmt: skip


def damage_all(root: Path) -> Path:
    delete_mp4(root, MISSING_MP4, CAMERA)
    lengthen_span(root, LONG_SPAN, CAMERA, 0.5)
    cut_parquet(root, CUT_PARQUET)
    return root


def stream(root: Path, *flags: str):  # type: ignore[no-untyped-def]
    return run_cli("stream", f"--dataset.root={root}", "--batch_size=4", "--window=none", *flags)


def recorded(path: Path) -> collections.Counter[tuple[int, int]]:
    return collections.Counter(
        (int(e), int(f)) for line in path.read_text().splitlines() for e, f in json.loads(line)["samples"]
    )


def test_raise_is_one_line_naming_the_missing_mp4_and_its_episode(pristine: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(pristine, tmp_path / "dataset"))
    delete_mp4(root, MISSING_MP4, CAMERA)
    mp4 = episode_files(pristine, MISSING_MP4, CAMERA)[1]
    result = stream(root, "--steps=2", "--num_workers=0", "--quiet")
    assert_one_line_error(result, 1, f"{mp4} is missing from {root}; episode {MISSING_MP4} of the selection needs it")
    # a selection that does not use the file streams
    assert stream(root, "--steps=2", "--num_workers=0", "--quiet", "--dataset.episodes=[0,3]").returncode == 0


def test_raise_on_a_cut_parquet_is_one_line_naming_the_file_and_episode(pristine: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(pristine, tmp_path / "dataset"))
    cut_parquet(root, CUT_PARQUET)
    result = stream(root, f"--steps={FULL_EPOCH_STEPS * 2}", "--num_workers=0", "--quiet")
    data = episode_files(pristine, CUT_PARQUET, CAMERA)[0]
    assert_one_line_error(result, 1, f"episode {CUT_PARQUET}: planning its Parquet rows in {data} failed: {data} is not a")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_streams_the_other_episodes_and_reports_the_skipped(
    pristine: Path, tmp_path: Path, num_workers: int
) -> None:
    root = damage_all(Path(shutil.copytree(pristine, tmp_path / "dataset")))
    record = tmp_path / "record.jsonl"
    result = stream(
        root, f"--steps={FULL_EPOCH_STEPS}", f"--num_workers={num_workers}", "--dataset.streaming_bad_episodes=skip",
        f"--record={record}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    warned = [line for line in result.stderr.splitlines() if "--dataset.streaming_bad_episodes=skip: rank 0 leaves out" in line]
    assert len(warned) == 3, result.stderr  # one line per kind
    assert "(3 episodes of this rank skipped as bad)" in result.stdout
    report = [line for line in result.stdout.splitlines() if line.startswith("skipped as bad")]
    assert len(report) == 3 and any(f"episode {MISSING_MP4}: " in line for line in report), result.stdout
    assert recorded(record) == collections.Counter((e, f) for e in GOOD for f in range(LENGTHS[e]))


def test_inspect_lists_the_episodes_stream_skips(pristine: Path, tmp_path: Path) -> None:
    root = damage_all(Path(shutil.copytree(pristine, tmp_path / "dataset")))
    inspected = run_cli("inspect", f"--dataset.root={root}")
    assert inspected.returncode == 1
    lines = inspected.stdout.splitlines()
    head = lines.index(f"--dataset.streaming_bad_episodes=skip leaves out {len(BAD)} episodes of {len(LENGTHS)}:")
    streamed = stream(root, "--steps=1", "--num_workers=0", "--dataset.streaming_bad_episodes=skip")
    warned = [line.split(" leaves out ", 1)[1] for line in streamed.stderr.splitlines() if " leaves out " in line]
    assert [line.strip() for line in lines[head + 1 :]] == warned


def test_a_resume_that_finds_another_skipped_set_is_one_line(pristine: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(pristine, tmp_path / "dataset"))
    delete_mp4(root, MISSING_MP4, CAMERA)
    checkpoint = tmp_path / "checkpoint.pt"
    skip = "--dataset.streaming_bad_episodes=skip"
    first = stream(root, "--steps=3", "--num_workers=0", skip, f"--save-checkpoint={checkpoint}", "--quiet")
    assert first.returncode == 0, first.stderr
    cut_parquet(root, CUT_PARQUET)
    result = stream(root, "--steps=6", "--num_workers=0", skip, f"--resume={checkpoint}", "--quiet")
    assert_one_line_error(result, 2, "cannot resume: the checkpoint was taken on another dataset, episode selection")
    assert "episodes skipped as bad" in result.stderr


@pytest.mark.parametrize("command", ["stream", "train"])
def test_an_unknown_policy_is_a_usage_error(command: str) -> None:
    """``train`` checks it before LeRobot starts (here without LeRobot: the check comes first)."""
    result = run_cli(command, "--dataset.streaming_bad_episodes=ignore", "--steps=1")
    assert_one_line_error(result, 2, "--dataset.streaming_bad_episodes must be one of raise, skip, got 'ignore'")


def test_a_step_resume_past_an_episode_found_bad_mid_epoch_is_one_line(pristine: Path, tmp_path: Path) -> None:
    """The checkpoint records that its run dropped an episode found bad while decoding: a resume in
    its own topology restores the loader state exactly; another batch size (a step offset) is refused."""
    root = Path(shutil.copytree(pristine, tmp_path / "dataset"))
    damage_frame(root, DAMAGED_MID_EPOCH, CAMERA, 20)
    checkpoint = tmp_path / "checkpoint.pt"
    skip = "--dataset.streaming_bad_episodes=skip"
    first = stream(root, f"--steps={FULL_EPOCH_STEPS}", "--num_workers=0", skip, f"--save-checkpoint={checkpoint}")
    assert first.returncode == 0, first.stderr
    assert f"episode {DAMAGED_MID_EPOCH} is bad from frame" in first.stderr
    same = stream(root, f"--steps={FULL_EPOCH_STEPS + 2}", "--num_workers=0", skip, f"--resume={checkpoint}", "--quiet")
    assert same.returncode == 0, same.stderr
    result = run_cli(
        "stream", f"--dataset.root={root}", "--batch_size=8", "--window=none", f"--steps={FULL_EPOCH_STEPS + 2}",
        "--num_workers=0", skip, f"--resume={checkpoint}", "--quiet",
    )  # fmt: skip
    assert_one_line_error(result, 2, "cannot resume by step offset: the checkpointed run skipped 1 episode found bad")
