"""Weighted against default mixture: samples/s, CPU per sample and the proportions each achieves.

The two LeRobot-written test datasets (AV1 380 frames, H.264 414 frames) and a generated AV1 one
(58 frames, the shape of the others), one ``StreamingLeRobotDataset`` each side, ``num_workers=0``
(the graph runs in the measuring process, so ``time.process_time`` is its CPU), batches of 8, the
ACT-like window of tests/mixture/helpers.py. The sides alternate (default, weighted, default, ...).

    python -m benchmarks.mixture_weights --samples 2400 --rounds 2

``--schedule`` measures the logical schedule alone (the graph's own pool sampler over the sharder, no
fetch or decode): CPU per anchor on each side, and the weighted shares after 2400, 10000 and 41400
anchors (10 epochs of the 0.1-weighted H.264 dataset).
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.loader import streaming_dataloader
from lerobot_nodes.testing import write_dataset

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
WEIGHTS = [0.6, 0.3, 0.1]


def run(roots: list[Path], weights: list[float] | None, samples: int) -> dict[str, float]:
    dataset = StreamingLeRobotDataset(
        root=roots, weights=weights, seed=5, return_uint8=True,  # the run's own options (a window, uint8)
        delta_timestamps={"action": [0.0, 1 / 30, 2 / 30]},
        config=StreamingConfig(streaming_episode_pool_size=8),
    )
    counts: collections.Counter[int] = collections.Counter()
    wall, cpu = time.perf_counter(), time.process_time()
    loader = streaming_dataloader(dataset, batch_size=8, num_workers=0)
    iterator = iter(loader)
    while sum(counts.values()) < samples:
        try:
            batch = next(iterator)
        except StopIteration:
            iterator = iter(loader)
            continue
        counts.update(batch["dataset_index"].tolist())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    total = sum(counts.values())
    dataset.close()
    return {"samples": total, "wall": wall, "cpu": cpu, **{f"share{d}": counts[d] / total for d in range(len(roots))}}


def open_mixture(roots: list[Path], weights: list[float] | None) -> StreamingLeRobotDataset:
    return StreamingLeRobotDataset(root=roots, weights=weights, seed=5, config=StreamingConfig(streaming_episode_pool_size=8))


def schedule(roots: list[Path], rounds: int) -> None:
    print("| side | anchors | CPU us/anchor | episodes admitted |")
    print("|---|---:|---:|---:|")
    for _ in range(rounds):
        for name, weights in (("default", None), ("weights [0.6,0.3,0.1]", WEIGHTS)):
            sampler = open_mixture(roots, weights)._rank_schedule().samplers(1)(0, 0, 0)
            sampler.reset(None)
            done, admitted, cpu = 0, 0, time.process_time()
            while done < 20000:
                try:
                    next(sampler)
                except StopIteration:  # the default side's epoch (852 anchors) ended
                    admitted += sampler.source.cursor
                    sampler.reset(None)
                    continue
                done += 1
            cpu = time.process_time() - cpu
            print(f"| {name} | {done} | {1e6 * cpu / done:.1f} | {admitted + sampler.source.cursor} |")
    dataset = open_mixture(roots, WEIGHTS)
    sampler = dataset._rank_schedule().samplers(1)(0, 0, 0)
    sampler.reset(None)
    counts: collections.Counter[int] = collections.Counter()
    print("\n| anchors | shares [gen, av1, h264] | dataset epochs begun - 1 |")
    print("|---:|---|---|")
    for stop in (2400, 10000, 41400):
        while sum(counts.values()) < stop:
            counts[dataset.meta.part_of(next(sampler).episode)[0]] += 1  # type: ignore[attr-defined]
        shares = ", ".join(f"{counts[d] / stop:.4f}" for d in range(3))
        print(f"| {stop} | {shares} | {sampler.source.dataset_epochs} |")  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--schedule", action="store_true", help="the logical schedule alone (no fetch, no decode)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        generated = write_dataset(
            Path(folder) / "gen", episode_lengths=[16, 9, 21, 12], cameras=("observation.images.top", "observation.images.wrist"),
            height=96, width=128, state_dim=14, action_dim=14, seed=4,
        )
        roots = [generated, DATA / "lerobot-writer-tiny-av1", DATA / "lerobot-writer-tiny-h264"]
        if args.schedule:
            schedule(roots, args.rounds)
            return
        print("| side | samples | wall s | CPU s | samples/s (wall) | CPU ms/sample | shares [gen 58, av1 380, h264 414 frames] |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for _ in range(args.rounds):
            for name, weights in (("default", None), ("weights [0.6,0.3,0.1]", WEIGHTS)):
                row = run(roots, weights, args.samples)
                shares = ", ".join(f"{row[f'share{d}']:.3f}" for d in range(3))
                print(f"| {name} | {row['samples']:.0f} | {row['wall']:.2f} | {row['cpu']:.2f} | "
                      f"{row['samples'] / row['wall']:.0f} | {1000 * row['cpu'] / row['samples']:.2f} | {shares} |")


if __name__ == "__main__":
    main()
