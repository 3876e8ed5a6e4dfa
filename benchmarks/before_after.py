"""Loader A before and after a change: the same loop, another checkout of the package first on PYTHONPATH.

    /work/venv/bin/python benchmarks/before_after.py --before-src /path/to/old/checkout/src

Alternates before/after runs (``--runs`` each, median shown) with 0 and 2 workers; each run
builds ``StreamingLeRobotDataset`` + ``streaming_dataloader`` (batch 32; ``--window`` as
benchmarks/run.py builds it, ACT by default) and reports the first batch (from before the dataset is built; the
forkserver is started first where the checkout has ``start_worker_context``), samples/s over
the ``--batches`` batches after it and the CPU those batches took per sample (the training process and
its DataLoader workers, ``_driver_common.tree_cpu``). ``--after-src`` runs a copy of the new code (so the checkout
can change while the runs go on); by default the installed package. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "drivers"))  # the drivers' shared helpers

DEFAULT_ROOT = "/work/shared/datasets/lerobot-writer-small"


def window_of(root: str, window: str) -> dict[str, list[float]] | None:
    """``delta_timestamps`` of ``window`` for the dataset at ``root``, as benchmarks/run.py builds them."""
    from _driver_common import delta_timestamps

    info = json.loads((Path(root) / "meta" / "info.json").read_text())
    cameras = [key for key, spec in info["features"].items() if spec.get("dtype") == "video"]
    return delta_timestamps(window, info["fps"], cameras, info["features"])


def child(root: str, workers: int, batches: int, window_name: str) -> None:
    import _driver_common as common

    from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader
    from lerobot_nodes.loader import shutdown_dataloader

    window = window_of(root, window_name)
    started = time.perf_counter()
    if workers:
        try:
            from lerobot_nodes.loader import start_worker_context
        except ImportError:  # a checkout from before it existed
            pass
        else:
            start_worker_context()
    dataset = StreamingLeRobotDataset(
        "local/x", root=root, delta_timestamps=window, max_num_shards=max(1, workers), seed=1000, return_uint8=True
    )
    loader = streaming_dataloader(dataset, 32, workers)
    iterator = iter(loader)
    next(iterator)
    first = time.perf_counter()
    cpu_before = common.tree_cpu(os.getpid())
    for _ in range(batches):
        next(iterator)
    done = time.perf_counter()
    cpu = common.tree_cpu(os.getpid()) - cpu_before
    shutdown_dataloader(loader)
    dataset.close()
    record = {
        "first_batch_s": first - started,
        "samples_per_s": batches * 32 / (done - first),
        "cpu_ms_per_sample": cpu / (batches * 32) * 1e3,
    }
    print(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before-src", required=False, help="the old checkout's src/ directory")
    parser.add_argument("--root", default=DEFAULT_ROOT)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--after-src", help="a copy of the new checkout's src/ (default: the installed package)")
    parser.add_argument("--window", choices=("none", "act", "diffusion"), default="act")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]), args.child[3])
        return
    if not args.before_src:
        parser.error("--before-src is required")
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for _ in range(args.runs):
        for label, src in (("before", args.before_src), ("after", args.after_src)):
            for workers in (0, 2):
                env = dict(os.environ)
                if src:
                    env["PYTHONPATH"] = src
                command = [sys.executable, __file__, "--child", args.root, str(workers), str(args.batches), args.window]
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                record = json.loads(out.stdout.strip().splitlines()[-1])
                results.setdefault((label, workers), []).append(record)
                print(label, workers, record, file=sys.stderr, flush=True)
    print(
        "| workers | samples/s before | samples/s after | after / before | CPU ms/sample before | CPU ms/sample after "
        "| first batch s before | first batch s after |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for workers in (0, 2):
        before, after = results[("before", workers)], results[("after", workers)]
        rate_b = statistics.median(r["samples_per_s"] for r in before)
        rate_a = statistics.median(r["samples_per_s"] for r in after)
        first_b = statistics.median(r["first_batch_s"] for r in before)
        first_a = statistics.median(r["first_batch_s"] for r in after)
        cpu_b = statistics.median(r["cpu_ms_per_sample"] for r in before)
        cpu_a = statistics.median(r["cpu_ms_per_sample"] for r in after)
        print(
            f"| {workers} | {rate_b:.0f} | {rate_a:.0f} | {rate_a / rate_b:.2f}x | {cpu_b:.2f} | {cpu_a:.2f} "
            f"| {first_b:.2f} | {first_a:.2f} |"
        )


if __name__ == "__main__":
    main()
