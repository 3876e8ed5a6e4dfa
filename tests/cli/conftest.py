"""A tiny generated dataset for the command-line tests, and a private LeRobot home."""

from __future__ import annotations

from pathlib import Path

import pytest

from lerobot_nodes.testing import write_dataset


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 short episodes, 2 AV1 cameras, one MP4 per camera: the cheapest dataset the CLI streams. Read-only."""
    return write_dataset(tmp_path_factory.mktemp("cli") / "dataset", episode_lengths=[12, 9, 8, 10], seed=3)


@pytest.fixture(autouse=True)
def lerobot_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Sidecar indexes (and the demo dataset) go to a temporary LeRobot home, never the user's cache."""
    home = tmp_path / "lerobot-home"
    monkeypatch.setenv("HF_LEROBOT_HOME", str(home))
    monkeypatch.delenv("LEROBOT_NODES_DEBUG", raising=False)
    return home
