"""Loader A with ``num_workers=0``: variants of the process around the same graph, alternated.

    /work/venv/bin/python benchmarks/zero_worker_experiments.py --rounds 6 --batches 80

With 0 workers one interpreter lock serialises the training loop, the graph's consumer chain
and the Python half of two decode threads. Each variant changes one thing around the loader
without changing its code, to see whether the hand-offs of that lock (or memory faults, or a
generator call per pick) are what keeps samples/s where it is:

* ``baseline``: as installed.
* ``switch-1ms`` / ``switch-0.2ms``: ``sys.setswitchinterval`` (default 5 ms), so a thread back
  from C code waits less for the lock.
* ``decode-threads-3``: ``StreamingConfig(streaming_decode_threads=3)``.
* ``nice-5``: decode threads at nice 5, so the consumer (often the lock holder) keeps its core.
* ``no-trim``: no ``malloc_trim`` every 4 batches, and glibc's mmap/trim thresholds raised, so
  freed buffers are not faulted in again.
* ``gil-held-copies``: RGB planes copied with ``memoryview`` assignment, which keeps the lock,
  instead of three numpy copies that each release it for ~10 us.
* ``python-rng``: the pool sampler's pick drawn with ``random.Random`` (no lock release) instead
  of ``numpy.random.Generator.integers`` (a different order; for timing only).

Each run: ``StreamingLeRobotDataset`` + ``streaming_dataloader`` (batch 32, ``--window`` as
benchmarks/run.py builds it), 3 batches of warm-up, then ``--batches`` timed. Prints one JSON
line per run and a Markdown table of medians (samples/s, cores busy = process CPU / wall, CPU ms
per sample).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from before_after import DEFAULT_ROOT, window_of

VARIANTS = (
    "baseline",
    "switch-1ms",
    "switch-0.2ms",
    "decode-threads-3",
    "nice-5",
    "no-trim",
    "gil-held-copies",
    "python-rng",
)

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(8 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def _apply(variant: str) -> dict[str, object]:
    """Install ``variant`` in this process; returns ``StreamingConfig`` overrides."""
    if variant == "switch-1ms":
        sys.setswitchinterval(0.001)
    elif variant == "switch-0.2ms":
        sys.setswitchinterval(0.0002)
    elif variant == "decode-threads-3":
        return {"streaming_decode_threads": 3}
    elif variant == "nice-5":
        import threading
        from concurrent.futures import ThreadPoolExecutor

        from lerobot_nodes.nodes import decode_mapper

        def renice() -> None:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 5)

        class NicedExecutor(ThreadPoolExecutor):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, initializer=renice, **kwargs)  # type: ignore[arg-type]

        decode_mapper.ThreadPoolExecutor = NicedExecutor  # type: ignore[misc]
    elif variant == "no-trim":
        from lerobot_nodes.nodes import graph

        graph.build_streaming_graph.__kwdefaults__["trim_heap_every"] = None
    elif variant == "gil-held-copies":
        import numpy as np

        from lerobot_nodes.mp4 import rgb

        def planar(self, frame, out):  # type: ignore[no-untyped-def]
            converted = self._reformatter.reformat(frame, format="gbrp", **self._options)
            height, width = converted.height, converted.width
            for channel, index in enumerate(rgb._PLANAR_ORDER):
                plane = converted.planes[index]
                if plane.line_size == width:
                    memoryview(out[channel]).cast("B")[:] = memoryview(plane).cast("B")[: height * width]
                else:
                    rows = np.frombuffer(memoryview(plane), dtype=np.uint8, count=height * plane.line_size)
                    out[channel] = rows.reshape(height, plane.line_size)[:, :width]
            return out

        rgb.RgbConverter._planar = planar  # type: ignore[method-assign]
    elif variant == "python-rng":
        import random

        from lerobot_nodes.nodes import pool_sampler

        draws = random.Random(0)

        def pick(self):  # type: ignore[no-untyped-def]
            draw = draws.randrange(sum(self._left))
            for slot, count in enumerate(self._left):
                if draw < count:
                    return slot
                draw -= count
            raise AssertionError("unreachable")

        pool_sampler.EpisodePoolSampler._pick_remaining = pick  # type: ignore[method-assign]
    elif variant != "baseline":
        raise SystemExit(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    return {}


def child(variant: str, root: str, batches: int, window_name: str) -> None:
    overrides = _apply(variant)
    from lerobot_nodes import StreamingConfig, StreamingLeRobotDataset, streaming_dataloader
    from lerobot_nodes.dataset import shutdown_dataloader

    dataset = StreamingLeRobotDataset(
        "local/bench",
        root=root,
        delta_timestamps=window_of(root, window_name),
        max_num_shards=1,
        seed=1000,
        return_uint8=True,
        **({"config": StreamingConfig(**overrides)} if overrides else {}),  # type: ignore[arg-type]
    )
    loader = streaming_dataloader(dataset, 32, 0)
    batches_seen = iter(loader)
    for _ in range(3):
        next(batches_seen)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(batches):
        next(batches_seen)
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    samples = 32 * batches
    print(
        json.dumps(
            {
                "variant": variant,
                "samples_per_s": samples / wall,
                "cores": cpu / wall,
                "cpu_ms_per_sample": 1e3 * cpu / samples,
            }
        )
    )
    shutdown_dataloader(loader)
    dataset.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=DEFAULT_ROOT)
    parser.add_argument("--window", default="none", choices=("none", "act", "diffusion"))
    parser.add_argument("--batches", type=int, default=80)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.root, args.batches, args.window)
        return
    results: dict[str, list[dict[str, float]]] = {variant: [] for variant in args.variants}
    for _ in range(args.rounds):
        for variant in args.variants:
            env = {**os.environ, **(MALLOC_ENV if variant == "no-trim" else {})}
            command = [sys.executable, __file__, "--child", variant, "--root", args.root]
            command += ["--batches", str(args.batches), "--window", args.window]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            line = done.stdout.strip().splitlines()[-1]
            print(line, flush=True)
            results[variant].append(json.loads(line))
    print()
    print("| variant | samples/s, median (min-max) | cores busy | CPU ms/sample |")
    print("|---|---|---|---|")
    for variant, runs in results.items():
        rates = [run["samples_per_s"] for run in runs]
        cores = statistics.median(run["cores"] for run in runs)
        cpu = statistics.median(run["cpu_ms_per_sample"] for run in runs)
        print(f"| {variant} | {statistics.median(rates):.0f} ({min(rates):.0f}-{max(rates):.0f}) | {cores:.2f} | {cpu:.2f} |")


if __name__ == "__main__":
    main()
