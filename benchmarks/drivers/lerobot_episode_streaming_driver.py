"""Driver D: LeRobot's episode streaming (branch ``codex/episode-video-streaming-byte-cache``).

Runs under its own venv (``/work/lerobot-episode-venv``, Python 3.12, the branch installed in
editable mode; see benchmarks/README.md). Built as that branch's ``lerobot-train
--dataset.streaming=true`` builds it (``datasets/factory.py`` and ``scripts/lerobot_train.py``):

* ``StreamingLeRobotDataset(repo_id, root=..., delta_timestamps=..., max_num_shards=max(1,
  num_workers), return_uint8=True, repeat=True)`` with the training config's streaming defaults
  (``episode_pool_size=32``, ``prefetch_episodes=8``, ``byte_budget_gb=8``, ``decode_threads=2``,
  ``decoded_queue_size=8``; video backend: the platform default, torchcodec here); the dataset's
  default seed (42), as training passes none;
* ``DataLoader(num_workers=min(num_workers, 1), shuffle=False, drop_last=False)``: the branch runs
  one DataLoader worker per rank, the configured worker count becomes the dataset's internal
  fetch concurrency (``max_num_shards``). With ``--workers 2`` D therefore has one worker process
  plus its own decode threads. Worker options (``prefetch_factor``, ``persistent_workers``,
  ``multiprocessing_context``) only when that one worker exists, as training sets them.

``repeat=True`` makes the stream endless, so a full-epoch run (``num_batches`` None) stops after
one epoch's worth of batches (``ceil(num_frames / batch_size)``).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import _driver_common as common
import torch
from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

BRANCH = "codex/episode-video-streaming-byte-cache"
BRANCH_COMMIT = "21321d7a279c1f4a17d7daf0d57ca6eb58337495"

# lerobot.configs.default.DatasetConfig defaults on the branch (streaming_*).
TRAIN_DEFAULTS = {
    "episode_pool_size": 32,
    "prefetch_episodes": 8,
    "byte_budget_gb": 8.0,
    "decode_threads": 2,
    "decoded_queue_size": 8,
}


def build(config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(config["seed"])
    dataset = StreamingLeRobotDataset(
        config["repo_id"],
        root=config["root"],
        delta_timestamps=config["delta_timestamps"],
        tolerance_s=1e-4,
        max_num_shards=max(1, config["num_workers"]),
        return_uint8=True,
        repeat=True,
        **TRAIN_DEFAULTS,
    )
    loader_workers = min(config["num_workers"], 1)
    loader = torch.utils.data.DataLoader(
        dataset,
        num_workers=loader_workers,
        batch_size=config["batch_size"],
        shuffle=False,
        pin_memory=False,
        drop_last=False,
        **common.worker_kwargs({**config, "num_workers": loader_workers}),
    )
    epoch_samples = dataset.num_frames
    info = {
        "label": f"LeRobot {BRANCH} ({BRANCH_COMMIT[:7]}) StreamingLeRobotDataset + DataLoader",
        "placeholder": False,
        "dataloader_workers": loader_workers,
        "max_num_shards": max(1, config["num_workers"]),
        "video_backend": dataset._video_backend,
        "epoch_samples": epoch_samples,
    }
    if config.get("num_batches") is None:
        # repeat=True never ends: one epoch's worth of batches stands for "one epoch".
        return itertools.islice(loader, math.ceil(epoch_samples / config["batch_size"])), info
    return loader, info


if __name__ == "__main__":
    common.main(build)
