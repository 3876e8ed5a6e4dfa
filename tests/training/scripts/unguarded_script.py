"""A training script without ``if __name__ == "__main__":``, as users write them (do not add one).

Usage: python unguarded_script.py DATASET_ROOT MODE, MODE one of:

- ``plain``: builds the dataset and ``streaming_dataloader`` with 2 workers and prints two batches;
- ``thread``: starts a thread first, so the workers' server cannot be a fork of this process and
  each worker would run this script again;
- ``stateful``: a plain ``StatefulDataLoader`` with the stdlib forkserver (whose workers always
  run this script again).
"""

import sys
import threading

from torchdata.stateful_dataloader import StatefulDataLoader

from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader

root, mode = sys.argv[1], sys.argv[2]
stop = threading.Event()
if mode == "thread":
    threading.Thread(target=stop.wait, name="trainer-side-thread", daemon=True).start()
dataset = StreamingLeRobotDataset(root=root, return_uint8=True, seed=2)
if mode == "stateful":
    loader = StatefulDataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="forkserver")
else:
    loader = streaming_dataloader(dataset, batch_size=4, num_workers=2)
for step, batch in zip(range(2), loader, strict=False):
    print(f"batch {step}: episodes {sorted(set(batch['episode_index'].tolist()))}", flush=True)
stop.set()
