"""Driver C: LeRobot's ``StreamingLeRobotDataset`` + ``DataLoader``, set up as ``lerobot-train`` does.

Runs under the LeRobot venv (``/work/lerobot-venv``). Arguments as in LeRobot's dataset factory
(``return_uint8=True``, ``max_num_shards`` from ``num_workers``, default seed 42, default
1000-frame shuffle buffer); DataLoader with ``shuffle=False``, no sampler.

One deviation: training passes ``max_num_shards=num_workers``, and with ``num_workers=0`` that
gives ``min(num_shards, 0) = 0`` shards, an empty stream. The driver passes ``max(1, num_workers)``.
"""

from __future__ import annotations

from typing import Any

import _driver_common as common
import torch
from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset


def build(config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(config["seed"])
    dataset = StreamingLeRobotDataset(
        config["repo_id"],
        root=config["root"],
        delta_timestamps=config["delta_timestamps"],
        tolerance_s=1e-4,
        max_num_shards=max(1, config["num_workers"]),
        return_uint8=True,
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        num_workers=config["num_workers"],
        batch_size=config["batch_size"],
        shuffle=False,
        pin_memory=False,
        drop_last=False,
        **common.worker_kwargs(config),
    )
    info = {
        "label": "LeRobot 0.6.1 StreamingLeRobotDataset (torchcodec) + DataLoader",
        "placeholder": False,
        "num_shards": dataset.num_shards,
        "epoch_samples": dataset.num_frames,
    }
    return loader, info


if __name__ == "__main__":
    common.main(build)
