"""Shared fixtures: the datasets LeRobot's writer produced and their golden samples (``tests/data``).

See ``tests/data/README.md`` for what they hold and how they were made. They are read-only:
copy one (``dataset_copy``) before changing it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"
LEROBOT_AV1 = DATA / "lerobot-writer-tiny-av1"
LEROBOT_H264 = DATA / "lerobot-writer-tiny-h264"


@pytest.fixture(scope="session", autouse=True)
def session_lerobot_home(tmp_path_factory: pytest.TempPathFactory):
    """Every cache the tests fill (MP4 indexes, metadata, parsed episode tables, bytes) goes to a
    temporary ``$HF_LEROBOT_HOME``, never the user's; folders' own fixtures narrow it further."""
    previous = os.environ.get("HF_LEROBOT_HOME")
    os.environ["HF_LEROBOT_HOME"] = str(tmp_path_factory.mktemp("session-lerobot-home"))
    yield
    if previous is None:
        os.environ.pop("HF_LEROBOT_HOME", None)
    else:
        os.environ["HF_LEROBOT_HOME"] = previous


@dataclass(frozen=True)
class WrittenDataset:
    """A dataset written by LeRobot 0.6.1, and the samples LeRobot's map-style reader returned for it."""

    root: Path

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def golden(self) -> Path:
        return self.root.with_name(f"{self.root.name}-golden")


@pytest.fixture(scope="session")
def lerobot_av1() -> Path:
    """AV1 (g=2), cameras top and wrist: 8 episodes in one data file and one MP4 per camera."""
    return LEROBOT_AV1


@pytest.fixture(scope="session")
def lerobot_h264() -> Path:
    """H.264 with B-frames, three cameras: 6 episodes whose data and videos span several files."""
    return LEROBOT_H264


@pytest.fixture(scope="session", params=[LEROBOT_AV1, LEROBOT_H264], ids=lambda root: root.name)
def lerobot_written(request: pytest.FixtureRequest) -> WrittenDataset:
    """Each LeRobot-written dataset in turn, with its golden samples."""
    return WrittenDataset(request.param)


@pytest.fixture
def dataset_copy(tmp_path: Path) -> Path:
    """A writable copy of the LeRobot-written AV1 dataset."""
    target = tmp_path / "dataset"
    shutil.copytree(LEROBOT_AV1, target)
    for path in target.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


@pytest.fixture
def unwritable_home(tmp_path):
    """A folder this process cannot write: a read-only tmpfs for root (which writes through
    permission bits), a folder without write permission for anyone else."""
    home = tmp_path / "home"
    home.mkdir()
    if os.geteuid() != 0:
        home.chmod(0o555)
        yield home
        home.chmod(0o755)
        return
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(home)], check=True, timeout=30)
    try:
        yield home
    finally:
        subprocess.run(["umount", str(home)], check=True, timeout=30)
