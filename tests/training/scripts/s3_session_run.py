"""Stream two batches of an ``s3://`` root with 2 workers; print what each process's S3 file system used.

Usage: python s3_session_run.py S3_ROOT OUT_DIR (the environment points s3fs at the server).

Prints one JSON line: whether the training process's file system uses this process's shared
session (``lerobot_nodes.sources.s3_session``), and for each worker, read once its file system has
made its S3 client, whether that file system uses the worker's shared session and whether the S3
service model that client was made from was parsed before the workers' server forked (it is then
one of the objects frozen at the fork, which the worker's collector never lists).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

from torch.utils.data import get_worker_info

from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader
from lerobot_nodes.loader import shutdown_dataloader
from lerobot_nodes.sources.s3_session import shared_session


def parsed_before_the_fork() -> bool:
    service_model = shared_session().get_component("data_loader").load_service_model("s3", "service-2")
    return id(service_model) not in {id(obj) for obj in gc.get_objects()}


class RecordWorker:
    """``worker_init_fn``: makes the worker's S3 client and writes what it was made from."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        assert info is not None
        fs = info.dataset.source.fs
        fs.connect()  # the client s3fs makes at the worker's first read
        seen = {"shared_session": fs.session is shared_session(), "parsed_before_the_fork": parsed_before_the_fork()}
        (self.out / f"worker-{worker_id}.json").write_text(json.dumps(seen))


def main() -> None:
    root, out = sys.argv[1], Path(sys.argv[2])
    dataset = StreamingLeRobotDataset(root=root, return_uint8=True, seed=3)
    loader = streaming_dataloader(dataset, batch_size=4, num_workers=2, worker_init_fn=RecordWorker(out))
    try:
        batches = sum(1 for _ in zip(range(2), loader, strict=False))
    finally:
        shutdown_dataloader(loader)
    workers = [json.loads(path.read_text()) for path in sorted(out.glob("worker-*.json"))]
    trainer = {"shared_session": dataset.source.fs.session is shared_session(), "batches": batches}
    print(json.dumps({"trainer": trainer, "workers": workers}))


if __name__ == "__main__":
    main()
