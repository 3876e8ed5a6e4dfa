"""Batch mixing vs decoded-frame memory vs samples/s (issue 24).

For each dataset, each setting and each worker count, one fresh process streams ``--batches``
batches (ACT window: ``action`` over 50 frames, cameras at offset 0; batch 32; the epochs one after
another) through ``StreamingLeRobotDataset`` + ``streaming_dataloader``, reads one byte of every
page of each batch's camera frames (as a training step reads its batch: the pages of a batch that
crosses from a worker are mapped on first read), and prints one JSON line:
distinct episodes per batch and same-episode pairs within 5 frames / one GOP next to a uniform
shuffle of the same selection (``dataset.metrics.report().mixing``), steady samples/s (batches
2..N) and the process tree's CPU milliseconds per steady sample (the figure that survives a
loaded machine), decoded per delivered frame, the decoded frames kept (peak), the open anchor runs per episode
(``streaming_graph.open_anchor_runs``) and the peak RSS of the process tree (workers included,
sampled every 50 ms).

Settings: ``today`` (one open run: the schedule before issue 24, forced with ``MAX_OPEN_RUNS = 1``),
``pairs`` (``streaming_gop_runs=false``), ``per_worker`` (the defaults but
``streaming_batches_across_workers=false``: each batch from one worker, the loader before), ``round_robin``
(the defaults but ``streaming_sampling_strategy=round_robin``), ``budget_runs`` (the defaults but the open-runs rule
before ``batch_open_runs``: as many runs as the budget holds, as a checkpoint of those versions resumes), and the open-run counts the decoded-frame budget gives
(``--budgets``, MB per rank; ``default`` is 1024), and ``poolN``: the defaults with
``streaming_episode_pool_size=N`` episodes per rank (the default is 32). Datasets are written by
``lerobot_nodes.testing.write_dataset`` under ``--data`` (see :func:`ensure_datasets`).

    python benchmarks/mixing_curve.py --batches 120 --out /work/bench-data/mixing/curve.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("LRN_BENCH_DATA", "/work/bench-data")) / "mixing"
CAMERAS_3 = ("observation.images.top", "observation.images.wrist", "observation.images.side")
RECIPES: dict[str, dict[str, Any]] = {
    # LeRobot's AV1 (g=2), 16 episodes of 20..80 frames, 2 cameras, several video files.
    "av1-g2": {
        "num_episodes": 16,
        "cameras": CAMERAS_3[:2],
        "height": 240,
        "width": 320,
        "codec": "av1",
        "video_files_size_in_mb": 1.0,
        "seed": 1,
    },
    # libx264 defaults (GOP 30, B-frames), 3 cameras 480x640, 6 episodes of 90 frames, several files.
    "h264-g30": {
        "episode_lengths": [90] * 6,
        "cameras": CAMERAS_3,
        "height": 480,
        "width": 640,
        "codec": "h264",
        "video_files_size_in_mb": 2.0,
        "seed": 0,
    },
    # libx265 with B-frames at GOP 60, 3 cameras 480x640, 8 episodes of 120 frames, several files.
    "hevc-g60": {
        "episode_lengths": [120] * 8,
        "cameras": CAMERAS_3,
        "height": 480,
        "width": 640,
        "codec": "hevc",
        "gop": 60,
        "video_files_size_in_mb": 2.0,
        "seed": 2,
    },
    # libx264 with B-frames at GOP 60, 2 cameras 240x320, 24 episodes of 60..180 frames, several files.
    "h264-g60": {
        "episode_lengths": [60 + 5 * (i % 25) for i in range(24)],
        "cameras": CAMERAS_3[:2],
        "height": 240,
        "width": 320,
        "codec": "h264",
        "gop": 60,
        "video_files_size_in_mb": 1.0,
        "seed": 3,
    },
    # Many short episodes (a pool holds a small share of them, as on DROID-sized datasets): LeRobot's
    # AV1 (g=2), 400 episodes of 30 frames, 2 cameras 96x128, several files.
    "av1-many": {
        "episode_lengths": [30] * 400,
        "cameras": CAMERAS_3[:2],
        "height": 96,
        "width": 128,
        "codec": "av1",
        "video_files_size_in_mb": 0.5,
        "seed": 4,
    },
    # Many episodes of larger frames with B-frames: libx264 GOP 30, 160 episodes of 60 frames, 3 cameras 240x320.
    "h264-many": {
        "episode_lengths": [60] * 160,
        "cameras": CAMERAS_3,
        "height": 240,
        "width": 320,
        "codec": "h264",
        "video_files_size_in_mb": 4.0,
        "seed": 6,
    },
}
# av1-many at 2,000 episodes: the pool's drain at an epoch's end is ~3 % of the epoch instead of 16 %.
RECIPES["av1-many2k"] = {**RECIPES["av1-many"], "episode_lengths": [30] * 2000, "video_files_size_in_mb": 2.0}


def ensure_datasets(names: list[str]) -> dict[str, Path]:
    from lerobot_nodes.testing import write_dataset

    roots = {}
    for name in names:
        root = DATA / name
        if not (root / "meta" / "info.json").is_file():
            write_dataset(root, **RECIPES[name])
        roots[name] = root
    return roots


def tree_rss(root: int) -> int:
    sys.path.insert(0, str(HERE / "drivers"))
    import _driver_common as common

    total = 0
    for pid in common.process_tree(root):
        try:
            with open(f"/proc/{pid}/status") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def run_one(config: dict[str, Any]) -> dict[str, Any]:
    """One measured run in this process (see the module)."""
    import lerobot_nodes.streaming_graph as streaming_graph
    from lerobot_nodes import StreamingConfig, StreamingLeRobotDataset, streaming_dataloader
    from lerobot_nodes.format.meta import DatasetMeta  # noqa: F401  (imported for the workers' fork)
    from lerobot_nodes.loader import start_worker_context
    from lerobot_nodes.sample.assemble import SampleSpec

    sys.path.insert(0, str(HERE / "drivers"))
    import _driver_common as common

    if config["setting"] == "today":
        streaming_graph.MAX_OPEN_RUNS = 1  # before start_worker_context: its workers fork from here
    flags: dict[str, Any] = {}
    if config["setting"] == "pairs":
        flags["streaming_gop_runs"] = False
    if config["setting"] == "per_worker":
        flags["streaming_batches_across_workers"] = False
    if config["setting"] == "round_robin":
        flags["streaming_sampling_strategy"] = "round_robin"
    if config.get("pool_size"):
        flags["streaming_episode_pool_size"] = int(config["pool_size"])
    if config.get("budget_mb"):
        flags["streaming_decoded_frame_budget_mb"] = float(config["budget_mb"])
    if config["num_workers"] > 0:
        start_worker_context()
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss(os.getpid()))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    fps = 30
    dataset = StreamingLeRobotDataset(
        root=config["root"],
        delta_timestamps={"action": [i / fps for i in range(50)]},
        return_uint8=True,
        seed=config["seed"],
        max_num_shards=max(1, config["num_workers"]),
        config=StreamingConfig(**flags),
    )
    loader = streaming_dataloader(
        dataset, 32, config["num_workers"], **({"prefetch_factor": 2} if config["num_workers"] else {})
    )
    spec = SampleSpec.from_meta(dataset.meta, dataset.delta_timestamps, 1e-4, None)
    rank_pool = getattr(dataset, "rank_pool", 32)  # the versions before the batch-sized pool: 32
    needed = None
    if hasattr(streaming_graph, "batch_open_runs"):  # the open-runs rule the dataset's schedule uses
        from lerobot_nodes.resume import identity as identities

        if config["setting"] == "budget_runs":  # the rule before: as a checkpoint of those versions sets it
            dataset.identity = identities.with_open_runs_rule(dataset.identity, "budget")
        rule = identities.open_runs_rule_of(dataset.identity)
        resident = streaming_graph.resident_episodes(dataset.config, rank_pool, len(dataset.episodes))
        schedule = streaming_graph.ScheduleStart(rank_pool=rank_pool, open_runs_rule=rule)
        needed = streaming_graph.open_runs_needed(dataset.config, schedule, resident)
    if hasattr(streaming_graph, "resident_episodes"):
        resident = streaming_graph.resident_episodes(dataset.config, rank_pool, len(dataset.episodes))
        open_runs = streaming_graph.open_anchor_runs(dataset.config, dataset.meta, spec, resident)
        open_runs = open_runs if needed is None else min(open_runs, needed)
    else:
        open_runs = streaming_graph.open_anchor_runs(dataset.config, dataset.meta, spec)
    cameras = list(dataset.meta.camera_keys)
    batches, samples, first_at = 0, 0, None
    while batches < config["batches"]:
        for batch in dataset.metrics.timed(loader):
            for key in cameras:  # read one byte of every page, as a training step reads its batch
                batch[key].view(-1)[::4096].sum()
            batches += 1
            if batches == 1:
                first_at, first_cpu = time.perf_counter(), common.tree_cpu(os.getpid())
            else:
                samples += int(batch["episode_index"].shape[0])
            if batches >= config["batches"]:
                break
    elapsed = time.perf_counter() - first_at if first_at else float("nan")
    cpu = common.tree_cpu(os.getpid()) - first_cpu if first_at else float("nan")
    report = dataset.metrics.report()
    stop.set()
    sampler.join()
    mixing = report.mixing
    result = {
        **{k: config.get(k) for k in ("dataset", "setting", "budget_mb", "pool_size", "num_workers")},
        "rank_pool": rank_pool if dataset.config.streaming_episode_pool_size is None else None,
        "open_runs": 1 if config["setting"] in ("today", "pairs") else open_runs,
        "batches_across_workers": dataset.batches_across_workers,
        "batches": batches,
        "samples_per_s": samples / elapsed if elapsed > 0 else None,
        # CPU time of the whole tree per steady sample: what samples/s is on an idle machine's cores.
        "cpu_ms_per_sample": 1e3 * cpu / samples if samples else None,
        "distinct_episodes": mixing.distinct_episodes,
        "uniform_distinct_episodes": mixing.uniform_distinct_episodes,
        "pairs_within_5_pct": 100 * mixing.near_pairs,
        "uniform_pairs_within_5_pct": 100 * mixing.uniform_near_pairs,
        "pairs_within_gop_pct": 100 * mixing.gop_pairs,
        "uniform_pairs_within_gop_pct": 100 * mixing.uniform_gop_pairs,
        "gop_frames": mixing.gop_frames,
        "decoded_per_delivered": report.decoded_per_delivered,
        "peak_decoded_mb": report.peak_decoded_bytes / 1e6,
        "peak_rss_mb": peak[0] / 1e6,
    }
    from lerobot_nodes.loader import shutdown_dataloader

    shutdown_dataloader(loader)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", nargs="+", default=list(RECIPES))
    parser.add_argument(
        "--settings", nargs="+", default=["today", "default"], help="today, pairs, per_worker, round_robin, budget_runs, default, poolN, or MB"
    )
    parser.add_argument("--workers", nargs="+", type=int, default=[0, 2])
    parser.add_argument("--batches", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DATA / "curve.jsonl")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print("@@" + json.dumps(run_one(json.loads(args.one))), flush=True)
        return 0
    roots = ensure_datasets(args.datasets)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as out:
        for name in args.datasets:
            for setting in args.settings:
                for workers in args.workers:
                    named = setting in ("today", "pairs", "per_worker", "round_robin", "default", "budget_runs")
                    pool = int(setting[4:]) if setting.startswith("pool") else None
                    config = {
                        "dataset": name,
                        "root": str(roots[name]),
                        "setting": setting if named or pool else "budget",
                        "budget_mb": None if named or pool else float(setting),
                        "pool_size": pool,
                        "num_workers": workers,
                        "batches": args.batches,
                        "seed": args.seed,
                    }
                    done = subprocess.run(
                        [sys.executable, __file__, "--one", json.dumps(config)],
                        capture_output=True,
                        text=True,
                    )
                    lines = [line[2:] for line in done.stdout.splitlines() if line.startswith("@@")]
                    if done.returncode or not lines:
                        print(f"FAILED {config}: {done.stderr[-2000:]}", file=sys.stderr)
                        continue
                    out.write(lines[-1] + "\n")
                    out.flush()
                    row = json.loads(lines[-1])
                    print(
                        f"{name} {setting} w{workers}: open runs {row['open_runs']}, "
                        f"{row['samples_per_s']:.1f} samples/s, {row['cpu_ms_per_sample']:.2f} CPU ms/sample, episodes/batch {row['distinct_episodes']:.1f} "
                        f"(uniform {row['uniform_distinct_episodes']:.1f}), within 5 frames "
                        f"{row['pairs_within_5_pct']:.2f} % (uniform {row['uniform_pairs_within_5_pct']:.2f} %), "
                        f"within GOP {row['pairs_within_gop_pct']:.2f} % (uniform {row['uniform_pairs_within_gop_pct']:.2f} %), "
                        f"decoded/delivered {row['decoded_per_delivered']:.2f}, peak decoded {row['peak_decoded_mb']:.0f} MB, "
                        f"peak RSS {row['peak_rss_mb']:.0f} MB",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
