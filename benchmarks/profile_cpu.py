"""Where loader A's CPU goes per sample: py-spy samples of every thread of the loader and its
workers, bucketed by what the stack is doing.

    /work/venv/bin/python benchmarks/profile_cpu.py --workers 0 2 --batches 150 --rate 100 --out /tmp/profile.jsonl
    # the same for another checkout of the package (e.g. the commit before a change), side by side:
    /work/venv/bin/python benchmarks/profile_cpu.py --src /path/to/old/checkout/src --label before ...

A child process streams ``--batches`` batches of 32 (ACT window: action 50 future, cameras at
[0]) with ``streaming_dataloader``; ``py-spy record --subprocesses`` samples every thread that
is on a CPU (idle threads are not sampled) at ``--rate`` Hz. Each sample goes to the first
bucket its stack matches (``BUCKETS``, most specific first). CPU ms per sample = a bucket's
samples / rate / delivered samples. Imports and process start are listed apart and left out
of the per-sample total.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

DEFAULT_ROOT = "/work/shared/datasets/lerobot-writer-small"
PY_SPY = str(Path(sys.executable).with_name("py-spy"))

BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    ("imports and process start", ("_find_and_load", "_serve_one (forkserver", "spawn_main", "_fixup_main")),
    ("video decode (codec)", ("ClipDecoder._send",)),
    ("RGB conversion", ("RgbConverter", "rgb24 (", "_CachedFrame.convert", "frames_to_tensor")),
    ("frame lookup and decoder bookkeeping", ("ClipDecoder.", "DecoderLRU.", "DecodedFrameBudget.")),
    ("sample assembly (rows, windows, pad masks)", ("assemble_sample", "SampleAssembler")),
    ("episode fetch (reads, Parquet, clip build)", ("EpisodeFetcher.", "fetch_and_report")),
    ("batch collation into shared memory", ("collate_into_one_storage", "default_collate", "collate (")),
    ("schedule and hand-off (sampler, prefetcher, buffer, threads)", (
        "EpisodePoolSampler.", "BytePrefetcher.", "OrderedBuffer.", "DecodeMapper.", "SampleBatcher.",
        "RankWorkerSharder.", "EpisodeByteCache.", "_WorkItem.run", "Future.",
    )),
    ("DataLoader and inter-process transfer", (
        "_worker_loop", "_next_data", "_try_get_data", "rebuild_storage", "reduce_storage", "_process_data",
        "Queue.", "ForkingPickler",
    )),
]


def child(args: argparse.Namespace) -> None:
    from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader
    from lerobot_nodes.loader import shutdown_dataloader

    try:
        from lerobot_nodes.loader import start_worker_context
    except ImportError:  # a checkout from before it existed
        start_worker_context = None

    info = json.loads((Path(args.root) / "meta" / "info.json").read_text())
    fps = info["fps"]
    cameras = [key for key, spec in info["features"].items() if spec.get("dtype") == "video"]
    window = {"action": [i / fps for i in range(50)], **{camera: [0.0] for camera in cameras}}
    if args.workers and start_worker_context is not None:
        start_worker_context()
    dataset = StreamingLeRobotDataset(
        "local/profile", root=args.root, delta_timestamps=window, max_num_shards=max(1, args.workers),
        seed=1000, return_uint8=True,
    )
    loader = streaming_dataloader(dataset, 32, args.workers)
    iterator = iter(loader)
    started = time.perf_counter()
    for _ in range(args.batches):
        next(iterator)
    elapsed = time.perf_counter() - started
    shutdown_dataloader(loader)
    dataset.close()
    print(json.dumps({"samples": 32 * args.batches, "seconds": elapsed}))


def bucket_of(stack: str) -> str:
    for name, markers in BUCKETS:
        if any(marker in stack for marker in markers):
            return name
    return "other"


def profile(args: argparse.Namespace, workers: int) -> dict:
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = args.src + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.txt"
        command = [
            PY_SPY, "record", "--subprocesses", "--rate", str(args.rate), "--format", "raw", "-o", str(raw), "--",
            sys.executable, __file__, "--child", "--root", args.root, "--workers", str(workers),
            "--batches", str(args.batches),
        ]
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        run = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
        counts: Counter[str] = Counter()
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            # Frames are "function (file:line)"; keep "function (file" to match on.
            counts[bucket_of(re.sub(r":\d+\)", ")", stack))] += int(count)
    samples = run["samples"]
    per_sample = {name: count / args.rate / samples * 1000 for name, count in counts.items()}
    return {"workers": workers, "label": args.label, "samples": samples, "samples_per_s": samples / run["seconds"],
            "cpu_ms_per_sample": per_sample}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=DEFAULT_ROOT)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--src", help="put this directory first on PYTHONPATH (another checkout's src/)")
    parser.add_argument("--label", default="current")
    parser.add_argument("--out", help="append the results (JSON lines) to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.workers = args.workers[0]
        child(args)
        return
    for workers in args.workers:
        record = profile(args, workers)
        print(json.dumps(record))
        if args.out:
            with open(args.out, "a") as out:
                out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
