"""Stream a few batches with 2 workers after setting up the training process as ``MODE`` says.

Usage: python worker_server_run.py DATASET_ROOT OUT_DIR MODE, MODE one of:

- ``plain``: nothing else runs; the workers' server is a fork of this process;
- ``thread``: another thread runs when the server starts, so it is a new interpreter;
- ``codec``: an FFmpeg decoder is open in this process, so the fork replaces itself with one.

Also installs a SIGTERM handler and a root logging handler first, as a trainer would. Prints
one JSON line: how the server started, its command line, what each worker saw of this
process's handlers, and a digest of the batches.
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import sys
import threading
from pathlib import Path

import av
import numpy as np

from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader
from lerobot_nodes.loader import shutdown_dataloader, start_worker_context
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
        (self.out / f"worker-{worker_id}.json").write_text(json.dumps(seen))


def main() -> None:
    root, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    signal.signal(signal.SIGTERM, lambda *_: None)
    logging.basicConfig(level=logging.INFO)
    stop = threading.Event()
    if mode == "thread":
        threading.Thread(target=stop.wait, name="trainer-side-thread", daemon=True).start()
    decoder = None
    if mode == "codec":
        video = next(Path(root, "videos").rglob("*.mp4"))
        decoder = av.open(str(video))
        next(decoder.decode(video=0))  # the codec context is open and has decoded
    start_worker_context()
    dataset = StreamingLeRobotDataset(root=root, return_uint8=True, seed=5)
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
            {"forked": SERVER.forked, "command": command, "workers": workers, "digest": digest.hexdigest()}
        )
    )
    if decoder is not None:
        decoder.close()


if __name__ == "__main__":
    main()
