"""What ``--dataset.streaming_bad_episodes=skip`` costs at open, next to ``raise``, by rank count.

A dataset of many small MP4s (``lerobot_nodes.testing.many_files.write_files_dataset``: one MP4 per
episode and camera, one data Parquet) is opened as ``StreamingLeRobotDataset`` by rank 0 of
``--world-sizes`` ranks, with a warm MP4 index cache (a first open of every file fills it). Both
policies run on the healthy dataset, alternating within each repeat so that load from other work on
the machine does not bias the ratio; then ``skip`` on a copy with ``--delete`` MP4s deleted (spread
over the episodes), where ``raise`` stops at the first. Each open runs in this process; wall and CPU
seconds (``time.process_time``, all threads) are the medians over ``--repeats``.

    python benchmarks/bad_episodes_open.py --files 4000 --world-sizes 1 8 --repeats 3
"""

from __future__ import annotations

import argparse
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
from lerobot_nodes.testing.many_files import FILES_CAMERAS, write_files_dataset  # noqa: E402


def open_once(root: Path, policy: str, world_size: int) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    dataset = StreamingLeRobotDataset(
        root=root, rank=0, world_size=world_size, config=StreamingConfig(streaming_bad_episodes=policy)
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    skipped = len(dataset.skipped)
    dataset.counters.close()
    return wall, cpu, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--delete", type=int, default=40, help="MP4s deleted in the damaged copy")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bad-episodes-open-"))
    os.environ["HF_LEROBOT_HOME"] = str(work / "home")
    try:
        healthy = write_files_dataset(work / "healthy", args.files)
        damaged = Path(shutil.copytree(healthy, work / "damaged"))
        episodes = args.files // len(FILES_CAMERAS)
        step = max(1, episodes // args.delete)
        for episode in range(0, episodes, step)[: args.delete]:
            chunk, file = divmod(episode, 1000)
            (damaged / f"videos/{FILES_CAMERAS[0]}/chunk-{chunk:03d}/file-{file:03d}.mp4").unlink()
        open_once(healthy, "skip", 1)  # fills the index cache of every file
        open_once(damaged, "skip", 1)
        print(f"{args.files} MP4 files, {episodes} episodes; {args.delete} MP4s deleted in the damaged copy; "
              f"median of {args.repeats}")  # fmt: skip
        print("| ranks | dataset | policy | open wall s | open CPU s | skipped |")
        print("|---|---|---|---|---|---|")
        for world_size in args.world_sizes:
            runs: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
            for repeat in range(args.repeats):
                sides = [("healthy", "raise"), ("healthy", "skip")]
                for name, policy in sides if repeat % 2 == 0 else sides[::-1]:
                    runs.setdefault((name, policy), []).append(open_once(healthy, policy, world_size))
                runs.setdefault(("damaged", "skip"), []).append(open_once(damaged, "skip", world_size))
            for (name, policy), found in runs.items():
                wall = statistics.median(r[0] for r in found)
                cpu = statistics.median(r[1] for r in found)
                print(f"| {world_size} | {name} | {policy} | {wall:.3f} | {cpu:.3f} | {found[0][2]} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
