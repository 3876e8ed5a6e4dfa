"""A small generated dataset shared by the training-integration tests, and an S3-compatible server holding it."""

from __future__ import annotations

import pytest

from lerobot_nodes.testing import write_dataset


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    """7 episodes, 2 AV1 cameras, rolled over into several video files."""
    root = tmp_path_factory.mktemp("training") / "dataset"
    return write_dataset(root, episode_lengths=[23, 41, 17, 35, 12, 29, 8], video_files_size_in_mb=0.03, seed=11)


S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
S3_ROOT = "s3://training/small"


@pytest.fixture(scope="session")
def s3_env(small_dataset):
    """A moto S3 server on 127.0.0.1 holding the dataset at :data:`S3_ROOT`; yields the environment
    variables that point s3fs at it (for the scripts the tests run in their own processes)."""
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {**S3_ENV, "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    try:
        import s3fs

        fs = s3fs.S3FileSystem(
            key=env["AWS_ACCESS_KEY_ID"], secret=env["AWS_SECRET_ACCESS_KEY"], endpoint_url=env["AWS_ENDPOINT_URL"],
            skip_instance_cache=True,
        )  # fmt: skip
        bucket, prefix = S3_ROOT.removeprefix("s3://").split("/", 1)
        fs.mkdir(bucket)  # moto keeps buckets per process: a name no other test uses
        fs.put(str(small_dataset), f"{bucket}/{prefix}", recursive=True)
        yield env
    finally:
        server.stop()


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
