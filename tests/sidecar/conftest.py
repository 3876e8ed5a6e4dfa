"""Fixtures of the sidecar tests: real datasets, an isolated cache, and a process forker."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lerobot_nodes.testing import write_dataset

from .sidecar_testkit import Zygote


@pytest.fixture(autouse=True)
def isolated_lerobot_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test touches the user's cache: ``$HF_LEROBOT_HOME`` is a fresh folder."""
    home = tmp_path / "lerobot-home"
    monkeypatch.setenv("HF_LEROBOT_HOME", str(home))
    return home


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """The AV1 encoder prints banners on the C-level stderr; keep test output readable."""
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@pytest.fixture(scope="session")
def h264_many_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 episodes of H.264 with B-frames, rolled into 12 MP4s per camera (24 files). Read-only."""
    root = tmp_path_factory.mktemp("datasets") / "h264-many"
    with _quiet_stderr():
        write_dataset(root, num_episodes=12, codec="h264", video_files_size_in_mb=0.005)
    return root


@pytest.fixture(scope="session")
def av1_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 episodes of AV1 (g=2, as LeRobot writes) in one MP4 per camera. Read-only."""
    root = tmp_path_factory.mktemp("datasets") / "av1"
    with _quiet_stderr():
        write_dataset(root, num_episodes=6, codec="av1")
    return root


@pytest.fixture(scope="session")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote]:
    forker = Zygote(tmp_path_factory.mktemp("zygote"))
    yield forker
    forker.close()
