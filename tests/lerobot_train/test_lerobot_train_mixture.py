"""``lerobot-nodes train`` on a mixture: LeRobot 0.6.1's trainer (ACT on CPU) over two LeRobot-written datasets.

``--dataset.repo_id='["local/tiny-av1","local/tiny-h264"]'`` with a root list, LeRobot's own list
spelling; ``--dataset.streaming_rename_map`` calls both ``wrist`` cameras ``hand`` and swaps the H.264
dataset's ``top`` and ``left`` cameras; its ``left`` camera (``top`` in its own names) is not shared, so
it is dropped. The policy's normalisation stats are the two datasets' aggregated.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from .conftest import LEROBOT_AV1, TINY_ACT, Trainer, needs_lerobot

LEROBOT_H264 = LEROBOT_AV1.parent / "lerobot-writer-tiny-h264"
NAMES = ["local/tiny-av1", "local/tiny-h264"]
RENAME = {
    "local/tiny-av1": {"observation.images.wrist": "observation.images.hand"},
    "local/tiny-h264": {
        "observation.images.top": "observation.images.left",
        "observation.images.left": "observation.images.top",
        "observation.images.wrist": "observation.images.hand",
    },
}
READ_STATS = """
import json, sys
from pathlib import Path
from safetensors.torch import load_file
[found] = Path(sys.argv[1]).glob("policy_preprocessor_step_*normalizer*.safetensors")
stats = load_file(str(found))
print(json.dumps({key: value.tolist() for key, value in stats.items() if key.startswith(("observation.state.", "action."))}))
"""


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    for path in target.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def _flags(trainer: Trainer) -> tuple[str, ...]:
    roots = [str(trainer.root), str(_copy(LEROBOT_H264, trainer.tmp / "tiny-h264"))]
    return (
        f"--dataset.repo_id={json.dumps(NAMES)}",
        f"--dataset.root={json.dumps(roots)}",
        f"--dataset.streaming_rename_map={json.dumps(RENAME)}",
    )


def _aggregated(key: str, stat: str) -> np.ndarray:
    """``stat`` of ``key`` over both datasets as LeRobot's aggregate_stats pools them (count-weighted)."""
    parts = [
        json.loads((root / "meta" / "stats.json").read_text())[key] for root in (LEROBOT_AV1, LEROBOT_H264)
    ]
    counts = np.array([part["count"][0] for part in parts], dtype=np.float64)
    means = np.array([part["mean"] for part in parts])
    mean = (means * counts[:, None]).sum(0) / counts.sum()
    if stat == "mean":
        return mean
    variances = np.array([part["std"] for part in parts]) ** 2
    return np.sqrt(((variances + (means - mean) ** 2) * counts[:, None]).sum(0) / counts.sum())


@needs_lerobot
def test_act_trains_on_a_two_dataset_mixture_checkpoints_and_resumes_sample_for_sample(trainer: Trainer):
    common = (
        *_flags(trainer),
        *TINY_ACT,
        "--dataset.streaming=true",
        "--num_workers=2",
        "--save_freq=3",
        "--dataset.streaming_episode_pool_size=2",
    )
    whole = trainer.run(*common, "--steps=6", f"--output_dir={trainer.tmp / 'whole'}", record="whole.jsonl")
    whole.check()
    expected = whole.batches()
    assert [step for step, _ in expected] == list(range(1, 7))
    samples = [sample for _, batch in expected for sample in batch]
    assert all(len(sample) == 3 for sample in samples)  # [dataset_index, episode, frame]
    assert len(set(samples)) == len(samples) and {sample[0] for sample in samples} == {0, 1}
    assert "streaming a mixture of 2 datasets" in whole.output
    assert "samples per dataset: local/tiny-av1 " in whole.output  # in LeRobot's training log line
    assert (
        "features not shared by every dataset of the mixture are dropped (local/tiny-h264: observation.images.left)"
        in whole.output
    )
    config = json.loads(
        (trainer.tmp / "whole" / "checkpoints" / "000006" / "pretrained_model" / "config.json").read_text()
    )
    assert sorted(key for key in config["input_features"] if "images" in key) == [
        "observation.images.hand",
        "observation.images.top",
    ]

    # The policy normalises with the mixture's stats: both datasets' pooled, not the first one's.
    pretrained = trainer.tmp / "whole" / "checkpoints" / "000006" / "pretrained_model"
    read = subprocess.run(
        [trainer.python, "-c", READ_STATS, str(pretrained)], capture_output=True, text=True, check=True
    )
    saved = json.loads(read.stdout)
    for key in ("observation.state", "action"):
        for stat in ("mean", "std"):
            np.testing.assert_allclose(saved[f"{key}.{stat}"], _aggregated(key, stat), rtol=1e-5, atol=1e-6)

    first = trainer.run(*common, "--steps=3", f"--output_dir={trainer.tmp / 'parts'}", record="parts.jsonl")
    first.check()
    config = trainer.tmp / "parts" / "checkpoints" / "000003" / "pretrained_model" / "train_config.json"
    # The rename map is not in LeRobot's train_config.json: the loader state saved beside it holds it.
    resumed = trainer.run("--resume=true", f"--config_path={config}", "--steps=6", record="parts.jsonl")
    resumed.check()
    assert "resuming the streaming order exactly after step 3" in resumed.output
    assert resumed.batches() == expected


def test_lerobots_list_text_and_json_are_lists_and_anything_else_is_one_line():
    """LeRobot's parser turns ``--dataset.repo_id='["A","B"]'`` into the text ``"['A', 'B']"``: both read as lists."""
    from lerobot_nodes.cli.lerobot_train import lerobot_list
    from lerobot_nodes.errors import ConfigError

    assert lerobot_list("--dataset.repo_id", "['A', 'B']") == ["A", "B"]
    assert lerobot_list("--dataset.revision", '[null, "v3.0"]') == [None, "v3.0"]
    assert lerobot_list("--dataset.revision", "[None, 'v3.0']") == [None, "v3.0"]
    assert lerobot_list("--dataset.repo_id", "OWNER/A") == "OWNER/A"
    assert lerobot_list("--dataset.root", None) is None
    with pytest.raises(ConfigError, match=r"^--dataset.repo_id=\"\['A', \" is not a valid JSON list: "):
        lerobot_list("--dataset.repo_id", "['A', ")
    with pytest.raises(ConfigError, match=r"^--dataset.root='\[1, 2\]' must be a JSON list of strings"):
        lerobot_list("--dataset.root", "[1, 2]")


@needs_lerobot
def test_act_trains_on_a_weighted_mixture_and_resumes_with_its_weights_sample_for_sample(trainer: Trainer):
    """``--dataset.streaming_weights='[0.9,0.1]'`` reaches the dataset (its resume identity and the loader state
    beside each checkpoint hold the weights), and ``--resume=true`` restores them: the same batches follow."""
    common = (
        *_flags(trainer),
        *TINY_ACT,
        "--dataset.streaming=true",
        "--dataset.streaming_weights=[0.9,0.1]",
        "--num_workers=2",
        "--save_freq=3",
        "--dataset.streaming_episode_pool_size=2",
    )
    whole = trainer.run(*common, "--steps=6", f"--output_dir={trainer.tmp / 'whole'}", record="whole.jsonl")
    whole.check()
    expected = whole.batches()
    import torch

    from lerobot_nodes.cli.lerobot_train import TRAINING_STATE_DIR, loader_state_file

    state_file = trainer.tmp / "whole" / "checkpoints" / "000003" / TRAINING_STATE_DIR / loader_state_file(0)
    saved = torch.load(state_file, weights_only=False)
    assert saved["streaming"]["streaming_weights"] == [0.9, 0.1] and saved["dataset"]["weights"] == [0.9, 0.1]
    partial = trainer.run(*common, "--steps=3", f"--output_dir={trainer.tmp / 'parts'}", record="parts.jsonl")
    partial.check()
    config = trainer.tmp / "parts" / "checkpoints" / "000003" / "pretrained_model" / "train_config.json"
    resumed = trainer.run("--resume=true", f"--config_path={config}", "--steps=6", record="parts.jsonl")
    resumed.check()
    assert "resuming the streaming order exactly after step 3" in resumed.output
    assert resumed.batches() == expected
