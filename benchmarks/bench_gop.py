"""Decoded frames per delivered frame and batch diversity by codec, GOP size and schedule.

For each codec (H.264 with B-frames, HEVC, AV1) and GOP size it writes a small dataset with
``lerobot_nodes.testing.write_dataset`` (one camera), streams one epoch through the graph of one
reader (``num_workers=0``: the rank's whole pool) and prints a Markdown table:

* ``decoded/delivered``: frames the codec decoded per frame returned in samples (exact counts
  from the graph metrics);
* ``episodes/batch``: distinct episodes per batch of 32 consecutive samples (mean);
* ``peak decoded MB``: the most decoded frames the decoders kept at once (the budget bounds it);
* ``samples/s``: indicative only on a shared machine.

Schedules: ``pairs`` is the order before GOP runs (``--dataset.streaming_gop_runs=false``),
``gop`` the GOP-aligned runs (default), each with both sampling strategies. Windows: ``act``
reads the camera at +0, ``diffusion`` at -1 and 0 frames.

    python benchmarks/bench_gop.py [--codecs h264 hevc av1] [--gops 2 10 30 60] [--episodes 24]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from lerobot_nodes import load_meta, open_source
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.metrics import WorkerMetrics
from lerobot_nodes.streaming_graph import GraphServices, SampleOptions, ScheduleStart, build_streaming_graph
from lerobot_nodes.testing import write_dataset

CAMERA = "observation.images.top"
WINDOWS = {"act": None, "diffusion": {CAMERA: [-1 / 30, 0.0]}}


def run(root: Path, strategy: str, gop_runs: bool, window: str, batch: int = 32) -> dict[str, float]:
    source = open_source(root)
    meta = load_meta(source)
    metrics = WorkerMetrics()
    config = StreamingConfig(streaming_sampling_strategy=strategy, streaming_gop_runs=gop_runs)
    graph = build_streaming_graph(
        source, meta, list(range(len(meta.episodes))), config=config, schedule=ScheduleStart(seed=1000),
        samples=SampleOptions(delta_timestamps=WINDOWS[window], return_uint8=True),
        services=GraphServices(metrics=metrics),
    )  # fmt: skip
    started = time.perf_counter()
    episodes = []
    root_node = graph.root
    root_node.reset()
    while True:
        try:
            episodes.append(int(next(root_node)["episode_index"]))
        except StopIteration:
            break
    seconds = time.perf_counter() - started
    graph.close()
    totals = metrics.counters.totals()
    batches = [episodes[i : i + batch] for i in range(0, len(episodes) - batch + 1, batch)]
    return {
        "ratio": totals["frames_decoded"] / totals["frames_delivered"],
        "diversity": float(np.mean([len(set(b)) for b in batches])),
        "peak_mb": totals["peak_decoded_bytes"] / 1e6,
        "rate": len(episodes) / seconds,
        "samples": len(episodes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--codecs", nargs="+", default=["h264", "hevc", "av1"])
    parser.add_argument("--gops", nargs="+", type=int, default=[2, 10, 30, 60])
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--windows", nargs="+", default=["act", "diffusion"])
    parser.add_argument("--workdir", default=None, help="where datasets are written (default: a temporary dir)")
    args = parser.parse_args()
    os.environ.setdefault("HF_LEROBOT_HOME", tempfile.mkdtemp(prefix="bench-gop-home-"))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-gop-"))
    lengths = [int(x) for x in np.random.default_rng(0).integers(40, 121, size=args.episodes)]
    print(f"{args.episodes} episodes of 40..120 frames (total {sum(lengths)}), one 48x64 camera, 30 fps; "
          "default pool (32 episodes per rank), 2 decode threads, seed 1000\n")  # fmt: skip
    print("| codec | GOP | window | strategy | schedule | decoded/delivered | episodes/batch | peak decoded MB | samples/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for codec in args.codecs:
        for gop in args.gops:
            root = workdir / f"{codec}-g{gop}"
            if not (root / "meta" / "info.json").exists():
                write_dataset(root, episode_lengths=lengths, cameras=(CAMERA,), codec=codec, gop=gop, seed=7)  # type: ignore[arg-type]
            for window in args.windows:
                for strategy in ("remaining", "round_robin"):
                    for gop_runs in (False, True):
                        r = run(root, strategy, gop_runs, window)
                        print(
                            f"| {codec} | {gop} | {window} | {strategy} | {'gop' if gop_runs else 'pairs'} | "
                            f"{r['ratio']:.3f} | {r['diversity']:.1f} | {r['peak_mb']:.2f} | {r['rate']:.0f} |",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
