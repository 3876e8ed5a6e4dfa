"""``lerobot-nodes train``: LeRobot 0.6.1's own trainer (ACT on CPU) streaming through lerobot_nodes.

Each test runs the real trainer in a subprocess of the LeRobot venv (see ``conftest``), on a copy
of the LeRobot-written AV1 fixture (8 episodes, 380 frames), offline.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from cli.cli_process import assert_one_line_error

from .conftest import LEROBOT_AV1, SRC, TINY_ACT, Trainer, lerobot_python, needs_lerobot

LOADER_STATE = "lerobot_nodes_loader_rank0.pt"


IN_LEROBOT = """
import json
from lerobot.utils.logging_utils import AverageMeter, MetricsTracker
from lerobot_nodes.cli.lerobot_train import _metrics_tracker_class, check_lerobot

found = {"version": check_lerobot()}

class Session:
    def metrics_line(self): return "LINE"
    def metrics_dict(self): return {"streaming/refill_stalls": 3.0}

Tracker = _metrics_tracker_class(MetricsTracker, Session())
meters = lambda *names: {n: AverageMeter(n, ":.3f") for n in names}
train, evaluation = Tracker(2, 380, 8, meters("loss", "dataloading_s")), Tracker(2, 380, 8, meters("eval_s"))
found["train"] = [str(train), train.to_dict()]
found["eval"] = [str(evaluation), evaluation.to_dict()]

import sys
from lerobot.configs.default import DatasetConfig
from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
from lerobot.datasets.factory import make_train_eval_datasets
from lerobot_nodes.cli.lerobot_train import split_train_eval

class Policy:
    reward_delta_indices = action_delta_indices = observation_delta_indices = None

class Config:
    dataset = DatasetConfig(repo_id="local/tiny", root=sys.argv[1], eval_split=0.25, video_backend="pyav")
    trainable_config, tolerance_s = Policy(), 1e-4

train_part, held_out = make_train_eval_datasets(Config())
meta = LeRobotDatasetMetadata("local/tiny", root=sys.argv[1])
found["lerobot_split"] = [train_part.episodes, held_out.episodes]
found["our_split"] = split_train_eval(meta.episodes["tasks"], range(meta.total_episodes), 0.25)

import lerobot.scripts.lerobot_train as trainer
trainer.should_save_checkpoint = lambda step, save_freq: True
try:
    check_lerobot()
except Exception as error:
    found["changed"] = f"{type(error).__name__}: {error}"
print(json.dumps(found))
"""
"""Checks that need LeRobot's classes, in one subprocess (importing LeRobot and torch takes a while)."""


@pytest.fixture(scope="module")
def in_lerobot(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = lerobot_python()
    assert python is not None
    result = subprocess.run(
        [python, "-c", IN_LEROBOT, str(LEROBOT_AV1)], capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(SRC), "PATH": "", "HF_HUB_OFFLINE": "1", "HF_LEROBOT_HOME": str(tmp_path_factory.mktemp("home"))},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@needs_lerobot
def test_the_hooked_names_are_checked_against_lerobot(in_lerobot: dict[str, Any]):
    """``check_lerobot`` passes on LeRobot 0.6.1 and fails loudly when a hooked signature changes."""
    assert in_lerobot["version"] == "0.6.1"
    assert in_lerobot["changed"].startswith(
        "LeRobotIncompatibleError: lerobot.scripts.lerobot_train.should_save_checkpoint takes (step, save_freq)"
    ), in_lerobot["changed"]


@needs_lerobot
def test_the_training_log_line_and_wandb_dict_carry_the_streaming_metrics(in_lerobot: dict[str, Any]):
    """What LeRobot's trainer logs (``str(train_tracker)``) and passes to wandb (``train_tracker.to_dict()``);
    the trackers of env evaluation (no ``dataloading_s``) are left as they are."""
    line, values = in_lerobot["train"]
    assert line.endswith(" | streaming: LINE") and line.startswith("step:0 ")
    assert values["streaming/refill_stalls"] == 3.0 and "loss" in values
    line, values = in_lerobot["eval"]
    assert "streaming" not in line and not any(key.startswith("streaming/") for key in values)


@needs_lerobot
def test_the_eval_split_holds_out_the_episodes_lerobot_holds_out(in_lerobot: dict[str, Any]):
    """``--dataset.eval_split``: the same per-task rule as LeRobot's ``make_train_eval_datasets``."""
    assert in_lerobot["our_split"] == in_lerobot["lerobot_split"]
    train, held_out = in_lerobot["our_split"]
    assert train and held_out and sorted(train + held_out) == list(range(8))


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
def test_two_processes_train_on_disjoint_episodes(trainer: Trainer):
    """``accelerate launch --num_processes=2`` on CPU: each rank streams its own whole episodes and saves its
    own loader state beside the checkpoint."""
    run = trainer.run(
        *trainer.dataset_flags(), *TINY_ACT, "--dataset.streaming=true", "--num_workers=1", "--steps=3",
        "--save_freq=3", f"--output_dir={trainer.tmp / 'ddp'}", processes=2,
    )
    run.check()
    lines = [json.loads(line) for line in run.record.read_text().splitlines()]
    episodes = {rank: {e for line in lines if line["rank"] == rank for e, _ in line["samples"]} for rank in (0, 1)}
    assert all(episodes.values()) and not episodes[0] & episodes[1], episodes
    assert sorted(line["step"] for line in lines) == [1, 1, 2, 2, 3, 3]
    state = trainer.tmp / "ddp" / "checkpoints" / "000003" / "training_state"
    assert {path.name for path in state.glob("lerobot_nodes_loader_rank*.pt")} == {
        "lerobot_nodes_loader_rank0.pt", "lerobot_nodes_loader_rank1.pt"
    }


@needs_lerobot
def test_an_eval_split_streams_the_training_episodes_and_evaluates_the_others_map_style(
    trainer: Trainer, in_lerobot: dict[str, Any]
):
    run = trainer.run(
        *trainer.dataset_flags(), *TINY_ACT, "--dataset.streaming=true", "--num_workers=0", "--steps=2",
        "--save_checkpoint=false", "--dataset.eval_split=0.25", "--eval_steps=2", "--max_eval_samples=4",
        "--dataset.video_backend=pyav", f"--output_dir={trainer.tmp / 'eval'}",
    )
    run.check()
    assert "train/eval split: 5 streamed training episodes, 3 held out" in run.output
    assert "step 2: eval_loss=" in run.output
    streamed = {episode for _, samples in run.batches() for episode, _ in samples}
    assert streamed and streamed <= set(in_lerobot["lerobot_split"][0]) and len(run.batches()) == 2


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
    """In the dev venv (Python 3.11, no LeRobot) the command says what LeRobot needs and how to install it."""
    result = subprocess.run(
        [python_311, "-m", "lerobot_nodes.cli.main", "train", "--dataset.repo_id=local/tiny", "--steps=2"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    if result.returncode == 0:  # pragma: no cover - a dev venv that has LeRobot's trainer
        return
    error = assert_one_line_error(result, 1, "lerobot-nodes train runs LeRobot's trainer, which needs Python >= 3.12")
    assert "pip install -e '.[lerobot]'" in error  # a hint that works from a clone


def test_streaming_flags_are_checked_without_lerobot(tmp_path, python_311):
    result = subprocess.run(
        [python_311, "-m", "lerobot_nodes.cli.main", "train", "--dataset.streaming_sampling_strategy", "shuffled"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert_one_line_error(result, 2, "--dataset.streaming_sampling_strategy must be one of remaining, round_robin")


def test_only_the_streaming_flags_are_taken_out_of_the_command_line():
    from lerobot_nodes.cli.flags import split_streaming_flags

    argv = [
        "--dataset.repo_id=local/tiny", "--dataset.streaming=true", "--dataset.streaming_episode_pool_size", "4",
        "--policy.type=act", "--dataset.streaming_byte_budget_gb=0.5", "--dataset.video_decoder_cache_size=null",
        "--dataset.image_transforms.enable=true", "--steps", "6",
    ]
    options, rest = split_streaming_flags(argv)
    assert options == {
        "streaming_episode_pool_size": 4, "streaming_byte_budget_gb": 0.5, "video_decoder_cache_size": None
    }
    assert rest == [
        "--dataset.repo_id=local/tiny", "--dataset.streaming=true", "--policy.type=act",
        "--dataset.image_transforms.enable=true", "--steps", "6",
    ]


@needs_lerobot
def test_streams_from_a_hub_repo(trainer: Trainer):
    """``--dataset.repo_id=OWNER/NAME`` without a root: the trainer streams from the Hub (a loopback Hub via
    ``HF_ENDPOINT``) at the commit of the ``v3.0`` tag, and LeRobot's own metadata comes from the same Hub."""
    from lerobot_nodes.testing.hub import LoopbackHub

    with LoopbackHub() as hub:
        sha = hub.add_dataset("lerobot-nodes/tiny-av1", trainer.root)
        run = trainer.run(
            "--dataset.repo_id=lerobot-nodes/tiny-av1", *TINY_ACT, "--dataset.streaming=true", "--num_workers=2",
            "--steps=3", "--save_checkpoint=false", f"--output_dir={trainer.tmp / 'hub'}",
            env={"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1",
                 "HF_HUB_DISABLE_TELEMETRY": "1"},
        )
        run.check()
        assert [step for step, _ in run.batches()] == [1, 2, 3]
        payload = [r for r in hub.records if "/videos/" in r.path or "/data/" in r.path]
        assert payload and all(sha in r.path for r in payload if r.origin == "hub"), payload[:3]
