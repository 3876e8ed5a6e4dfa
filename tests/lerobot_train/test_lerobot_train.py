"""``lerobot-nodes train``: LeRobot 0.6.1's own trainer (ACT on CPU) streaming through lerobot_nodes.

Each test runs the real trainer in a subprocess of the LeRobot venv (see ``conftest``), on a copy
of the LeRobot-written AV1 fixture (8 episodes, 380 frames), offline.
"""

from __future__ import annotations

import subprocess

from cli.cli_process import assert_one_line_error
from .conftest import SRC, TINY_ACT, Trainer, lerobot_python, needs_lerobot

LOADER_STATE = "lerobot_nodes_loader_rank0.pt"


@needs_lerobot
def test_the_hooked_names_are_checked_against_lerobot():
    """``check_lerobot`` passes on LeRobot 0.6.1 and fails loudly when a hooked signature changes."""
    python = lerobot_python()
    assert python is not None
    script = (
        "from lerobot_nodes.lerobot_train import check_lerobot\n"
        "print(check_lerobot())\n"
        "import lerobot.scripts.lerobot_train as trainer\n"
        "trainer.should_save_checkpoint = lambda step, save_freq: True\n"
        "try:\n"
        "    check_lerobot()\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    result = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(SRC), "PATH": ""}
    )
    assert result.returncode == 0, result.stderr
    version, error = result.stdout.splitlines()[-2:]
    assert version == "0.6.1"
    assert error.startswith("LeRobotIncompatibleError lerobot.scripts.lerobot_train.should_save_checkpoint takes"), error


@needs_lerobot
def test_resume_continues_sample_for_sample(trainer: Trainer):
    """6 steps in one run see the same (episode, frame) sequence as 3 steps, a checkpoint and --resume=true
    to 6: from the loader state saved beside LeRobot's checkpoint, and by step offset without it."""
    common = (
        *trainer.dataset_flags(), *TINY_ACT, "--dataset.streaming=true", "--num_workers=2", "--save_freq=3",
        "--dataset.streaming_episode_pool_size=2",
    )
    whole = trainer.run(*common, "--steps=6", f"--output_dir={trainer.tmp / 'whole'}", record="whole.jsonl")
    whole.check()
    expected = whole.batches()
    assert [step for step, _ in expected] == list(range(1, 7))
    assert all(len(samples) == 2 for _, samples in expected)
    assert "| streaming: " in whole.output  # the metrics line in LeRobot's training log line
    assert "end of run (lerobot_nodes streaming):" in whole.output
    assert "decoded frames per delivered frame" in whole.output

    first = trainer.run(*common, "--steps=3", f"--output_dir={trainer.tmp / 'parts'}", record="parts.jsonl")
    first.check()
    checkpoint = trainer.tmp / "parts" / "checkpoints" / "000003"
    assert (checkpoint / "training_state" / LOADER_STATE).is_file()
    config = checkpoint / "pretrained_model" / "train_config.json"
    resumed = trainer.run("--resume=true", f"--config_path={config}", "--steps=6", record="parts.jsonl")
    resumed.check()
    assert "resuming the streaming order exactly after step 3" in resumed.output
    assert resumed.batches() == expected

    # Without the loader state (a checkpoint of LeRobot's own loader, say) the streaming flags are
    # not in the checkpoint: they are given again, as LeRobot users repeat what its config does not hold.
    (checkpoint / "training_state" / LOADER_STATE).unlink()
    by_step = trainer.run(
        "--resume=true", f"--config_path={config}", "--steps=6", "--dataset.streaming_episode_pool_size=2",
        record="by_step.jsonl",
    )
    by_step.check()
    assert "resuming the streaming order by step offset" in by_step.output
    assert by_step.batches() == expected[3:]


@needs_lerobot
def test_streaming_false_runs_lerobots_own_loading(trainer: Trainer):
    run = trainer.run(
        *trainer.dataset_flags(), *TINY_ACT, "--dataset.streaming=false", "--dataset.video_backend=pyav",
        "--num_workers=0", "--steps=2", "--save_checkpoint=false", f"--output_dir={trainer.tmp / 'map'}",
    )
    run.check()
    assert "| streaming: " not in run.output
    assert "lerobot_nodes streaming" not in run.output
    assert run.batches() == []  # the streaming loader never ran


@needs_lerobot
def test_an_impossible_streaming_flag_is_one_line_before_lerobot_starts(trainer: Trainer):
    run = trainer.run(
        *trainer.dataset_flags(), *TINY_ACT, "--dataset.streaming=true", "--dataset.streaming_episode_pool_size=0",
        "--steps=2", f"--output_dir={trainer.tmp / 'bad'}",
    )
    assert_one_line_error(run.result, 2, "--dataset.streaming_episode_pool_size must be >= 1, got 0")
    assert "draccus" not in run.output


def test_without_lerobot_train_is_a_one_line_error(tmp_path, python_311):
    """In a venv without LeRobot (the dev venv, Python 3.11) the command says what to install."""
    result = subprocess.run(
        [python_311, "-m", "lerobot_nodes.cli.main", "train", "--dataset.repo_id=local/tiny", "--steps=2"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    if result.returncode == 0:  # pragma: no cover - a dev venv that has LeRobot's trainer
        return
    assert_one_line_error(result, 1, "lerobot-nodes train runs LeRobot's trainer: it needs LeRobot >= 0.6.1")


def test_streaming_flags_are_checked_without_lerobot(tmp_path, python_311):
    result = subprocess.run(
        [python_311, "-m", "lerobot_nodes.cli.main", "train", "--dataset.streaming_sampling_strategy", "shuffled"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert_one_line_error(result, 2, "--dataset.streaming_sampling_strategy must be one of remaining, round_robin")
