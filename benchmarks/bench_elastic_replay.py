"""Benchmark of elastic resume planning (issue 14): replaying an old topology's schedules, no I/O.

A resume in another topology recomputes what every old rank delivered: each old worker's pool
sampler is replayed to its checkpoint offset with the sampler's own code
(``EpisodePoolSampler.state_after``), then the remnant is collected and split over the new
ranks and workers. Nothing is fetched or decoded, so this is all the extra start-up a rank pays.

Dataset: 1,000,000 frames in 10,000 episodes (lengths 50..150, seeded), no byte costs (the
MP4-index cost lookup is metadata; a budgeted replay adds one index lookup per episode).
Old run: 2 ranks x 4 workers, batch size 8, default pool (32 per rank). New run: 3 ranks x 3 workers.
Checkpoints at 25 %, 50 % and 95 % of the epoch. Run from the repository root::

    /work/venv/bin/python benchmarks/bench_elastic_replay.py --output benchmarks/elastic_results.md
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.nodes import EpisodePoolSampler, RankWorkerSharder
from lerobot_nodes.nodes.sharder import rank_worker_split
from lerobot_nodes.resume.planning import (
    StepCheckpoint,
    Topology,
    assign_remnant,
    remnant_of,
    replay_checkpoint,
)

EPISODES = 10_000
SEED = 1000


def lengths(total_frames: int) -> list[int]:
    """10,000 episode lengths around 100 frames summing to exactly ``total_frames``."""
    drawn = np.random.default_rng(7).integers(50, 151, size=EPISODES)
    drawn = np.maximum(1, np.floor(drawn * total_frames / drawn.sum())).astype(int)
    drawn[: total_frames - int(drawn.sum())] += 1  # floor lost less than one frame per episode
    return [int(n) for n in drawn]


def factory(episodes: list[int], episode_lengths: list[int], world_size: int, strategy: str):
    config = StreamingConfig(streaming_sampling_strategy=strategy)

    @functools.cache
    def split(rank: int, num_workers: int) -> list[list[int]]:
        return rank_worker_split(episodes, episode_lengths, rank, world_size, num_workers, SEED)

    def make(rank: int, worker_id: int, num_workers: int) -> EpisodePoolSampler:
        # As StreamingLeRobotDataset's replay factory: the rank's split computed once, then each worker's part.
        sharder = RankWorkerSharder(
            episodes, episode_lengths, rank=rank, world_size=world_size, worker_id=worker_id,
            num_workers=num_workers, seed=SEED, assigned=split(rank, num_workers)[worker_id],
        )
        return EpisodePoolSampler(
            sharder, pool_size=config.worker_pool_size(worker_id, num_workers), strategy=strategy, seed=SEED
        )

    return make


def measure(fraction: float, strategy: str, episode_lengths: list[int], old: Topology, new: Topology, batch: int):
    episodes = list(range(EPISODES))
    make = factory(episodes, episode_lengths, old.world_size, strategy)
    # Steps per rank per epoch: the largest rank's batches (every rank's step count is the same).
    per_rank_frames = sum(episode_lengths) / old.world_size / old.parts
    step = int(fraction * old.parts * per_rank_frames / batch)
    wall, cpu = time.perf_counter(), time.process_time()
    positions = replay_checkpoint(StepCheckpoint(step, batch, old), make)
    replayed = time.perf_counter() - wall
    remnant = remnant_of(positions, dict(zip(episodes, episode_lengths, strict=True)))
    for worker in range(new.parts):  # one new rank: each of its workers takes its part
        assign_remnant(remnant, new, 0, worker, SEED)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    delivered = sum(p.samples for p in positions)
    assert delivered + remnant.num_frames == sum(episode_lengths)
    starts = [assign_remnant(remnant, new, r, w, SEED) for r in range(new.world_size) for w in range(new.parts)]
    assert sum(len(s.assigned or ()) for s in starts) == len(remnant.episodes)
    return step, delivered, replayed, wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--fractions", default="0.25,0.5,0.95")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    episode_lengths = lengths(args.frames)
    old, new, batch = Topology(2, 4), Topology(3, 3), 8
    load_before = os.getloadavg()[0]
    rows = []
    for strategy in ("remaining", "round_robin"):
        for fraction in (float(f) for f in args.fractions.split(",")):
            step, delivered, replayed, wall, cpu = measure(fraction, strategy, episode_lengths, old, new, batch)
            rows.append(
                f"| {strategy} | {fraction:.0%} | {step} | {delivered:,} | {replayed:.2f} | {wall:.2f} | {cpu:.2f} "
                f"| {wall / max(1, delivered) * 1e6:.1f} |"
            )
            print(rows[-1], flush=True)
    load_after = os.getloadavg()[0]
    report = "\n".join(
        [
            "# Elastic resume: replay of the old schedules",
            "",
            "Command: `/work/venv/bin/python benchmarks/bench_elastic_replay.py "
            "--output benchmarks/elastic_results.md`",
            "",
            f"Machine: {platform.machine()}, {os.cpu_count()} cores **shared with other engineers' jobs** (load average "
            f"{load_before:.1f} before, {load_after:.1f} after), Python {sys.version.split()[0]}, numpy {np.__version__}. "
            "One run: figures are upper bounds of what an idle core does.",
            "",
            f"{args.frames:,} frames in {EPISODES:,} episodes (50..150 frames), old run {old.describe()}, batch size "
            f"{batch}, default pool (32 per rank), resumed as {new.describe()}. Time = replay of every old worker to "
            "its offset (the pool sampler's own `state_after`, which fast-forwards with `fast_forward`) + remnant + "
            "the split for each worker of one new rank: what each new rank computes. No fetch, no decode. CPU s is "
            "the process CPU time of the same run: on a shared machine it is the better estimate of an idle core's "
            "wall time.",
            "",
            "| strategy | checkpoint at | step | samples replayed | replay s | total s (wall) | CPU s | µs per replayed sample |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    print(report)
    if args.output:
        args.output.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
