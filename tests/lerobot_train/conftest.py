"""Run ``lerobot-nodes train`` (LeRobot's real trainer) in a Python 3.12 venv with LeRobot 0.6.1.

``LEROBOT_NODES_LEROBOT_PYTHON`` names that venv's python (``scripts/setup_lerobot_train_venv.sh``
creates it and prints the line to export). The tests that need it are skipped, with that reason,
only when it is not set or does not exist; a venv that is there but broken fails them. The
subprocess imports this checkout's ``src`` (``PYTHONPATH``), whatever the venv has installed.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PYTHON_ENV = "LEROBOT_NODES_LEROBOT_PYTHON"
SRC = Path(__file__).resolve().parents[2] / "src"
LEROBOT_AV1 = Path(__file__).resolve().parents[1] / "data" / "lerobot-writer-tiny-av1"
TINY_ACT = (
    "--policy.type=act",
    "--policy.device=cpu",
    "--policy.push_to_hub=false",
    "--policy.pretrained_backbone_weights=null",  # no torchvision download
    "--policy.dim_model=32",
    "--policy.n_heads=2",
    "--policy.dim_feedforward=64",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
    "--policy.latent_dim=8",
    "--policy.chunk_size=10",
    "--policy.n_action_steps=10",
    "--wandb.enable=false",
    "--batch_size=2",
    "--log_freq=1",
    "--seed=1000",
)
LOSS = re.compile(r"\bloss:(\S+)")


def lerobot_python() -> str | None:
    path = os.environ.get(PYTHON_ENV)
    return path if path and Path(path).exists() else None


needs_lerobot = pytest.mark.skipif(
    lerobot_python() is None,
    reason=f"{PYTHON_ENV} is not set to the python of a LeRobot 0.6.1 venv (bash scripts/setup_lerobot_train_venv.sh)",
)


@dataclass
class Run:
    result: subprocess.CompletedProcess[str]
    record: Path

    @property
    def output(self) -> str:
        return self.result.stdout + self.result.stderr

    def batches(self) -> list[tuple[int, list[tuple[int, int]]]]:
        """(step, [(episode, frame), ...]) of every batch the trainer took, in order."""
        if not self.record.exists():
            return []
        lines = [json.loads(line) for line in self.record.read_text().splitlines()]
        return [(line["step"], [tuple(pair) for pair in line["samples"]]) for line in lines]

    def losses(self) -> list[float]:
        return [float(value) for value in LOSS.findall(self.output)]

    def check(self) -> None:
        assert self.result.returncode == 0, self.output[-6000:]
        losses = self.losses()
        assert losses and all(math.isfinite(loss) for loss in losses), losses


@dataclass
class Trainer:
    """``lerobot-nodes train`` on a copy of the LeRobot-written AV1 fixture, offline, in its own LeRobot home."""

    tmp: Path
    root: Path
    python: str

    def run(
        self,
        *args: str,
        record: str = "record.jsonl",
        timeout: float = 900,
        processes: int = 1,
        env: dict[str, str] | None = None,
    ) -> Run:
        """``lerobot-nodes train ARGS``; ``processes`` > 1 runs it under ``accelerate launch`` (DDP on CPU, gloo).
        ``env`` overrides the offline environment (e.g. to reach a loopback Hub)."""
        launcher = [self.python]
        if processes > 1:
            accelerate = str(Path(self.python).parent / "accelerate")
            launcher = [accelerate, "launch", "--multi_gpu", f"--num_processes={processes}", "--num_machines=1",
                        "--mixed_precision=no", "--dynamo_backend=no"]
        environment = {
            **os.environ,
            "PYTHONPATH": str(SRC),
            "HF_HUB_OFFLINE": "1",
            "HF_LEROBOT_HOME": str(self.tmp / "lerobot-home"),
            "LEROBOT_NODES_RECORD": str(self.tmp / record),
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        command = [*launcher, "-m", "lerobot_nodes.cli.main", "train", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment, cwd=self.tmp)
        return Run(result, self.tmp / record)

    def dataset_flags(self) -> tuple[str, ...]:
        return ("--dataset.repo_id=local/tiny", f"--dataset.root={self.root}")


@pytest.fixture
def trainer(tmp_path: Path) -> Trainer:
    python = lerobot_python()
    assert python is not None
    root = tmp_path / "tiny"
    shutil.copytree(LEROBOT_AV1, root)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return Trainer(tmp_path, root, python)


@pytest.fixture
def python_311() -> str:
    return sys.executable
