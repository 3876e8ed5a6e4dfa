"""Run under ``torchrun --nproc_per_node=2``: one epoch per rank, gathered on rank 0.

Usage: torchrun --nproc_per_node=2 torchrun_coverage.py DATASET_ROOT STRATEGY OUTPUT_JSON
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from lerobot_nodes.cli.console import exit_process
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.loader import streaming_dataloader


def main() -> int:
    root, strategy, output = sys.argv[1:4]
    dist.init_process_group("gloo")
    config = StreamingConfig(streaming_sampling_strategy=strategy, streaming_episode_pool_size=2)
    dataset = StreamingLeRobotDataset(root=root, seed=3, return_uint8=True, config=config)
    samples = []
    for batch in streaming_dataloader(dataset, batch_size=4, num_workers=1):
        samples += list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rank": dist.get_rank(), "world_size": dataset.world_size, "samples": samples})
    if dist.get_rank() == 0:
        with open(output, "w") as stream:
            json.dump(gathered, stream)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # Like the console scripts: skip the interpreter teardown where pyarrow can abort (exit 134).
    exit_process(main)
