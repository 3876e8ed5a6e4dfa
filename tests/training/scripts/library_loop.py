"""A training script's data loop: iterate the streaming dataset until killed.

Usage: python library_loop.py DATASET_ROOT RECORD
{streaming_dataloader|stateful_dataloader|fork_dataloader|no_workers|idle}

``streaming_dataloader`` builds the loader as the README shows; ``stateful_dataloader``
builds a plain ``StatefulDataLoader`` with a forkserver, as a user who does not call
``streaming_dataloader`` would, ``fork_dataloader`` one with ``fork`` workers (torch's default on
Linux); ``no_workers`` is ``streaming_dataloader`` with 0 workers. Each
batch appends one line to RECORD. ``idle`` builds the dataset only (which forks the workers'
server), writes three lines and sleeps: a trainer still building its policy.
"""

from __future__ import annotations

import sys
import time

from torchdata.stateful_dataloader import StatefulDataLoader

from lerobot_nodes import StreamingConfig, StreamingLeRobotDataset, streaming_dataloader


def main() -> None:
    root, record, how = sys.argv[1:4]
    config = StreamingConfig(streaming_episode_pool_size=2)
    dataset = StreamingLeRobotDataset(root=root, return_uint8=True, seed=3, config=config)
    if how == "idle":
        with open(record, "a") as out:
            out.write("built\n" * 3)
        while True:
            time.sleep(1)
    if how in ("streaming_dataloader", "no_workers"):
        loader = streaming_dataloader(dataset, batch_size=4, num_workers=2 if how == "streaming_dataloader" else 0)
    else:
        loader = StatefulDataLoader(
            dataset, batch_size=4, num_workers=2, persistent_workers=True,
            multiprocessing_context="fork" if how == "fork_dataloader" else "forkserver",
        )  # fmt: skip
    with open(record, "a") as out:
        while True:
            for batch in loader:
                out.write(f"{batch['episode_index'].tolist()}\n")
                out.flush()


if __name__ == "__main__":
    main()
