"""A mixture of 20 Hub datasets from one loopback Hub: it opens, streams an epoch exactly once per frame,
and its Hub API requests at open stay within the per-dataset bound (benchmarks/mixture_scale.py --hub
measures the same at 10, 30 and 100 datasets).

The datasets are generated: two cameras each, the codecs alternating AV1 and H.264, 2 or 3 episodes.
"""

from __future__ import annotations

import collections
from pathlib import Path

import huggingface_hub.constants
import pytest

from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.hub import LoopbackHub

COUNT = 20
API_REQUESTS_PER_DATASET = 6
"""The bound on Hub API requests (``/api/...``, the scarcer quota) at open, per dataset of a mixture."""
CAMERAS = ("observation.images.top", "observation.images.wrist")


def lengths(index: int) -> list[int]:
    return [4, 3] if index % 3 else [3, 5, 2]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("hub-mixture")
    return [
        write_dataset(
            folder / f"d{i:02d}",
            episode_lengths=lengths(i),
            cameras=CAMERAS,
            height=16,
            width=16,
            codec="av1" if i % 2 == 0 else "h264",
            seed=i,
        )
        for i in range(COUNT)
    ]


@pytest.fixture
def hub(folders: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True, raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with LoopbackHub() as server:
        for i, folder in enumerate(folders):
            server.add_dataset(f"scale/d{i:02d}", folder)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        server.clear_records()
        yield server


def test_twenty_hub_datasets_open_within_the_request_bound_and_stream_each_frame_once(hub):
    names = [f"scale/d{i:02d}" for i in range(COUNT)]
    dataset = StreamingLeRobotDataset(
        repo_id=names, config=StreamingConfig(streaming_episode_pool_size=4, streaming_decode_threads=2)
    )
    at_open = list(hub.records)
    api = collections.Counter(r.path for r in at_open if r.origin == "hub" and r.path.startswith("/api/"))
    per_dataset = {
        name: sum(1 for r in at_open if r.path.startswith(f"/api/datasets/{name}/")) for name in names
    }
    assert sum(api.values()) <= API_REQUESTS_PER_DATASET * COUNT, api
    assert max(per_dataset.values()) <= API_REQUESTS_PER_DATASET, per_dataset
    assert min(per_dataset.values()) >= 1  # every dataset's revision is pinned through the API
    assert dataset.meta.video_keys == list(CAMERAS)

    seen = collections.Counter(
        (int(sample["dataset_index"]), int(sample["episode_index"]), int(sample["frame_index"]))
        for sample in dataset
    )
    every = {(d, e, f) for d in range(COUNT) for e, n in enumerate(lengths(d)) for f in range(n)}
    assert set(seen) == every and set(seen.values()) == {1}
    dataset.close()
