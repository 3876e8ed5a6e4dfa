"""Hub requests of one node by the Hub's rate-limit classes: opening a dataset with many ranks and
DataLoader workers, their first batches, and one epoch.

The Hub limits each user per 5-minute window: "API" calls (``/api/...``: revisions, refs, tree
listings; free users 1,000, anonymous 500) and "resolver" calls (``/resolve/...`` file reads and
bucket file URLs; free users 5,000, anonymous 3,000). Reads that follow a resolver's redirect to
the CDN (signed URLs) count in neither.

One loopback Hub (``lerobot_nodes.testing.hub``, payloads behind 302s to its CDN origin) serves a
dataset written by ``lerobot_nodes.testing.write_dataset`` with one tiny camera, one data file,
one video file and one ``meta/episodes`` file per episode (``--files`` is the total, meta
included). ``--ranks`` processes (the ranks of one node) share one ``$HF_LEROBOT_HOME``; each
constructs ``StreamingLeRobotDataset(repo_id=..., rank=r, world_size=ranks)`` (**open**), then
starts ``--workers`` DataLoader workers for ``--batches`` batches (**first batches**), then reads
the rest of its epoch (**rest of epoch**). The phases are separated by barriers, so each request
is counted in the phase that sent it.

    python benchmarks/hub_requests.py                            # 100, 300 and 1,000 files, 8 ranks x 4 workers
    python benchmarks/hub_requests.py --files 1000 --ranks 8 --workers 4
    python benchmarks/hub_requests.py --files 100 --src /tmp/before23/src   # another checkout's package (before/after)

Columns: API calls, resolver calls, CDN reads, the largest number of resolver calls any one file
got over the whole run (the target: at most one per file per hour per node), seconds.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = "lerobot-nodes/hub-requests"
CAMERA = "observation.images.top"
PHASES = ("open", "first batches", "rest of epoch")


def make_dataset(root: Path, files: int) -> Path:
    from lerobot_nodes.testing import write_dataset

    episodes = max(1, (files - 3) // 3)  # data + video + meta/episodes per episode; info, stats, tasks
    return write_dataset(
        root, episode_lengths=[4] * episodes, cameras=(CAMERA,), height=16, width=16,
        data_file_size_in_mb=1e-4, video_files_size_in_mb=1e-4, seed=3,
    )


def request_class(record) -> str:  # type: ignore[no-untyped-def]
    if record.origin != "hub":
        return "cdn"
    if record.path.startswith("/api/"):
        return "api"
    if "/resolve/" in record.path:
        return "resolver"
    return "other"


# -- one rank (a child process) --------------------------------------------------------------------


def rank_main(rank: int, world_size: int, workers: int, batches: int) -> None:
    from lerobot_nodes.dataset import StreamingLeRobotDataset
    from lerobot_nodes.loader import streaming_dataloader

    def barrier(name: str) -> None:
        print(name, flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit(f"rank {rank}: the parent ended the run")

    dataset = StreamingLeRobotDataset(repo_id=REPO, rank=rank, world_size=world_size, seed=1)
    barrier("opened")
    loader = streaming_dataloader(dataset, batch_size=2, num_workers=workers)
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    barrier("batched")
    for _ in iterator:
        pass
    report = dataset.metrics.report() if hasattr(dataset, "metrics") else None
    line = report.line() if report is not None else ""
    print(f"done {line}", flush=True)


# -- the node (the parent) ------------------------------------------------------------------------


def run(files: int, ranks: int, workers: int, batches: int, src: str | None) -> dict[str, object]:
    from lerobot_nodes.testing.hub import LoopbackHub

    with tempfile.TemporaryDirectory(prefix="hub-requests-") as scratch, LoopbackHub() as hub:
        root = make_dataset(Path(scratch) / "dataset", files)
        hub.add_dataset(REPO, root)
        n_files = sum(1 for p in root.rglob("*") if p.is_file())
        env = {
            **os.environ, "HF_ENDPOINT": hub.endpoint, "HF_LEROBOT_HOME": str(Path(scratch) / "home"),
            "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(Path(scratch) / "hf"),
            # What torchrun gives every rank of one job (the ranks share what may move only within a job).
            "TORCHELASTIC_RUN_ID": f"hub-requests-{os.getpid()}-{files}",
        }
        env.pop("HF_TOKEN", None)
        if src:
            env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        command = [sys.executable, __file__, "--rank-child", "--ranks", str(ranks), "--workers", str(workers),
                   "--batches", str(batches)]
        started = time.perf_counter()
        children = [
            subprocess.Popen([*command, "--rank", str(r)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
            for r in range(ranks)
        ]
        marks, seconds, last_lines = [], [], [""] * ranks
        try:
            for expected in ("opened", "batched", "done"):
                for number, child in enumerate(children):
                    while True:
                        line = child.stdout.readline()  # type: ignore[union-attr]
                        if not line:
                            raise SystemExit(f"rank {number} ended early (exit {child.wait()})")
                        if line.startswith(expected):
                            last_lines[number] = line.strip()
                            break
                marks.append(len(hub.records))
                seconds.append(time.perf_counter() - started)
                if expected != "done":
                    for child in children:
                        child.stdin.write("go\n")  # type: ignore[union-attr]
                        child.stdin.flush()  # type: ignore[union-attr]
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                child.wait()
        records = list(hub.records)
    phases = {}
    begin = 0
    for name, end in zip(PHASES, marks, strict=True):
        phases[name] = collections.Counter(request_class(r) for r in records[begin:end])
        begin = end
    per_file = collections.Counter(r.path for r in records if request_class(r) == "resolver")
    api_paths = collections.Counter(
        r.path.split("/")[5] if r.path.count("/") >= 5 else r.path for r in records[: marks[0]] if request_class(r) == "api"
    )
    return {
        "files": n_files, "phases": phases, "max_resolves_per_file": max(per_file.values(), default=0),
        "seconds": seconds, "api_kinds": dict(api_paths), "report": last_lines[0][5:],
    }


def table(label: str, results: list[dict[str, object]], ranks: int, workers: int) -> str:
    lines = [
        f"### {label}: {ranks} ranks x {workers} DataLoader workers on one node",
        "",
        "| files | phase | API calls | resolver calls | CDN reads | max resolver calls of one file (whole run) | s (cumulative) |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        phases = result["phases"]
        total: collections.Counter[str] = collections.Counter()
        for position, name in enumerate(PHASES):
            counts = phases[name]  # type: ignore[index]
            total += counts
            lines.append(
                f"| {result['files']} | {name} | {counts['api']} | {counts['resolver']} | {counts['cdn']} | "
                f"{'' if position else result['max_resolves_per_file']} | {result['seconds'][position]:.1f} |"  # type: ignore[index]
            )
        lines.append(f"| {result['files']} | **whole run** | {total['api']} | {total['resolver']} | {total['cdn']} | | |")
    lines.append("")
    for result in results:
        lines.append(f"- {result['files']} files, API calls at open by kind: {result['api_kinds']}")
        if result["report"]:
            lines.append(f"- {result['files']} files, rank 0's metrics line: {result['report']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", default="100,300,1000", help="dataset sizes in files, comma-separated")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--src", default=None, help="import lerobot_nodes from this folder in the ranks (a checkout's src/)")
    parser.add_argument("--label", default=None)
    parser.add_argument("--rank-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_child:
        rank_main(args.rank, args.ranks, args.workers, args.batches)
        return
    results = [run(int(n), args.ranks, args.workers, args.batches, args.src) for n in args.files.split(",")]
    print(table(args.label or (f"lerobot_nodes from {args.src}" if args.src else "this checkout"), results,
                args.ranks, args.workers))


if __name__ == "__main__":
    main()
