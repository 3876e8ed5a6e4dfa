"""Driver B: LeRobot's map-style ``LeRobotDataset`` + ``DataLoader``, set up as ``lerobot-train`` does.

Runs under the LeRobot venv (``/work/lerobot-venv``). PyAV backend, ``return_uint8=True`` (the
training factory hard-codes it), ``EpisodeAwareSampler`` with the policy's ``drop_n_last_frames``
(Diffusion: 7), ``shuffle=True``, ``seed``; DataLoader worker options as in training
(``prefetch_factor``, ``persistent_workers``, ``multiprocessing_context``).
"""

from __future__ import annotations

from typing import Any

import _driver_common as common
import torch
from lerobot.datasets import EpisodeAwareSampler, LeRobotDataset


def build(config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(config["seed"])
    dataset = LeRobotDataset(
        config["repo_id"],
        root=config["root"],
        delta_timestamps=config["delta_timestamps"],
        tolerance_s=1e-4,
        video_backend="pyav",
        return_uint8=True,
    )
    sampler = EpisodeAwareSampler(
        dataset.meta.episodes["dataset_from_index"],
        dataset.meta.episodes["dataset_to_index"],
        episode_indices_to_use=dataset.episodes,
        drop_n_last_frames=config["drop_n_last_frames"],
        shuffle=True,
        seed=config["seed"],
        absolute_to_relative_idx=dataset.absolute_to_relative_idx,
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        num_workers=config["num_workers"],
        batch_size=config["batch_size"],
        shuffle=False,
        sampler=sampler,
        pin_memory=False,
        drop_last=False,
        **common.worker_kwargs(config),
    )
    info = {
        "label": "LeRobot 0.6.1 LeRobotDataset (map-style, pyav) + DataLoader",
        "placeholder": False,
        "epoch_samples": len(sampler),
    }
    return loader, info


if __name__ == "__main__":
    common.main(build)
