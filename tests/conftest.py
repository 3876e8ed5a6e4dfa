"""Shared fixtures: the LeRobot-written dataset and its golden samples (read-only)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def _shared_datasets() -> Path:
    """``../shared/datasets`` beside the repository (or ``$LEROBOT_NODES_SHARED_DATASETS``)."""
    candidates = [
        os.environ.get("LEROBOT_NODES_SHARED_DATASETS"),
        Path(__file__).resolve().parents[2] / "shared" / "datasets",
        "/work/shared/datasets",
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "lerobot-writer-small").is_dir():
            return Path(candidate)
    return Path(__file__).resolve().parents[2] / "shared" / "datasets"


SHARED = _shared_datasets()
LEROBOT_DATASET = SHARED / "lerobot-writer-small"
GOLDEN = SHARED / "lerobot-writer-small-golden"


def pytest_configure(config: pytest.Config) -> None:
    if not LEROBOT_DATASET.is_dir():
        raise pytest.UsageError(f"the LeRobot-written test dataset is missing: {LEROBOT_DATASET}")


@pytest.fixture(scope="session")
def lerobot_dataset() -> Path:
    """The dataset written by LeRobot 0.6.1's writer. Read-only: copy before changing it."""
    return LEROBOT_DATASET


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    return GOLDEN


@pytest.fixture
def dataset_copy(tmp_path: Path) -> Path:
    """A writable copy of the LeRobot-written dataset."""
    target = tmp_path / "dataset"
    shutil.copytree(LEROBOT_DATASET, target)
    for path in target.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target
