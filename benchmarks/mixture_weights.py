"""Weighted against default mixture: samples/s, CPU per sample and the proportions each achieves.

The two LeRobot-written test datasets (AV1 380 frames, H.264 414 frames) and a generated AV1 one
(58 frames, the shape of the others), one ``StreamingLeRobotDataset`` each side, ``num_workers=0``
(the graph runs in the measuring process, so ``time.process_time`` is its CPU), batches of 8, the
ACT-like window of tests/test_mixture.py. The sides alternate (default, weighted, default, ...).

    python -m benchmarks.mixture_weights --samples 2400 --rounds 2
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
        root=roots, weights=weights, seed=5, return_uint8=True,
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2400)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        generated = write_dataset(
            Path(folder) / "gen", episode_lengths=[16, 9, 21, 12], cameras=("observation.images.top", "observation.images.wrist"),
            height=96, width=128, state_dim=14, action_dim=14, seed=4,
        )
        roots = [generated, DATA / "lerobot-writer-tiny-av1", DATA / "lerobot-writer-tiny-h264"]
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
