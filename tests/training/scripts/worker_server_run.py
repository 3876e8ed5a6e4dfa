"""Stream a few batches with 2 workers after setting up the training process as ``MODE`` says.

Usage: python worker_server_run.py DATASET_ROOT OUT_DIR MODE, MODE one of:

- ``plain``: nothing else runs; the workers' server is a fork of this process;
- ``thread``: another thread runs when the server starts, so it is a new interpreter;
- ``codec``: an FFmpeg decoder is open in this process, so the fork replaces itself with one;
- ``dataset``: no ``start_worker_context()`` call: building the dataset forks the server;
- ``thread-after-dataset``: the same, and a thread starts after the dataset is built and before
  the DataLoader (as s3fs's event loop does for an ``s3://`` root): the server is still a fork.

Also installs a SIGTERM handler, a root logging handler and a SIGUSR2 stack dump
(``dump_stacks_on``) first, as a trainer would; each worker sends itself SIGUSR2 at its start.
Prints one JSON line: how the server started, its command line, what each worker saw of this
process's handlers, and a digest of the batches.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import av
import numpy as np

from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader
from lerobot_nodes.loader import shutdown_dataloader, start_worker_context
from lerobot_nodes.workers.lifeline import dump_stacks_on
from lerobot_nodes.workers.server import SERVER


class RecordWorker:
    """``worker_init_fn``: writes which of the trainer's handlers the worker still has."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def __call__(self, worker_id: int) -> None:
        seen = {
            "sigterm_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
            "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
            "root_handlers": len(logging.root.handlers),
        }
        os.kill(os.getpid(), signal.SIGUSR2)  # its default action would end the worker
        seen["survived_sigusr2"] = True
        (self.out / f"worker-{worker_id}.json").write_text(json.dumps(seen))


def main() -> None:
    root, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    signal.signal(signal.SIGTERM, lambda *_: None)
    logging.basicConfig(level=logging.INFO)
    dump_stacks_on(signal.SIGUSR2)
    stop = threading.Event()
    built_before = {"a trainer's object from before the dataset": [1, 2, 3]}
    if mode == "thread":
        threading.Thread(target=stop.wait, name="trainer-side-thread", daemon=True).start()
    decoder = None
    if mode == "codec":
        video = next(Path(root, "videos").rglob("*.mp4"))
        decoder = av.open(str(video))
        next(decoder.decode(video=0))  # the codec context is open and has decoded
    if mode not in ("dataset", "thread-after-dataset"):
        start_worker_context()
    dataset = StreamingLeRobotDataset(root=root, return_uint8=True, seed=5)
    walked = {id(obj) for obj in gc.get_objects()}  # the collector's generations, not the frozen objects
    frozen = gc.get_freeze_count() > 0 and id(built_before) not in walked
    if mode == "thread-after-dataset":
        threading.Thread(target=stop.wait, name="like-s3fs-event-loop", daemon=True).start()
    loader = streaming_dataloader(dataset, batch_size=4, num_workers=2, worker_init_fn=RecordWorker(out))
    digest = hashlib.sha256()
    try:
        for _, batch in zip(range(6), loader, strict=False):
            for key in sorted(batch):
                value = batch[key]
                if hasattr(value, "numpy"):
                    digest.update(key.encode() + np.ascontiguousarray(value.numpy()).tobytes())
        server_pid = SERVER._forkserver_pid
        command = Path(f"/proc/{server_pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    finally:
        shutdown_dataloader(loader)
        stop.set()
    workers = [json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))]
    print(
        json.dumps(
            {
                "forked": SERVER.forked, "shares_main": SERVER.workers_share_main(), "command": command,
                "workers": workers, "digest": digest.hexdigest(), "frozen_at_fork": frozen,
            }  # fmt: skip
        )
    )
    if decoder is not None:
        decoder.close()


if __name__ == "__main__":
    main()
