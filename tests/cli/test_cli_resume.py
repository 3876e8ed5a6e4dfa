"""``lerobot-nodes stream --resume``: LeRobot's training_step.json, checked checkpoints, clear errors (real processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .cli_process import assert_one_line_error, run_cli

STEPS = 8


def _stream(dataset: Path, record: Path, *flags: str):
    common = ("--batch_size=4", "--num_workers=0", "--seed=7", "--dataset.streaming_episode_pool_size=2", "--quiet")
    return run_cli("stream", f"--dataset.root={dataset}", *common, f"--record={record}", *flags)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_resume_from_lerobot_training_step_json_file_and_folder(tiny_dataset, tmp_path):
    reference = tmp_path / "reference.jsonl"
    assert _stream(tiny_dataset, reference, f"--steps={STEPS}").returncode == 0
    # What LeRobot 0.6.1 saves in checkpoints/<step>/training_state/: the step, and the batch and world sizes.
    folder = tmp_path / "checkpoints" / "000003"
    (folder / "training_state").mkdir(parents=True)
    step_file = folder / "training_state" / "training_step.json"
    step_file.write_text(json.dumps({"step": 3, "dp_world_size": 1, "batch_size": 4, "grad_accum_steps": 1}))
    for resume in (step_file, folder):
        tail = tmp_path / f"tail-{resume.name}.jsonl"
        result = _stream(tiny_dataset, tail, f"--steps={STEPS}", f"--resume={resume}")
        assert result.returncode == 0, result.stderr
        assert _records(tail) == _records(reference)[3:], resume


def test_a_reached_step_says_so_instead_of_an_empty_report(tiny_dataset, tmp_path):
    step_file = tmp_path / "training_step.json"
    step_file.write_text(json.dumps({"step": 30}))  # older LeRobot versions save only the step
    result = run_cli("stream", f"--dataset.root={tiny_dataset}", "--steps=20", f"--resume={step_file}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "checkpoint is at step 30, --steps=20 is already reached: nothing to stream"
    assert "nan" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "--resume={path}: no such checkpoint file"),
        (b"\x00\x01 not a checkpoint", "--resume={path} is neither a checkpoint saved by --save-checkpoint nor "),
        (b'{"step": ', "--resume={path} is not valid JSON: "),
        (b'{"steps": 3}', "--resume={path} has no step"),
    ],
    ids=["missing", "garbage", "truncated-json", "json-without-step"],
)
def test_an_unusable_checkpoint_file_is_one_line_naming_it(tiny_dataset, tmp_path, content, message):
    path = tmp_path / "checkpoint.pt"
    if content is not None:
        path.write_bytes(content)
    result = run_cli("stream", f"--dataset.root={tiny_dataset}", "--steps=2", f"--resume={path}")
    assert_one_line_error(result, 2, message.format(path=path))


def test_a_checkpoint_of_another_episode_selection_is_refused(tiny_dataset, tmp_path):
    checkpoint = tmp_path / "checkpoint.pt"
    saved = _stream(tiny_dataset, tmp_path / "a.jsonl", "--steps=2", f"--save-checkpoint={checkpoint}")
    assert saved.returncode == 0, saved.stderr
    result = _stream(tiny_dataset, tmp_path / "b.jsonl", "--steps=4", "--dataset.episodes=[0,1,3]", f"--resume={checkpoint}")
    error = assert_one_line_error(result, 2, "cannot resume: the checkpoint was taken on another dataset")
    assert "episode selection '4 episodes #" in error and "-> '3 episodes #" in error
