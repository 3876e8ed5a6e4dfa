"""The mixture the mixture tests stream: three datasets, their names, window, config and episode subset,
the map-style references and the helpers that read batches of it.

LeRobot's own AV1 and H.264 writes (local folders, 8 and 6 episodes; the H.264 one has an extra camera,
``left``), and a generated AV1 dataset served by the loopback Hub (``conftest.py``) whose ``front``
camera the rename map calls ``top``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lerobot_nodes import MapStyleLeRobotDataset
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.format.mixture import MixtureMeta

DATA = Path(__file__).resolve().parent.parent / "data"
AV1 = DATA / "lerobot-writer-tiny-av1"
H264 = DATA / "lerobot-writer-tiny-h264"
HUB_REPO = "lerobot-nodes/mixture-hub"
NAMES = [HUB_REPO, "local/tiny-av1", "local/tiny-h264"]
RENAME = {HUB_REPO: {"observation.images.front": "observation.images.top"}}
WINDOW = {"action": [0.0, 1 / 30, 2 / 30], "observation.images.top": [-1 / 30, 0.0]}
CONFIG = StreamingConfig(
    streaming_episode_pool_size=2, streaming_prefetch_episodes=2, streaming_decode_threads=2
)
# A few episodes of each dataset: the topology and resume tests need every dataset, not every frame.
FEW = {HUB_REPO: [0, 2], "local/tiny-av1": [1, 5], "local/tiny-h264": [0, 3, 4]}


def mixture(**kwargs: Any) -> StreamingLeRobotDataset:
    options: dict[str, Any] = {
        "repo_id": NAMES,
        "root": [None, AV1, H264],
        "rename_map": RENAME,
        "delta_timestamps": WINDOW,
        "return_uint8": True,
        "seed": 5,
        "config": CONFIG,
    }
    options.update(kwargs)
    return StreamingLeRobotDataset(**options)


def references(hub_folder: Path) -> list[MapStyleLeRobotDataset]:
    """The map-style reader of each dataset, on its own names (the window of ``top`` on ``front``)."""
    hub_window = {
        "observation.images.front" if k == "observation.images.top" else k: v for k, v in WINDOW.items()
    }
    return [
        MapStyleLeRobotDataset(root=hub_folder, delta_timestamps=hub_window, return_uint8=True),
        MapStyleLeRobotDataset(root=AV1, delta_timestamps=WINDOW, return_uint8=True),
        MapStyleLeRobotDataset(root=H264, delta_timestamps=WINDOW, return_uint8=True),
    ]


def expected_sample(
    reference: MapStyleLeRobotDataset, dataset_index: int, index: int, order: list[str]
) -> dict[str, Any]:
    """What the mixture must deliver for frame ``index`` of dataset ``dataset_index``: the map-style
    sample renamed, without the features the mixture drops, then ``dataset_index``; in the mixture's key order."""
    renames = RENAME.get(NAMES[dataset_index], {})
    renamed = {}
    for key, value in reference[index].items():
        is_pad = key.endswith("_is_pad")
        base = key[: -len("_is_pad")] if is_pad else key
        target = renames.get(base, base)
        renamed[target + "_is_pad" if is_pad else target] = value
    renamed.pop("observation.images.left", None)
    renamed["dataset_index"] = torch.tensor(dataset_index)
    assert set(renamed) == set(order), f"dataset {dataset_index}: {sorted(renamed)} != {sorted(order)}"
    return {key: renamed[key] for key in order}


def unbatched(batch: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v[i] for k, v in batch.items()} for i in range(len(batch["index"]))]


def keys_of(batch: dict[str, Any]) -> list[tuple[int, int]]:
    return list(zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True))


def sequence(loader: Any, batches: int) -> list[list[tuple[int, int]]]:
    out = []
    iterator = iter(loader)
    for _ in range(batches):
        try:
            out.append(keys_of(next(iterator)))
        except StopIteration:
            iterator = iter(loader)
            out.append(keys_of(next(iterator)))
    return out


def all_frames(dataset: StreamingLeRobotDataset) -> set[tuple[int, int]]:
    """``(dataset_index, index)`` of every selected frame, from the parts' own metadata."""
    meta = dataset.meta
    assert isinstance(meta, MixtureMeta)
    frames = set()
    for episode in dataset.episodes:
        part, local = meta.part_of(episode)
        start, stop = meta.parts[part].episode_bounds(local)
        frames |= {(part, i) for i in range(start, stop)}
    return frames


