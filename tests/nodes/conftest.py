"""Generated datasets shared by the graph tests (written once per session)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lerobot_nodes.testing import write_dataset

CAMERAS = ("observation.images.top", "observation.images.wrist")
DELTA_TIMESTAMPS = {
    "observation.images.top": [-2 / 30, 0.0],
    "observation.state": [-1 / 30, 0.0],
    "action": [0.0, 1 / 30, 2 / 30],
}


@pytest.fixture(scope="module", autouse=True)
def isolated_lerobot_home(tmp_path_factory: pytest.TempPathFactory):
    """Sidecar caches of these tests go to a temporary ``$HF_LEROBOT_HOME`` (restored after each module)."""
    previous = os.environ.get("HF_LEROBOT_HOME")
    os.environ["HF_LEROBOT_HOME"] = str(tmp_path_factory.mktemp("lerobot-home"))
    yield
    if previous is None:
        os.environ.pop("HF_LEROBOT_HOME", None)
    else:
        os.environ["HF_LEROBOT_HOME"] = previous


def _write(root: Path, codec: str) -> Path:
    # Small files so data and both cameras roll over into several files.
    return write_dataset(
        root,
        episode_lengths=[20, 31, 12, 26, 17, 24],
        cameras=CAMERAS,
        codec=codec,  # type: ignore[arg-type]
        video_files_size_in_mb=0.05 if codec == "av1" else 0.02,
        data_file_size_in_mb=0.01,
        seed=5,
    )


@pytest.fixture(scope="session")
def av1_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("streaming") / "av1", "av1")


@pytest.fixture(scope="session")
def h264_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """H.264 with B-frames: reordered video, composition offsets."""
    return _write(tmp_path_factory.mktemp("streaming") / "h264", "h264")


@pytest.fixture(scope="session")
def tabular_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """No cameras: the Parquet part of the graph alone."""
    return write_dataset(
        tmp_path_factory.mktemp("streaming") / "tabular",
        episode_lengths=[9, 14, 5, 11, 8, 16, 7, 12],
        cameras=(),
        data_file_size_in_mb=0.004,
        seed=8,
    )
