"""Time to the first batch with DataLoader workers, in a fresh process, before and after a change.

    /work/venv/bin/python benchmarks/first_batch.py --src before=/tmp/h4-before/src after=src --runs 3

Each measurement is a new Python process that imports torch and this package (timed apart), then
builds ``StreamingLeRobotDataset`` + ``streaming_dataloader`` (batch 32, ACT window, ``--workers``)
and takes one batch: "first batch" runs from just before the dataset is constructed to the batch in
hand, as a training script meets it (no ``start_worker_context()`` call unless the side is named
``NAME+context``, e.g. ``before+context=/tmp/h4-before/src``). The sides alternate within each run,
locally and over S3: a moto S3 server on 127.0.0.1 started here (as tests/remote do) holding a copy of
the dataset, read as ``s3://``. ``--cache cold`` gives every process an empty LeRobot home
(its MP4 indexes are built, no byte is cached); ``warm`` shares one home per side, filled by an
unrecorded first process. Also recorded: the CPU seconds of the process tree (trainer, workers'
server, workers) over the same span, its PSS at the first batch, and how the workers' server started
(a fork of the trainer, or a new interpreter). Prints a Markdown table (medians) and, with
``--out``, appends every measurement as a JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "drivers"))  # the drivers' shared helpers

DEFAULT_ROOT = "/work/shared/datasets/lerobot-writer-small"
S3_PREFIX = "lerobot/first-batch"


def tree_pss_mb(root: int) -> float:
    """Proportional set size of ``root`` and its descendants, MB (shared pages split between them)."""
    from _driver_common import process_tree

    total = 0
    for pid in process_tree(root):
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1])
    return total / 1024


def server_kind() -> str:
    """How this process's workers' server started: ``fork`` of this process, or a ``new interpreter``."""
    from lerobot_nodes.workers.server import SERVER

    pid = SERVER._forkserver_pid
    if pid is None:
        return "none"
    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return "new interpreter" if "multiprocessing.forkserver" in command else "fork"


def child(root: str, local_root: str, workers: int, start_context: bool) -> None:
    started = time.perf_counter()
    import _driver_common as common
    import torch  # noqa: F401  (timed with the package: what every training script imports first)

    from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader
    from lerobot_nodes.loader import shutdown_dataloader

    info = json.loads((Path(local_root) / "meta" / "info.json").read_text())
    cameras = [key for key, spec in info["features"].items() if spec.get("dtype") == "video"]
    window = common.delta_timestamps("act", info["fps"], cameras, info["features"])
    imported = time.perf_counter()
    cpu_before = common.tree_cpu(os.getpid())
    if start_context:
        from lerobot_nodes.loader import start_worker_context

        start_worker_context()
    dataset = StreamingLeRobotDataset(
        root=root, delta_timestamps=window, max_num_shards=max(1, workers), seed=1000, return_uint8=True
    )
    constructed = time.perf_counter()
    loader = streaming_dataloader(dataset, 32, workers)
    next(iter(loader))
    first = time.perf_counter()
    record = {
        "import_s": imported - started,
        "construct_s": constructed - imported,
        "first_batch_s": first - imported,
        "cpu_s": common.tree_cpu(os.getpid()) - cpu_before,
        "pss_mb": tree_pss_mb(os.getpid()),
        "server": server_kind() if workers else "none",
    }
    shutdown_dataloader(loader)
    dataset.close()
    print(json.dumps(record), flush=True)


@contextlib.contextmanager
def s3_copy(local_root: str) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 holding ``local_root`` at ``s3://S3_PREFIX`` (this process's
    environment pointing s3fs at it); yields its endpoint URL."""
    from lerobot_nodes.testing.s3 import LoopbackS3

    with LoopbackS3() as server:
        os.environ.update(server.environment())
        server.upload(local_root, f"s3://{S3_PREFIX}")
        yield server.endpoint


def parse_sides(values: list[str]) -> list[tuple[str, str | None, bool]]:
    """``NAME=SRC`` pairs: (label, src directory or None for the installed package, start_worker_context first)."""
    sides = []
    for value in values:
        label, _, src = value.partition("=")
        sides.append((label, os.path.abspath(src) if src else None, label.endswith("+context")))
    return sides


def run_child(
    src: str | None, root: str, local_root: str, workers: int, start_context: bool, home: str
) -> dict[str, object]:
    env = {**os.environ, "HF_LEROBOT_HOME": home}
    if src:
        env["PYTHONPATH"] = src
    command = [sys.executable, __file__, "--child", root, local_root, str(workers), str(int(start_context))]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--src", nargs="+", default=["installed="], help="NAME=SRC_DIR sides to compare")
    parser.add_argument("--root", default=DEFAULT_ROOT)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--stores", nargs="+", choices=("local", "s3"), default=["local", "s3"])
    parser.add_argument("--cache", nargs="+", choices=("cold", "warm"), default=["warm", "cold"])
    parser.add_argument("--out", help="append every measurement to this JSON-lines file")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        root, local_root, workers, start_context = args.child
        child(root, local_root, int(workers), bool(int(start_context)))
        return
    sides = parse_sides(args.src)
    results: dict[tuple[str, str, str, int], list[dict[str, object]]] = {}
    with contextlib.ExitStack() as stack:
        homes = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="first-batch-")))
        roots = {"local": args.root}
        if "s3" in args.stores:
            stack.enter_context(s3_copy(args.root))
            roots["s3"] = f"s3://{S3_PREFIX}"
        for store in args.stores:
            for cache in args.cache:
                for workers in args.workers:
                    for label, src, start_context in sides:  # fill each side's warm home, unrecorded
                        if cache == "warm":
                            run_child(
                                src,
                                roots[store],
                                args.root,
                                workers,
                                start_context,
                                str(homes / f"{store}-{label}"),
                            )
                    for run in range(args.runs):
                        for label, src, start_context in sides if run % 2 == 0 else sides[::-1]:
                            home = homes / (
                                f"{store}-{label}"
                                if cache == "warm"
                                else f"cold-{store}-{label}-{run}-{workers}"
                            )
                            record = run_child(
                                src, roots[store], args.root, workers, start_context, str(home)
                            )
                            record.update(side=label, store=store, cache=cache, workers=workers, run=run)
                            results.setdefault((store, cache, label, workers), []).append(record)
                            print(json.dumps(record), file=sys.stderr, flush=True)
                            if args.out:
                                with open(args.out, "a") as out:
                                    out.write(json.dumps(record) + "\n")
    print(
        "| store | cache | workers | side | first batch s (runs) | median | construct s | CPU s (tree) | PSS MB (tree) | server | import s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (store, cache, label, workers), records in results.items():
        firsts = [float(r["first_batch_s"]) for r in records]  # type: ignore[arg-type]

        def median(key: str, records: list[dict[str, object]] = records) -> float:
            return statistics.median(float(r[key]) for r in records)  # type: ignore[arg-type]

        servers = "/".join(sorted({str(r["server"]) for r in records}))
        print(
            f"| {store} | {cache} | {workers} | {label} | {' '.join(f'{f:.2f}' for f in firsts)} | **{median('first_batch_s'):.2f}** "
            f"| {median('construct_s'):.2f} | {median('cpu_s'):.2f} | {median('pss_mb'):.0f} | {servers} | {median('import_s'):.2f} |"
        )


if __name__ == "__main__":
    main()
