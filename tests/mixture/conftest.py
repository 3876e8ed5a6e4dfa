"""The loopback Hub of the mixture tests and the generated dataset it serves (see ``helpers.py``)."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub.constants
import pytest

from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.hub import LoopbackHub

from .helpers import HUB_REPO


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shaped like the LeRobot-written ones (14-dim state and action, 96x128 cameras), its top camera named front."""
    return write_dataset(
        tmp_path_factory.mktemp("mixture") / "hub",
        episode_lengths=[16, 9, 21, 12],
        cameras=("observation.images.front", "observation.images.wrist"),
        height=96,
        width=128,
        state_dim=14,
        action_dim=14,
        seed=4,
    )


@pytest.fixture
def hub(hub_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True, raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with LoopbackHub() as server:
        server.add_dataset(HUB_REPO, hub_folder)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server
