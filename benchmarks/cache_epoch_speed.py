"""Samples/s of later epochs from the loopback Hub with the disk byte cache warm, against a local folder.

The same two datasets as ``cache_epochs.py`` (AV1 ``g=2`` and H.264 GOP 30 with B-frames,
several MP4 and data files). For each, one driver process (``drivers/epochs_driver.py``) builds
two loaders of this project with the same seed, window and options: one streaming from a
loopback Hub with ``--latency-ms`` added to every answer (``repo_id`` only; the disk byte cache
at its default, on), one reading the dataset's folder (``root=``). Their epochs alternate in
that one process tree (hub, local, local, hub, ...), so the load of other jobs on the machine
falls on both. Epoch 1 of the Hub loader fills its cache; epochs 2.. are read from it.

    python benchmarks/cache_epoch_speed.py                                  # both datasets, 2 workers
    python benchmarks/cache_epoch_speed.py --episodes 40 --height 240 --width 320 --video-file-mb 4 --runs 2

Per loader and epoch: samples/s of the whole epoch (``iter()`` to its end, what training
waits), CPU ms per sample of the driver's whole process tree (workers included; the Hub runs
in this process, outside it), and the requests the Hub answered during that epoch. Then the
ratio hub / local of samples/s for epoch 2 and for the median of epochs 2..N (target >= 0.95).

``--read-timing`` instead runs both loaders in this process with ``num_workers=0`` and reports the
thread CPU spent in the sources' reads during epoch 2 (the Hub's go through the disk cache): what
the cache's read path costs against reading the folder.

    python benchmarks/cache_epoch_speed.py --read-timing --episodes 16 --height 240 --width 320 --video-file-mb 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cache_epochs  # noqa: E402  (the datasets, the driver runner and the request classes)

OUR_PYTHON = Path(sys.executable)
LOADERS = ("hub", "local")


def measure(root: Path, args: argparse.Namespace, first: str) -> list[dict[str, Any]]:
    """One driver process: both loaders, ``args.epochs`` epochs each, ``first`` starting."""
    from lerobot_nodes.testing.hub import LoopbackHub

    specs = {
        "hub": {"name": "hub", "kind": "nodes", "repo_id": cache_epochs.REPO, "root": None},
        "local": {"name": "local", "kind": "nodes", "repo_id": "local/cache-epochs", "root": str(root)},
    }
    order = [first, *(name for name in LOADERS if name != first)]
    config = {
        "loaders": [specs[name] for name in order],
        "delta_timestamps": cache_epochs.WINDOW,
        "num_workers": args.workers,
        "batch_size": args.batch_size,
        "seed": 3,
        "epochs": args.epochs,
        "camera_key": cache_epochs.CAMERAS[0],
        "streaming": {"streaming_episode_pool_size": 4},
    }
    with (
        tempfile.TemporaryDirectory(prefix="cache-epoch-speed-") as home,
        LoopbackHub(latency_s=args.latency_ms / 1000) as hub,
    ):
        hub.add_dataset(cache_epochs.REPO, root)
        return cache_epochs.drive_epochs(
            OUR_PYTHON, config, cache_epochs.hub_env(Path(home), hub.endpoint), hub
        )


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def rate(epochs: list[dict[str, Any]], loader: str, only: int | None) -> tuple[float, float]:
    """Median samples/s and CPU ms/sample of ``loader``'s epoch ``only`` (``None``: of its epochs 2..)."""
    rows = [r for r in epochs if r["loader"] == loader and r["epoch"] >= 2 and only in (None, r["epoch"])]
    return (
        median([r["samples"] / r["wall_s"] for r in rows]),
        median([1000 * r["cpu_s"] / r["samples"] for r in rows]),
    )


def read_timing(root: Path, args: argparse.Namespace) -> None:
    """``--read-timing``: in this process (``num_workers=0``), the thread CPU and wall time spent in the
    sources' reads (the Hub's through the disk cache) during epoch 2 of each loader, printed per source."""
    import threading
    import time

    from lerobot_nodes import StreamingConfig, StreamingLeRobotDataset, streaming_dataloader
    from lerobot_nodes.sources.base import ByteSource
    from lerobot_nodes.testing.hub import LoopbackHub

    spent: dict[str, list[float]] = {}
    lock = threading.Lock()

    def timed(name: str) -> None:
        read = getattr(ByteSource, name)

        def wrapper(self: ByteSource, *args: Any, **kwargs: Any) -> Any:
            cpu, wall = time.thread_time(), time.perf_counter()
            out = read(self, *args, **kwargs)
            with lock:
                row = spent.setdefault(type(self).__name__, [0, 0.0, 0.0])
                row[0] += 1
                row[1] += time.thread_time() - cpu
                row[2] += time.perf_counter() - wall
            return out

        setattr(ByteSource, name, wrapper)

    timed("read_ranges")
    timed("read_file")
    config = StreamingConfig(streaming_episode_pool_size=4)
    with (
        tempfile.TemporaryDirectory(prefix="cache-epoch-speed-") as home,
        LoopbackHub(latency_s=args.latency_ms / 1000) as hub,
    ):
        os.environ.update(cache_epochs.hub_env(Path(home), hub.endpoint))
        hub.add_dataset(cache_epochs.REPO, root)
        options = {"delta_timestamps": cache_epochs.WINDOW, "seed": 3, "return_uint8": True, "config": config}
        loaders = {
            "hub": streaming_dataloader(
                StreamingLeRobotDataset(cache_epochs.REPO, **options), args.batch_size, 0
            ),
            "local": streaming_dataloader(
                StreamingLeRobotDataset("local/cache-epochs", root=str(root), **options), args.batch_size, 0
            ),
        }
        for loader in loaders.values():
            for _ in loader:  # epoch 1 (fills the Hub loader's cache)
                pass
        for name, loader in loaders.items():
            spent.clear()
            cpu, wall = time.process_time(), time.perf_counter()
            samples = sum(len(batch["frame_index"]) for batch in loader)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            for source, (calls, read_cpu, read_wall) in spent.items():
                print(
                    f"| {root.name} | {name} | {samples} | {cpu:.2f} | {source} | {calls:.0f} | "
                    f"{1000 * read_cpu:.0f} | {1000 * read_wall:.0f} |",
                    flush=True,
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--codecs", nargs="+", default=list(cache_epochs.CODECS), choices=list(cache_epochs.CODECS)
    )
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--length", type=int, default=90, help="frames per episode (about)")
    parser.add_argument("--height", type=int, default=192)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--video-file-mb", type=float, default=1.0, help="MP4 rollover size")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--epochs", type=int, default=4, help="epochs per loader and run (2.. are the warm ones)"
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="driver processes per dataset, alternating which loader starts"
    )
    parser.add_argument(
        "--latency-ms", type=float, default=30.0, help="added by the loopback Hub to every answer"
    )
    parser.add_argument(
        "--read-timing",
        action="store_true",
        help="instead: time the sources' reads of epoch 2 in this process (num_workers=0)",
    )
    args = parser.parse_args(argv)
    os.environ.pop("HF_HUB_OFFLINE", None)
    if args.read_timing:
        print(
            "| dataset | loader | samples | process CPU s | source | reads | read thread CPU ms | read wall ms |"
        )
        print("|---|---|---:|---:|---|---:|---:|---:|")
        with tempfile.TemporaryDirectory(prefix="cache-epoch-speed-data-") as scratch:
            for codec in args.codecs:
                root = cache_epochs.make_dataset(
                    Path(scratch) / codec,
                    codec,
                    args.episodes,
                    args.length,
                    args.height,
                    args.width,
                    args.video_file_mb,
                )
                read_timing(root, args)
        return 0
    print(
        f"<!-- {args.workers} workers, batch {args.batch_size}, {args.epochs} epochs x {args.runs} runs, "
        f"Hub latency {args.latency_ms:g} ms -->"
    )
    print(
        "| dataset | loader | run | epoch | samples | s | samples/s | CPU ms/sample | requests (API/resolve/CDN) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    summary = []
    with tempfile.TemporaryDirectory(prefix="cache-epoch-speed-data-") as scratch:
        for codec in args.codecs:
            root = cache_epochs.make_dataset(
                Path(scratch) / codec,
                codec,
                args.episodes,
                args.length,
                args.height,
                args.width,
                args.video_file_mb,
            )
            epochs: list[dict[str, Any]] = []
            for run in range(args.runs):
                for row in measure(root, args, LOADERS[run % 2]):
                    if row["phase"] == "open":
                        continue
                    row["run"], row["epoch"] = run, int(row["phase"].split()[1])
                    epochs.append(row)
                    print(
                        f"| {codec} | {row['loader']} | {run} | {row['epoch']} | {row['samples']} | "
                        f"{row['wall_s']:.1f} | {row['samples'] / row['wall_s']:.1f} | "
                        f"{1000 * row['cpu_s'] / row['samples']:.2f} | "
                        f"{row['api']}/{row['resolve']}/{row['other']} |",
                        flush=True,
                    )
            for label, only in (("epoch 2", 2), (f"epochs 2-{args.epochs} (median)", None)):
                (hub_rate, hub_cpu), (local_rate, local_cpu) = (
                    rate(epochs, "hub", only),
                    rate(epochs, "local", only),
                )
                summary.append(
                    f"| {codec} | {label} | {hub_rate:.1f} | {local_rate:.1f} | "
                    f"**{hub_rate / local_rate:.3f}** | {hub_cpu:.2f} | {local_cpu:.2f} |"
                )
    print()
    print(
        "| dataset | epochs | hub samples/s (cache warm) | local samples/s | hub / local | hub CPU ms/sample | "
        "local CPU ms/sample |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
