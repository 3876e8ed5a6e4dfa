"""Samples/s of this package with 0 workers when each batch is followed by a training step.

With ``num_workers=0`` the only decoding that overlaps a training step is what the graph
submitted ahead before handing the batch over (up to ``streaming_decoded_queue_size`` samples of
the next batch). A step that leaves the cores to the decode threads (a GPU step) is a sleep here.
Run two checkouts of ``src/`` alternated (``PYTHONPATH``) to see what a change to that overlap
costs; CPU ms per sample and batch segments created are printed beside samples/s.

    python benchmarks/step_overlap.py --step-ms 0 100
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="h264-g30", help="a dataset of benchmarks/peers.py")
    parser.add_argument("--step-ms", type=float, nargs="+", default=[0.0, 100.0])
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import peers

    from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader
    from lerobot_nodes.loader import shutdown_dataloader

    root = peers.dataset_roots([args.dataset])[args.dataset]
    for step_ms in args.step_ms:
        dataset = StreamingLeRobotDataset(
            root=root, delta_timestamps=peers.act_window(30), return_uint8=True, seed=0, max_num_shards=1
        )
        loader = streaming_dataloader(dataset, peers.BATCH_SIZE, 0)
        batches, started, cpu_started = 0, 0.0, 0.0
        while batches < args.batches:
            for _batch in loader:
                batches += 1
                if batches == 2:  # the first batch is start-up
                    started, cpu_started = time.perf_counter(), sum(os.times()[:2])
                time.sleep(step_ms / 1e3)
                if batches >= args.batches:
                    break
        elapsed, cpu = time.perf_counter() - started, sum(os.times()[:2]) - cpu_started
        samples = (args.batches - 1) * peers.BATCH_SIZE
        report = dataset.metrics.report()
        print(
            f"step {step_ms:.0f} ms: {samples / elapsed:.0f} samples/s, {1e3 * elapsed / (args.batches - 1):.1f} ms "
            f"per batch, {1e3 * cpu / samples:.2f} CPU ms/sample, batch segments created {report.batch_segments_created}",
            flush=True,
        )
        shutdown_dataloader(loader)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
