"""What ``--dataset.streaming_bad_episodes=skip`` costs while streaming, next to ``raise``.

With ``skip`` the graph has one node more (``nodes.bad_episode_filter``), the decode step marks a
failed sample instead of raising, and the ordered buffer snapshots its state after every sample
instead of every batch (dropped samples move the batch boundaries). This script streams a healthy
dataset with both policies and a damaged copy (16 bytes over one frame's picture data,
``testing.damage.damage_frame``, which ``raise`` stops at) with ``skip``, in a rotating order within
each repeat so that load from other work on the machine falls on each. Every run is in this process
with no DataLoader workers, so CPU seconds (``time.process_time``, all threads) hold all the work.
Medians over ``--repeats``.

    python benchmarks/bad_episodes_decode.py --root /work/shared/datasets/lerobot-writer-small --batches 400 --repeats 3
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from lerobot_nodes.config import StreamingConfig  # noqa: E402
from lerobot_nodes.dataset import StreamingLeRobotDataset  # noqa: E402
from lerobot_nodes.loader import streaming_dataloader  # noqa: E402
from lerobot_nodes.testing.damage import damage_frame  # noqa: E402

BATCH_SIZE = 32


def stream_once(root: Path, policy: str, batches: int) -> tuple[float, float, int, int]:
    """Wall and CPU seconds per sample over ``batches`` batches (after the first), samples, samples dropped."""
    dataset = StreamingLeRobotDataset(root=root, seed=1000, return_uint8=True,
                                      config=StreamingConfig(streaming_bad_episodes=policy))  # fmt: skip
    loader = streaming_dataloader(dataset, BATCH_SIZE, 0)
    samples, wall, cpu = 0, 0.0, 0.0
    iterator = iter(loader)
    next(iterator)  # the first batch carries the open's one-off work
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        try:
            batch = next(iterator)
        except StopIteration:
            break
        samples += len(batch["index"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    dropped = dataset.metrics.report().bad_samples_dropped
    dataset.close()
    return wall / samples, cpu / samples, samples, dropped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="a healthy LeRobot v3 dataset")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--damaged-episode", type=int, default=1)
    parser.add_argument("--damaged-frame", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    work = Path(tempfile.mkdtemp(prefix="bad-episodes-decode-"))
    os.environ["HF_LEROBOT_HOME"] = str(work / "home")
    try:
        damaged = Path(shutil.copytree(args.root, work / "damaged"))
        camera = next(p.name for p in sorted((damaged / "videos").iterdir()))
        damage_frame(damaged, args.damaged_episode, camera, args.damaged_frame)
        stream_once(args.root, "raise", 2)  # fills the MP4 index cache
        runs = {"raise": (args.root, "raise"), "skip": (args.root, "skip"), "skip, damaged": (damaged, "skip")}
        results: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in runs}
        for repeat in range(args.repeats):
            names = list(runs)
            for name in names[repeat % 3 :] + names[: repeat % 3]:  # each run first, second and third in turn
                results[name].append(stream_once(*runs[name], args.batches))
        print(f"{args.root} ({args.batches} batches of {BATCH_SIZE}, 0 workers, median of {args.repeats})")
        print("| policy | dataset | ms per sample (wall) | CPU ms per sample | samples | samples dropped |")
        print("|---|---|---|---|---|---|")
        for name, runs in results.items():
            policy, _, which = name.partition(", ")
            wall = statistics.median(r[0] for r in runs) * 1000
            cpu = statistics.median(r[1] for r in runs) * 1000
            print(f"| {policy} | {which or 'healthy'} | {wall:.2f} | {cpu:.2f} | {runs[0][2]} | {runs[0][3]} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
