"""Stream two batches of an ``s3://`` root with 2 workers; print what each process read it with.

Usage: python s3_native_run.py S3_ROOT OUT_DIR (the environment points the S3 client at the server).

Prints one JSON line: for the training process and each worker (read in ``worker_init_fn``, and
again after the batches for the training process), the dataset source's class and which of the
s3fs stack's modules the process has imported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from torch.utils.data import get_worker_info

from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader
from lerobot_nodes.loader import shutdown_dataloader

S3FS_STACK = ("s3fs", "aiobotocore", "aiohttp", "botocore")


def seen(source: object) -> dict[str, object]:
    return {"source": type(source).__name__, "imported": sorted(name for name in S3FS_STACK if name in sys.modules)}


class RecordWorker:
    """``worker_init_fn``: writes what the worker reads the store with."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        assert info is not None
        (self.out / f"worker-{worker_id}.json").write_text(json.dumps(seen(info.dataset.source)))


def main() -> None:
    root, out = sys.argv[1], Path(sys.argv[2])
    dataset = StreamingLeRobotDataset(root=root, return_uint8=True, seed=3)
    loader = streaming_dataloader(dataset, batch_size=4, num_workers=2, worker_init_fn=RecordWorker(out))
    try:
        batches = sum(1 for _ in zip(range(2), loader, strict=False))
    finally:
        shutdown_dataloader(loader)
    workers = [json.loads(path.read_text()) for path in sorted(out.glob("worker-*.json"))]
    print(json.dumps({"trainer": {**seen(dataset.source), "batches": batches}, "workers": workers}))


if __name__ == "__main__":
    main()
