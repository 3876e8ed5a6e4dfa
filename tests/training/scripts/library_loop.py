"""A training script's data loop: iterate the streaming dataset until killed.

Usage: python library_loop.py DATASET_ROOT RECORD {streaming_dataloader|stateful_dataloader}

``streaming_dataloader`` builds the loader as the README shows; ``stateful_dataloader``
builds a plain ``StatefulDataLoader`` with a forkserver, as a user who does not call
``streaming_dataloader`` would. Each batch appends one line to RECORD.
"""

from __future__ import annotations

import sys

from torchdata.stateful_dataloader import StatefulDataLoader

from lerobot_nodes import StreamingConfig, StreamingLeRobotDataset, streaming_dataloader


def main() -> None:
    root, record, how = sys.argv[1:4]
    config = StreamingConfig(streaming_episode_pool_size=2)
    dataset = StreamingLeRobotDataset(root=root, return_uint8=True, seed=3, config=config)
    if how == "streaming_dataloader":
        loader = streaming_dataloader(dataset, batch_size=4, num_workers=2)
    else:
        loader = StatefulDataLoader(
            dataset, batch_size=4, num_workers=2, persistent_workers=True, multiprocessing_context="forkserver"
        )
    with open(record, "a") as out:
        while True:
            for batch in loader:
                out.write(f"{batch['episode_index'].tolist()}\n")
                out.flush()


if __name__ == "__main__":
    main()
