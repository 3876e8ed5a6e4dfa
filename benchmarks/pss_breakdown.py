"""Where the peak PSS of ``ours`` goes (issue 24 item 3), on ``benchmarks/peers.py``'s workload.

Runs ``peers.py``'s measurement of this package (the same child process, batch 32, ACT window,
``prefetch_factor=2``, every page of each batch read) and, every 50 ms, reads
``/proc/<pid>/smaps`` of every process in its tree, sorting each mapping's PSS into

* ``files``: file-backed mappings (libraries, the interpreter: what the imports map);
* ``shared segments``: shared memory (``/dev/shm``, ``memfd:``): batch parts made in workers;
* ``batch-sized anon``: anonymous mappings of 8 MB or more outside malloc's arenas: in this
  package, batch storages in process memory (the joined batches, the 0-worker batches);
* ``arenas``: glibc's per-thread malloc arenas (anonymous mappings aligned to 64 MB) and
  ``[heap]``: small allocations of every thread (Python objects, packets, codec state, frames
  below malloc's mmap threshold);
* ``frame-sized anon``: anonymous mappings of 128 KB to 8 MB (malloc's own mmaps: decoded video
  frames, fetched clip bytes, numpy arrays);
* ``other``: the rest (stacks, small anonymous mappings).

At the peak of the tree's total it keeps the split, per process. Every 50 ms a full smaps read
of each process costs this parent CPU (outside the measured tree but on the same cores): read
samples/s and CPU from ``peers.py`` runs, not from this one.

    /work/peers-venv/bin/python benchmarks/pss_breakdown.py --workers 0 2
    /work/peers-venv/bin/python benchmarks/pss_breakdown.py --decoders --batches 10  # what the decoders hold
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
sys.path.insert(0, str(HERE))

import peers  # noqa: E402

ARENA_ALIGN = 64 << 20
BATCH_SIZED = 8 << 20
FRAME_SIZED = 128 << 10
CATEGORIES = ("files", "shared segments", "batch-sized anon", "arenas", "frame-sized anon", "other")


def split_of(pid: int) -> tuple[dict[str, int], dict[str, int]]:
    """PSS bytes of ``pid`` by category (see the module), and its private bytes by category."""
    split = dict.fromkeys(CATEGORIES, 0)
    private = dict.fromkeys(CATEGORIES, 0)
    try:
        with open(f"/proc/{pid}/smaps") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return split, private
    category = "other"
    for line in lines:
        head = line.split(None, 5)
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            start, end = (int(x, 16) for x in head[0].split("-"))
            path = head[5] if len(head) > 5 else ""
            size = end - start
            if "/dev/shm" in path or path.startswith("/memfd:") or "SYSV" in path:
                category = "shared segments"
            elif path.startswith("/"):
                category = "files"
            elif path == "[heap]":
                category = "arenas"
            elif path:
                category = "other"
            elif start % ARENA_ALIGN == 0 and size <= ARENA_ALIGN:
                category = "arenas"
            elif size >= BATCH_SIZED:
                category = "batch-sized anon"
            elif size >= FRAME_SIZED:
                category = "frame-sized anon"
            else:
                category = "other"
        elif line.startswith("Pss:"):
            split[category] += int(line.split()[1]) * 1024
        elif line.startswith(("Private_Clean:", "Private_Dirty:")):
            private[category] += int(line.split()[1]) * 1024
    return split, private


def measure(config: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """``peers.py``'s measurement of ``config``, with the split of the tree's PSS at its peak."""
    process = subprocess.Popen(
        [sys.executable, str(HERE / "peers.py"), "--one", json.dumps(config)],
        env={**os.environ, **(env or {})},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdin and process.stdout and process.stderr
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True).start()  # type: ignore[union-attr]
    best: dict[str, Any] = {"total": 0}
    imports: dict[str, Any] = {}
    stop = threading.Event()

    def snapshot() -> dict[str, Any]:
        processes = {pid: split_of(pid) for pid in peers.tree_pids(process.pid)}  # the root first
        total = sum(sum(split.values()) for split, _ in processes.values())
        return {"total": total, "processes": processes}

    def sample() -> None:
        while not stop.is_set():
            now = snapshot()
            if now["total"] > best["total"]:
                best.clear()
                best.update(now)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    result: dict[str, Any] = {}
    for line in process.stdout:
        if line.startswith(peers.READY):
            imports.update(snapshot())
            sampler.start()
            process.stdin.write("\n")
            process.stdin.flush()
        elif line.startswith(peers.TIMED):
            stop.set()
            sampler.join()
            process.stdin.write("\n")
            process.stdin.flush()
        elif line.startswith(peers.RESULT):
            result = json.loads(line[len(peers.RESULT) :])
    process.wait(timeout=120)
    if process.returncode or not result:
        raise RuntimeError("".join(errors)[-3000:])
    return {"imports": imports, "peak": best, "result": result}


def what_decoders_hold(root: Path, batches: int) -> None:
    """In this process, 0 workers: the PSS the clip decoders hold after ``batches`` batches. Closing
    every decoder with its codec context kept (flushed, as the context pool keeps it), then dropping
    the contexts, each after a ``malloc_trim``: what goes at each step is what they held."""
    import ctypes
    import gc

    from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader
    from lerobot_nodes.loader import shutdown_dataloader

    trim = ctypes.CDLL(None).malloc_trim

    def pss_mb() -> float:
        gc.collect()
        trim(0)
        return peers.tree_pss(os.getpid()) / 1e6

    dataset = StreamingLeRobotDataset(
        root=root, delta_timestamps=peers.act_window(30), return_uint8=True, seed=0, max_num_shards=1
    )
    loader = streaming_dataloader(dataset, peers.BATCH_SIZE, 0)
    iterator = iter(loader)
    for _ in range(batches):
        batch = next(iterator)
    del batch
    graph = dataset._graph
    assert graph is not None
    decoders = graph.decoder.decoders
    held = pss_mb()
    idle, kept = len(decoders), decoders.frame_budget.resident_frames
    decoders.clear(keep_contexts=True)
    closed = pss_mb()
    contexts = len(decoders.contexts)
    decoders.contexts.clear()
    dropped = pss_mb()
    print(
        f"after {batches} batches: {held:.0f} MB PSS, {idle} idle decoders keeping {kept} decoded frames; "
        f"decoders closed, their {contexts} codec contexts kept (flushed): {closed:.0f} MB (-{held - closed:.0f}); "
        f"contexts dropped: {dropped:.0f} MB (-{closed - dropped:.0f}, {(closed - dropped) / max(1, contexts):.2f} MB each)"
    )
    shutdown_dataloader(loader)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="h264-g30")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--episodes", type=int, default=None, help="read the first N episodes (as peers.py --episodes)")
    parser.add_argument("--loader", default="ours", choices=peers.OURS)
    parser.add_argument("--where", default="local", choices=["local", "s3"], help="s3: from a moto server, as peers.py")
    parser.add_argument(
        "--decoders", action="store_true", help="only what the clip decoders hold (this process, 0 workers)"
    )
    args = parser.parse_args(argv)
    from lerobot_nodes import MapStyleLeRobotDataset

    root = peers.dataset_roots([args.dataset])[args.dataset]
    if args.decoders:
        what_decoders_hold(root, args.batches)
        return 0
    meta_ds = MapStyleLeRobotDataset(root=root)
    base = {
        "fps": int(meta_ds.fps),
        "cameras": list(meta_ds.meta.video_keys),
        "lengths": [int(x) for x in meta_ds.meta.episodes.length][: args.episodes],
        "episodes": None if args.episodes is None else list(range(args.episodes)),
        "local_root": str(root),
        "root": str(root),
        "seed": 0,
        "batches": args.batches,
        "loader": args.loader,
        "where": "local",
        "remote": None,
        "endpoint": None,
        "cache_dir": "/tmp",
    }
    server, env = None, {}
    if args.where == "s3":
        server = peers.MotoServer()
        base.update(where="s3", endpoint=server.endpoint, root=server.upload(root, f"{args.dataset}/ours"))
        base["remote"] = base["root"]
        env = server.env()
    try:
        for workers in args.workers:
            report(args.dataset, workers, measure({**base, "num_workers": workers}, env))
    finally:
        if server is not None:
            server.close()
    return 0


def report(dataset: str, workers: int, figures: dict[str, Any]) -> None:
    """The split of one measurement at the tree's peak, as a Markdown table."""
    peak, result = figures["peak"], figures["result"]
    print(f"\n{dataset}, {workers} workers: peak PSS {peak['total'] / 1e6:.0f} MB "
          f"(imports {figures['imports']['total'] / 1e6:.0f} MB); decoded frames kept (peak, RGB charge) "
          f"{result.get('peak_decoded_mb', 0):.0f} MB; batch segments created {result.get('batch_segments_created')}; "
          f"{result['samples_per_s']:.0f} samples/s, {result['cpu_ms_per_sample']:.2f} CPU ms/sample")
    print("PSS MB (private MB) by kind of mapping:")
    print("| process | " + " | ".join(CATEGORIES) + " | total |")
    print("|---" * (len(CATEGORIES) + 2) + "|")
    for name, snap in (("imports", figures["imports"]), ("peak", peak)):
        for index, (_pid, (split, private)) in enumerate(snap["processes"].items()):
            label = f"{name}: {'main' if index == 0 else f'child {index}'}"
            cells = " | ".join(f"{split[c] / 1e6:.0f} ({private[c] / 1e6:.0f})" for c in CATEGORIES)
            print(f"| {label} | {cells} | {sum(split.values()) / 1e6:.0f} |")


if __name__ == "__main__":
    raise SystemExit(main())
