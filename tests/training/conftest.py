"""A small generated dataset shared by the training-integration tests, and an S3-compatible server holding it."""

from __future__ import annotations

import pytest

from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.s3 import LoopbackS3


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    """7 episodes, 2 AV1 cameras, rolled over into several video files."""
    root = tmp_path_factory.mktemp("training") / "dataset"
    return write_dataset(root, episode_lengths=[23, 41, 17, 35, 12, 29, 8], video_files_size_in_mb=0.03, seed=11)


S3_ROOT = "s3://training/small"


@pytest.fixture(scope="session")
def s3_env(small_dataset):
    """A moto S3 server on 127.0.0.1 holding the dataset at :data:`S3_ROOT`; yields the environment
    variables that point s3fs at it (for the scripts the tests run in their own processes)."""
    pytest.importorskip("s3fs")
    with LoopbackS3() as server:
        server.upload(small_dataset, S3_ROOT)
        yield server.environment()


@pytest.fixture(autouse=True)
def private_index_cache(tmp_path, monkeypatch):
    """Sidecar indexes go to a temporary LeRobot home, never the user's cache."""
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lerobot-home"))


@pytest.fixture(autouse=True)
def close_opened_datasets(monkeypatch):
    """Every dataset a test opens is closed after it: without workers a dataset's graph (its fetch and
    decode threads) lives in this process until closed, and would outlive the test into the next ones."""
    from lerobot_nodes.dataset import StreamingLeRobotDataset

    opened: list[StreamingLeRobotDataset] = []
    original = StreamingLeRobotDataset.__init__

    def opening(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(StreamingLeRobotDataset, "__init__", opening)
    yield
    while opened:
        opened.pop().close()
