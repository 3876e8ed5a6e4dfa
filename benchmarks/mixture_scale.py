"""A mixture of N small local datasets in one StreamingLeRobotDataset: open, one epoch, threads, memory.

Each size runs in its own process (peak RSS is per process). Sizes run twice, the second round in
reverse order, so load from other processes does not favour one size. Every dataset has 2 episodes
of 10 frames and one AV1 camera of 32x32; the epoch runs with ``num_workers=0`` (the graph in this
process: its threads are the ones counted).

    python -m benchmarks.mixture_scale --sizes 1 8 32 --out /tmp/mixture-scale

Each mixture of N is compared with one dataset holding the same 2N episodes (same frames, same
camera), so what grows with the number of datasets shows apart from what grows with the episodes.
Prints a Markdown table: frames, open wall/CPU s, epoch wall/CPU s, most threads alive during the
epoch, peak RSS (MB).

``--hub``: the datasets come from one loopback Hub (``lerobot_nodes.testing.hub.LoopbackHub``, in
this process) as ``bench/mix-NNN`` repos, each with two cameras, the codecs alternating AV1 and
H.264. Each size runs in a child process with a cold ``$HF_LEROBOT_HOME`` and ``$HF_HOME``: it
opens the mixture, streams half an epoch through the ``StatefulDataLoader`` (batches of 4, no
workers), saves the loader state, opens the mixture again and resumes from it to the end of the
epoch, checking every frame of every dataset came exactly once. The Hub's request records,
marked between the phases, give the requests at open by the Hub's rate-limit classes (API,
resolver, CDN); peak RSS and the largest PSS sampled are the child's::

    python -m benchmarks.mixture_scale --hub --sizes 10 30 100 --out /tmp/mixture-scale-hub
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path


def _datasets(folder: Path, count: int) -> list[Path]:
    from lerobot_nodes.testing import write_dataset

    roots = []
    for i in range(count):
        root = folder / f"d{i:03d}"
        if not (root / "meta" / "info.json").exists():
            write_dataset(
                root,
                episode_lengths=[10, 10],
                cameras=("observation.images.top",),
                height=32,
                width=32,
                seed=i,
            )
        roots.append(root)
    return roots


def _single(folder: Path, count: int) -> Path:
    """One dataset with the episodes of ``count`` small ones (the comparison row)."""
    from lerobot_nodes.testing import write_dataset

    root = folder / f"single-{count:03d}"
    if not (root / "meta" / "info.json").exists():
        write_dataset(
            root, episode_lengths=[10] * (2 * count), cameras=("observation.images.top",), height=32, width=32
        )
    return root


def _measure(folder: Path, count: int, single: bool) -> dict[str, float | int | str]:
    from lerobot_nodes.config import StreamingConfig
    from lerobot_nodes.dataset import StreamingLeRobotDataset

    root: Path | list[Path] = _single(folder, count) if single else _datasets(folder, count)
    wall, cpu = time.perf_counter(), time.process_time()
    dataset = StreamingLeRobotDataset(root=root, config=StreamingConfig(streaming_decode_threads=2))
    opened = time.perf_counter() - wall, time.process_time() - cpu
    wall, cpu = time.perf_counter(), time.process_time()
    threads, frames = 0, 0
    for _ in dataset:
        frames += 1
        threads = max(threads, threading.active_count())
    epoch = time.perf_counter() - wall, time.process_time() - cpu
    dataset.close()
    return {
        "what": f"one dataset of {2 * count} episodes" if single else f"mixture of {count}",
        "datasets": count,
        "frames": frames,
        "open_wall_s": opened[0],
        "open_cpu_s": opened[1],
        "epoch_wall_s": epoch[0],
        "epoch_cpu_s": epoch[1],
        "threads": threads,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# -- --hub: many datasets from one loopback Hub ----------------------------------------------------

HUB_CAMERAS = ("observation.images.top", "observation.images.wrist")
HUB_LENGTHS = (10, 10)
API_REQUESTS_PER_DATASET_TARGET = 6
"""The target: Hub API requests at open per dataset of a mixture (the ``/api/...`` class, the scarcer quota)."""


def hub_repo_id(index: int) -> str:
    return f"bench/mix-{index:03d}"


def hub_datasets(folder: Path, count: int) -> list[Path]:
    """``count`` small datasets of two 32x32 cameras, AV1 and H.264 alternating."""
    from lerobot_nodes.testing import write_dataset

    roots = []
    for i in range(count):
        root = folder / f"hub-{i:03d}"
        if not (root / "meta" / "info.json").exists():
            write_dataset(
                root,
                episode_lengths=list(HUB_LENGTHS),
                cameras=HUB_CAMERAS,
                height=32,
                width=32,
                codec="av1" if i % 2 == 0 else "h264",
                seed=i,
            )
        roots.append(root)
    return roots


def request_class(record) -> str:  # type: ignore[no-untyped-def]
    """The Hub's rate-limit class of a loopback Hub request record: api, resolver or cdn."""
    if record.origin != "hub":
        return "cdn"
    if record.path.startswith("/api/"):
        return "api"
    return "resolver" if "/resolve/" in record.path else "other"


def _pss_mb() -> float:
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def sample_keys(batch: dict) -> list[tuple[int, int, int]]:  # type: ignore[type-arg]
    """``(dataset_index, episode, frame)`` of every sample of a mixture's batch."""
    columns = (batch["dataset_index"], batch["episode_index"], batch["frame_index"])
    return list(zip(*(column.tolist() for column in columns), strict=True))


def _hub_child(count: int) -> None:
    """One size, in its own process: open, half an epoch, save, open again, resume to the end (stdin paces it)."""
    from lerobot_nodes.config import StreamingConfig
    from lerobot_nodes.dataset import StreamingLeRobotDataset
    from lerobot_nodes.loader import shutdown_dataloader, streaming_dataloader

    def phase(name: str, **figures: object) -> None:
        print(json.dumps({"phase": name, **figures}), flush=True)
        sys.stdin.readline()  # the parent marks the Hub's records between phases

    names = [hub_repo_id(i) for i in range(count)]
    config = StreamingConfig(streaming_decode_threads=2, streaming_episode_pool_size=4)
    pss = [_pss_mb()]
    wall, cpu = time.perf_counter(), time.process_time()
    dataset = StreamingLeRobotDataset(repo_id=names, config=config)
    opened = time.perf_counter() - wall, time.process_time() - cpu
    pss.append(_pss_mb())
    phase("open", open_wall_s=opened[0], open_cpu_s=opened[1])
    total = dataset.num_frames
    seen: list[tuple[int, int, int]] = []
    wall, cpu = time.perf_counter(), time.process_time()
    loader = streaming_dataloader(dataset, batch_size=4, num_workers=0)
    for batch in loader:
        seen += sample_keys(batch)
        if len(seen) >= total // 2:
            break
    state = loader.state_dict()
    shutdown_dataloader(loader)
    dataset.close()
    pss.append(_pss_mb())
    first_half = time.perf_counter() - wall, time.process_time() - cpu
    phase("half epoch", frames=len(seen))
    wall, cpu = time.perf_counter(), time.process_time()
    resumed = StreamingLeRobotDataset(repo_id=names, config=config)
    loader = streaming_dataloader(resumed, batch_size=4, num_workers=0)
    loader.load_state_dict(state)
    for batch in loader:
        seen += sample_keys(batch)
    shutdown_dataloader(loader)
    resumed.close()
    pss.append(_pss_mb())
    rest = time.perf_counter() - wall, time.process_time() - cpu
    every = {(d, e, f) for d in range(count) for e, n in enumerate(HUB_LENGTHS) for f in range(n)}
    phase(
        "resumed to the end",
        frames=len(seen),
        exactly_once=len(seen) == len(every) and set(seen) == every,
        epoch_wall_s=first_half[0] + rest[0],
        epoch_cpu_s=first_half[1] + rest[1],
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        peak_pss_mb=max(pss),
    )


def hub_run(count: int, hub, scratch: Path) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Run :func:`_hub_child` for ``count`` datasets against ``hub``; its figures and the requests per phase."""
    import collections

    home = scratch / f"home-{count}-{time.monotonic_ns()}"
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_LEROBOT_HOME": str(home / "lerobot"),
        "HF_HOME": str(home / "hf"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        env.pop(name, None)
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.mixture_scale", "--hub-child", str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    figures: dict[str, object] = {"datasets": count}
    requests: dict[str, collections.Counter[str]] = {}
    hub.clear_records()
    for line in child.stdout:
        if not line.startswith("{"):
            continue
        report = json.loads(line)
        records = list(hub.records)
        hub.clear_records()
        requests[report.pop("phase")] = collections.Counter(request_class(r) for r in records)
        figures.update(report)
        child.stdin.write("\n")
        child.stdin.flush()
    if child.wait() != 0:
        raise SystemExit(f"the child of {count} datasets failed (exit {child.returncode})")
    figures["requests"] = {phase: dict(counts) for phase, counts in requests.items()}
    return figures


def hub_main(sizes: list[int], out: Path) -> None:
    from lerobot_nodes.testing.hub import LoopbackHub

    roots = hub_datasets(out / "datasets", max(sizes))  # written once, before any timing
    with LoopbackHub() as hub:
        for i, root in enumerate(roots):
            hub.add_dataset(hub_repo_id(i), root)
        rows = [hub_run(size, hub, out) for size in [*sizes, *reversed(sizes)]]
    print(
        "| datasets | frames | exactly once | open wall s | open CPU s | epoch + resume wall s | epoch CPU s | "
        "peak RSS MB | peak PSS MB | open: API / resolver / CDN requests | API per dataset | "
        "resume open: API / resolver / CDN |"
    )
    print("|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        at_open = row["requests"]["open"]  # type: ignore[index]
        resume = row["requests"]["resumed to the end"]  # type: ignore[index]
        print(
            f"| {row['datasets']} | {row['frames']} | {'yes' if row['exactly_once'] else 'NO'} | "
            f"{row['open_wall_s']:.2f} | {row['open_cpu_s']:.2f} | {row['epoch_wall_s']:.2f} | "
            f"{row['epoch_cpu_s']:.2f} | {row['peak_rss_mb']:.0f} | {row['peak_pss_mb']:.0f} | "
            f"{at_open.get('api', 0)} / {at_open.get('resolver', 0)} / {at_open.get('cdn', 0)} | "
            f"{at_open.get('api', 0) / int(row['datasets']):.1f} | "  # type: ignore[call-overload]
            f"{resume.get('api', 0)} / {resume.get('resolver', 0)} / {resume.get('cdn', 0)} |"
        )
    worst = max(row["requests"]["open"].get("api", 0) / int(row["datasets"]) for row in rows)  # type: ignore[index,call-overload]
    verdict = "met" if worst <= API_REQUESTS_PER_DATASET_TARGET else "MISSED"
    print(
        f"\nHub API requests at open: at most {worst:.1f} per dataset; target <= "
        f"{API_REQUESTS_PER_DATASET_TARGET}: {verdict}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--hub", action="store_true", help="datasets from one loopback Hub (see the module docstring)"
    )
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process: measure one size
    parser.add_argument("--single", action="store_true", help=argparse.SUPPRESS)  # ... of one dataset
    parser.add_argument("--hub-child", type=int, help=argparse.SUPPRESS)  # a child process of --hub
    args = parser.parse_args(argv)
    if args.hub_child is not None:
        _hub_child(args.hub_child)
        return
    args.sizes = args.sizes or ([10, 30, 100] if args.hub else [1, 8, 32])
    args.out = args.out or Path("/tmp/mixture-scale-hub" if args.hub else "/tmp/mixture-scale")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.hub:
        hub_main(args.sizes, args.out)
        return
    if args.one is not None:
        print(json.dumps(_measure(args.out / "datasets", args.one, args.single)))
        return
    _datasets(args.out / "datasets", max(args.sizes))  # written once, before any timing
    for size in args.sizes:
        _single(args.out / "datasets", size)
    rows = []
    runs = [(size, single) for size in args.sizes for single in (False, True)]
    for size, single in [*runs, *reversed(runs)]:
        env_home = args.out / f"home-{size}-{len(rows)}"
        extra = ["--single"] if single else []
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.mixture_scale",
                "--one",
                str(size),
                *extra,
                "--out",
                str(args.out),
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "HF_LEROBOT_HOME": str(env_home)},
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("| what | frames | open wall s | open CPU s | epoch wall s | epoch CPU s | threads | peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['what']} | {row['frames']} | {row['open_wall_s']:.2f} | {row['open_cpu_s']:.2f} | "
            f"{row['epoch_wall_s']:.2f} | {row['epoch_cpu_s']:.2f} | {row['threads']} | {row['peak_rss_mb']:.0f} |"
        )


if __name__ == "__main__":
    main()
