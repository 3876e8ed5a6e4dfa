"""How long ``load_meta`` takes to open a DROID-sized dataset, and how much memory it needs.

Writes synthetic LeRobot v3.0 metadata faithful to the on-disk layout: ``meta/info.json`` with
2 cameras and 18 other features, ``meta/episodes/chunk-XXX/file-XXX.parquet`` of 1,000
episodes each in row groups of 10 rows (LeRobot's episode-metadata writer flushes 10 rows at a
time), 217 columns per episode of which 200 are ``stats/<feature>/<stat>`` (20 features x 10
stats, image stats shaped (3, 1, 1) like LeRobot's), ~300 frames per episode, ``tasks.parquet``
and ``stats.json``. The payload is empty files: data rolls over every 200 episodes, each camera's
videos every 40, so the listing ``load_meta`` checks the episodes against is as long as a real
one. Then every (size, mode) is opened in a fresh process, with its own ``$HF_LEROBOT_HOME``:

* ``cold``: the page cache of every ``meta/`` file is dropped first (``posix_fadvise
  DONTNEED``, no root needed) and the table cache is empty, so the metadata is read from disk,
  parsed, and the parsed ``meta/episodes`` table written to the cache (a first open);
* ``parse``: the files are in the page cache, the table cache is empty (the Parquet is parsed
  again; before the table cache this was every open after the first);
* ``warm``: the table cache the ``cold`` open of the same size filled (the page cache of ``meta/``
  dropped again): a second open, or every rank of a node after the first.

Each child reports the wall time of ``load_meta(LocalSource(root))`` and its CPU time (all
threads and reaped child processes; less sensitive than wall time to other work on the machine), the peak RSS growth over
the process's footprint after imports (``VmHWM``), the RSS and PSS left after the open, and a
digest of what was loaded (every episode array and every episode's tasks), so two code
versions can be checked to load the same thing (and a warm open to load what the cold one did).
After the table, the growth exponent of each mode over the sizes (the slope of log time, and of
log peak growth, over log episodes: 1.0 is linear).

    python benchmarks/scale_open.py --episodes 10000 100000
    # 1M episodes (~11 GB of metadata with all 200 stats columns; --stats-features 2 writes 20 of
    # them, ~1.3 GB: a warm open reads none of them, a cold one reads only their footer entries)
    python benchmarks/scale_open.py --episodes 1000000 --stats-features 2 --json results.jsonl
    python benchmarks/scale_open.py --plot-from results.jsonl --plot benchmarks/plots/scale_open/scale_open.png
    # the code before a change, from a worktree of HEAD:
    git worktree add /tmp/before HEAD
    python benchmarks/scale_open.py --episodes 10000 100000 --against /tmp/before/src --repeat 3
    git worktree remove /tmp/before

The files dimension (issue 28): ``--files 100 1000 5000 20000`` times the construction of
``StreamingLeRobotDataset`` and its first sample over datasets of that many MP4 files (one per
episode and camera, ``write_files_dataset``), per phase (``load_meta``, the index open, the whole
construction, the first sample) and with the peak RSS growth, locally (cold: an empty index cache;
warm: the cache a first open filled) and over the loopback Hub with ``--latency-ms`` per request
(the Hub served by this process, the open in a child); then the growth exponent of each phase
(the slope of log time over log files: 1.0 is linear):

    python benchmarks/scale_open.py --files 100 1000 5000 20000 --nofile 1024
    python benchmarks/scale_open.py --files 100 1000 5000 --files-modes hub-cold --latency-ms 50
    # over an S3-compatible server (moto on loopback, LoopbackS3) with --latency-ms per request;
    # s3-warm: the index cache a first open filled, so the listing and metadata are what is left
    python benchmarks/scale_open.py --files 1000 5000 20000 --files-modes s3-warm --latency-ms 20

The datasets are written once under ``--root`` (default ``/tmp/lerobot-nodes-scale-open``) and
reused by later runs (``--rewrite`` writes them again).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from lerobot_nodes.testing.scale import write_scale_metadata as write_dataset  # noqa: E402

DEFAULT_ROOT = Path("/tmp/lerobot-nodes-scale-open")


# ----------------------------------------------------------------------------- writing


def dataset_root(base: Path, episodes: int, stats_features: int | None = None) -> Path:
    return base / (
        f"episodes-{episodes}" if stats_features is None else f"episodes-{episodes}-stats{stats_features}"
    )


# ----------------------------------------------------------------------------- the files dimension

# The dataset of many files: lerobot_nodes.testing.write_files_dataset (the tests use it too).


# ----------------------------------------------------------------------------- measuring (child)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _pss_kb() -> int:
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def _drop_page_cache(root: Path) -> None:
    for path in (root / "meta").rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _digest(meta) -> str:
    episodes = meta.episodes
    h = hashlib.sha256()
    for name in (
        "episode_index",
        "length",
        "dataset_from_index",
        "dataset_to_index",
        "data_chunk_index",
        "data_file_index",
    ):
        h.update(np.ascontiguousarray(getattr(episodes, name), dtype=np.int64).tobytes())
    for key in sorted(episodes.videos):
        spans = episodes.videos[key]
        for array in (spans.chunk_index, spans.file_index):
            h.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
        for array in (spans.from_timestamp, spans.to_timestamp):
            h.update(np.ascontiguousarray(array, dtype=np.float64).tobytes())
    for tasks in episodes.tasks:
        h.update("\x1f".join(tasks).encode() + b"\x1e")
    h.update("\x1e".join(meta.tasks).encode())
    return h.hexdigest()[:12]


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process (all threads) and of its reaped children (a
    parse in forked processes reaps them before it returns)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _growth_cell(result: dict) -> str:
    """The peak growth, then the largest forked reader's over what it inherited, where any ran."""
    child = result.get("child_peak_growth_mb", 0)
    return f"{result['peak_growth_mb']:.0f}" + (f" + children of {child:.0f} each" if child else "")


def child(root: Path, mode: str) -> None:
    import lerobot_nodes.format.meta as meta_module
    from lerobot_nodes.sources import LocalSource

    read_paths: set[str] = set()

    class CountingSource(LocalSource):
        """Notes every file read, so a warm open can show it read no meta/episodes Parquet."""

        def _read_file(self, path):  # type: ignore[no-untyped-def]
            read_paths.add(path)
            return super()._read_file(path)

        def _read_ranges(self, path, ranges):  # type: ignore[no-untyped-def]
            read_paths.add(path)
            return super()._read_ranges(path, ranges)

    # Forked readers (where the open forks them, from lerobot_nodes.testing.scale): each one's peak growth
    # from its first file on, and the files it read (the code before forked readers has neither).
    try:
        from lerobot_nodes.testing.scale import ForkedReaderPeaks
    except ImportError:
        ForkedReaderPeaks = None  # noqa: N806
    readers = ForkedReaderPeaks() if ForkedReaderPeaks is not None and hasattr(meta_module, "forked_map") else None
    if readers is not None:
        readers.install(meta_module)
    source = CountingSource(root)
    if mode in ("cold", "warm"):
        _drop_page_cache(root)
    base_rss = _status_kb("VmRSS")
    # VmHWM is the process's peak; reset it so the peak is the open's (Linux >= 4.0).
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    meta = meta_module.load_meta(source)
    seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu_started
    peak = _status_kb("VmHWM")
    after_rss = _status_kb("VmRSS")
    pss = _pss_kb()
    child_growth_kb = max((kb for _, kb in readers.calls), default=0) if readers is not None else 0
    if readers is not None:
        read_paths.update(item.path for item in readers.items)
    result = {
        "module": meta_module.__file__,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "base_rss_mb": base_rss / 1024,
        "peak_rss_mb": peak / 1024,
        "peak_growth_mb": (peak - base_rss) / 1024,
        # the largest forked reader's (0: none ran; the code before has no meta_module.forked_map)
        "child_peak_growth_mb": child_growth_kb / 1024,
        "after_rss_mb": after_rss / 1024,
        "after_pss_mb": pss / 1024,
        "episodes": len(meta.episodes),
        "parquet_files_read": len({p for p in read_paths if p.startswith("meta/episodes/")}),
        "bytes_read_mb": source.stats.bytes_read / 2**20,
        "requests": source.stats.requests,
        "digest": _digest(meta),
    }
    print(json.dumps(result))


# ----------------------------------------------------------------------------- the files dimension (child)


def files_child(root: str, where: str, nofile: int | None) -> None:
    """Construct ``StreamingLeRobotDataset`` over ``root`` (a local folder or an ``s3://`` URL, or
    ``bench/files`` on the Hub at ``$HF_ENDPOINT``) and take its first sample; time each phase."""
    import resource

    if nofile:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    import lerobot_nodes.dataset as dataset_module

    phases: dict[str, float] = {}

    def timed(name, function):  # type: ignore[no-untyped-def]
        def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - started

        return run

    dataset_module.load_meta = timed("meta_s", dataset_module.load_meta)
    dataset_module.open_video_indexes = timed("index_s", dataset_module.open_video_indexes)
    dataset_module.open_source = timed("source_s", dataset_module.open_source)  # an S3 root's listing
    base_rss = _status_kb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    result: dict = {"module": dataset_module.__file__}
    started = time.perf_counter()
    try:
        if where == "hub":
            dataset = dataset_module.StreamingLeRobotDataset(repo_id="bench/files")
        else:
            dataset = dataset_module.StreamingLeRobotDataset(root=root)
        result["construct_s"] = time.perf_counter() - started
        result["fds_after_open"] = len(os.listdir("/proc/self/fd"))
        result["indexes"] = len(dataset._indexes or {})
        sample = next(iter(dataset))
        result["first_sample_s"] = time.perf_counter() - started
        result["episode"] = int(sample["episode_index"])
        dataset.close()
    except Exception as error:  # reported in the table (e.g. Errno 24 before issue 28)
        result["error"] = f"{type(error).__name__}: {error}"[:120]
    result.update(phases)
    peak = _status_kb("VmHWM")
    result.update(peak_growth_mb=(peak - base_rss) / 1024, after_rss_mb=_status_kb("VmRSS") / 1024)
    print(json.dumps(result))


def files_root(base: Path, files: int) -> Path:
    return base / f"files-{files}"


def run_files_child(
    root: Path | str, where: str, home: Path, src: str | None, nofile: int | None, server_env: dict[str, str]
) -> dict:
    env = dict(os.environ, HF_LEROBOT_HOME=str(home), HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1")
    env.update(server_env)
    if src:
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    command = [sys.executable, __file__, "--files-child", str(root), "--where", where]
    if nofile:
        command += ["--nofile", str(nofile)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def growth_exponent(sizes: list[int], seconds: list[float]) -> float | None:
    """The least-squares slope of log(seconds) over log(files): 1.0 is linear growth."""
    points = [(np.log(n), np.log(t)) for n, t in zip(sizes, seconds, strict=True) if t and t > 0]
    if len(points) < 2:
        return None
    x, y = np.array(points).T
    return float(np.polyfit(x, y, 1)[0])


def _files_row(args: argparse.Namespace, code: str, files: int, label: str, result: dict) -> None:
    """Print one measurement as a table row (and append it to ``--json``)."""
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps({"label": code, "files": files, "mode": label, **result}) + "\n")

    def cell(key: str, digits: int = 2) -> str:
        value = result.get(key)
        return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    print(
        f"| {code} | {files} | {label} | {cell('source_s')} | {cell('meta_s')} | {cell('index_s')} "
        f"| {cell('construct_s')} | {cell('first_sample_s')} | {cell('peak_growth_mb', 0)} | {cell('indexes')} "
        f"| {cell('fds_after_open')} | {cell('mp4_requests')} | {cell('s3_listings')} | {result.get('error', '')} |",
        flush=True,
    )


FILES_PHASES = ("source_s", "meta_s", "index_s", "construct_s", "first_sample_s", "peak_growth_mb")


def run_files(args: argparse.Namespace) -> None:
    """The files dimension: construct-and-first-sample over ``--files`` MP4 counts, per ``--files-modes``."""
    import shutil
    import tempfile

    from lerobot_nodes.testing import write_files_dataset

    for files in args.files:
        root = files_root(args.root, files)
        if args.rewrite or not (root / ".complete").exists():
            started = time.perf_counter()
            write_files_dataset(root, files, frames=30, size=64)
            print(
                f"wrote {root}: {files} MP4 files in {time.perf_counter() - started:.0f} s", file=sys.stderr
            )

    print(
        "| code | files | where | source open s | meta s | index open s | construct s | first sample s "
        "| peak RSS growth MB | indexes open | fds after open | MP4 requests | S3 listings | error |"
    )
    print("|" + "---|" * 14)
    table: dict[tuple[str, str], dict[int, dict]] = {}
    # (label, src): with --against, each run of the code before and of this code alternate, against
    # one server per cell, so load from other work on the machine falls on both sides alike.
    sides = [(args.label, args.src)] + ([(args.against_label, args.against)] if args.against else [])
    for mode in args.files_modes:
        where = mode.split("-")[0]
        label = f"{mode} ({args.latency_ms:g} ms)" if where != "local" else mode
        for files in args.files:
            root = files_root(args.root, files)
            homes = {code: Path(tempfile.mkdtemp(prefix="scale-open-home-")) for code, _ in sides}
            hub = s3 = None
            server_env: dict[str, str] = {}
            opened: Path | str = root
            if where == "hub":
                from lerobot_nodes.testing.hub import LoopbackHub

                hub = LoopbackHub(latency_s=0.0).start()
                hub.add_dataset("bench/files", root)
                server_env["HF_ENDPOINT"] = hub.endpoint
            elif where == "s3":
                from lerobot_nodes.testing.s3 import LoopbackS3

                s3 = LoopbackS3().start()
                opened = f"s3://bench/{root.name}"
                s3.upload(root, opened)
                server_env.update(s3.environment())
            try:
                if mode.endswith("warm"):  # fill each side's index cache first
                    for code, src in sides:
                        run_files_child(opened, where, homes[code], src, None, server_env)
                if hub is not None:
                    hub.latency_s = args.latency_ms / 1000
                if s3 is not None:
                    s3.latency_s = args.latency_ms / 1000
                for repeat in range(args.repeat):
                    for code, src in sides if repeat % 2 == 0 else sides[::-1]:
                        if mode.endswith("cold"):  # an empty index cache for every run
                            shutil.rmtree(homes[code], ignore_errors=True)
                            homes[code].mkdir()
                        if hub is not None:
                            hub.clear_records()
                        if s3 is not None:
                            s3.clear_records()
                        result = run_files_child(opened, where, homes[code], src, args.nofile, server_env)
                        if hub is not None:
                            result["mp4_requests"] = sum(1 for r in hub.records if r.path.endswith(".mp4"))
                        if s3 is not None:
                            result["s3_listings"] = s3.requests["LIST"]
                        _files_row(args, code, files, label, result)
                        best = table.setdefault((label, code), {}).get(files)
                        if best is None or result.get("construct_s", 1e9) < best.get("construct_s", 1e9):
                            table[(label, code)][files] = result
            finally:
                if hub is not None:
                    hub.stop()
                if s3 is not None:
                    s3.stop()
                for home in homes.values():
                    shutil.rmtree(home, ignore_errors=True)
    print()
    print("| code | where | " + " | ".join(f"exponent {p}" for p in FILES_PHASES) + " |")
    print("|" + "---|" * (2 + len(FILES_PHASES)))
    for (label, code), by_files in table.items():
        sizes = sorted(n for n, r in by_files.items() if "error" not in r)
        cells = []
        for phase in FILES_PHASES:
            exponent = growth_exponent(sizes, [by_files[n].get(phase) for n in sizes]) if sizes else None
            cells.append("-" if exponent is None else f"{exponent:.2f}")
        print(f"| {code} | {label} | " + " | ".join(cells) + " |")


# ----------------------------------------------------------------------------- driving


def run_child(root: Path, mode: str, src: str | None, home: Path) -> dict:
    env = dict(os.environ, HF_LEROBOT_HOME=str(home))
    if src:
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(root), "--mode", mode],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["log"] = [line for line in out.stderr.splitlines() if line.strip()]  # e.g. a table cache rebuilt
    return result


def print_exponents(rows: list[dict]) -> None:
    """The growth exponent of each (code, mode) over the sizes measured: wall, CPU and peak growth."""
    groups: dict[tuple[str, str], dict[int, dict]] = {}
    for row in rows:
        groups.setdefault((row["label"], row["mode"]), {})[row["episodes"]] = row
    print()
    print("| code | open | sizes | exponent wall | exponent CPU | exponent peak growth |")
    print("|---|---|---|---|---|---|")
    for (label, mode), by_size in groups.items():
        sizes = sorted(by_size)
        if len(sizes) < 2:
            continue
        cells = [
            growth_exponent(sizes, [by_size[n].get(key) or 0.0 for n in sizes])
            for key in ("seconds", "cpu_seconds", "peak_growth_mb")
        ]
        text = " | ".join("-" if c is None else f"{c:.2f}" for c in cells)
        print(f"| {label} | {mode} | {', '.join(f'{n:,}' for n in sizes)} | {text} |")


def plot(rows: list[dict], target: Path) -> None:
    """Log-log plot of load_meta wall and CPU seconds over episodes, one line per (code, mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], dict[int, dict]] = {}
    for row in rows:
        best = groups.setdefault((row["label"], row["mode"]), {})
        if row["episodes"] not in best or row["seconds"] < best[row["episodes"]]["seconds"]:
            best[row["episodes"]] = row
    figure, (wall, memory) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (label, mode), by_size in sorted(groups.items()):
        sizes = sorted(by_size)
        name = f"{label} {mode}"
        line = wall.plot(sizes, [by_size[n]["seconds"] for n in sizes], marker="o", label=f"{name}: wall")[0]
        wall.plot(
            sizes,
            [by_size[n]["cpu_seconds"] for n in sizes],
            marker="x",
            linestyle="--",
            color=line.get_color(),
            label=f"{name}: CPU",
        )
        memory.plot(sizes, [max(1.0, by_size[n]["peak_growth_mb"]) for n in sizes], marker="o", label=name)
    for axis, title, unit in ((wall, "load_meta time", "seconds"), (memory, "peak RSS growth", "MB")):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("episodes")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
    wall.axhline(10, color="grey", linestyle=":", linewidth=1)
    wall.axhline(20, color="grey", linestyle=":", linewidth=1)
    wall.legend(fontsize=7)
    memory.legend(fontsize=7)
    figure.suptitle("Opening DROID-sized datasets (benchmarks/scale_open.py; 2-core shared machine)")
    figure.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110)
    print(f"wrote {target}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument(
        "--src", help="put this folder first on PYTHONPATH (e.g. a worktree's src/) for the children"
    )
    parser.add_argument("--label", default="current")
    parser.add_argument(
        "--against",
        help="also run the code of this src/ folder (e.g. a worktree of the commit before), each run "
        "alternating with this code's",
    )
    parser.add_argument("--against-label", default="before")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["cold", "warm"],
        choices=["cold", "parse", "warm"],
        help="cold: first open (page cache dropped, empty table cache); parse: page cache warm, "
        "empty table cache; warm: the table cache a cold open filled",
    )
    parser.add_argument(
        "--stats-features",
        type=int,
        help="write the per-episode stats columns of this many features (default all 20: 200 columns)",
    )
    parser.add_argument("--plot", type=Path, help="write a log-log plot of the results to this PNG")
    parser.add_argument(
        "--plot-from", type=Path, help="plot the JSON lines of this file (from --json) instead of running"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per (size, mode); the best time is shown")
    parser.add_argument("--rewrite", action="store_true")
    parser.add_argument("--json", type=Path, help="append every result as a JSON line to this file")
    parser.add_argument(
        "--files",
        type=int,
        nargs="+",
        help="the files dimension instead: MP4 counts (e.g. 100 1000 5000 20000), each a dataset "
        "of files/2 episodes with one MP4 per episode and camera",
    )
    parser.add_argument(
        "--files-modes",
        nargs="+",
        default=["local-cold", "local-warm", "hub-cold"],
        choices=["local-cold", "local-warm", "hub-cold", "hub-warm", "s3-cold", "s3-warm"],
        help="cold: an empty index cache; warm: the cache a first open filled; hub, s3: over the "
        "loopback Hub or an S3-compatible server (served by this process) with --latency-ms per request",
    )
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--nofile", type=int, help="RLIMIT_NOFILE of the measured child (e.g. 1024)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="warm", help=argparse.SUPPRESS)
    parser.add_argument("--files-child", help=argparse.SUPPRESS)
    parser.add_argument("--where", default="local", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.mode)
        return
    if args.files_child is not None:
        files_child(args.files_child, args.where, args.nofile)
        return
    if args.files:
        run_files(args)
        return
    if args.plot_from is not None:
        rows = [json.loads(line) for line in args.plot_from.read_text().splitlines() if line.strip()]
        print_exponents(rows)
        if args.plot:
            plot(rows, args.plot)
        return

    import shutil
    import tempfile

    for episodes in args.episodes:
        root = dataset_root(args.root, episodes, args.stats_features)
        if args.rewrite or not (root / ".complete").exists():
            if root.exists():
                shutil.rmtree(root)
            started = time.perf_counter()
            write_dataset(root, episodes, stats_features=args.stats_features)
            size = sum(p.stat().st_size for p in (root / "meta" / "episodes").rglob("*.parquet"))
            print(
                f"wrote {root}: {episodes} episodes, meta/episodes {size / 2**20:.0f} MiB "
                f"in {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
            )

    header = (
        "| code | episodes | open | load_meta s | CPU s | peak RSS growth MB | RSS after MB | PSS after MB "
        "| bytes read MiB | requests | episode files read | digest |"
    )
    print(header)
    print("|" + "---|" * 12)
    rows: list[dict] = []
    # (label, src): with --against, each run of the code before and of this code alternate, so load
    # from other work on the machine falls on both sides alike.
    sides = [(args.label, args.src)] + ([(args.against_label, args.against)] if args.against else [])
    for episodes in args.episodes:
        root = dataset_root(args.root, episodes, args.stats_features)
        # warm opens map the table the first cold open of this size (and code) wrote into this home
        filled = {label: Path(tempfile.mkdtemp(prefix="scale-open-home-")) for label, _ in sides}
        try:
            modes = list(args.modes)
            if "warm" in modes and ("cold" not in modes or modes.index("warm") < modes.index("cold")):
                for label, src in sides:
                    run_child(root, "cold", src, filled[label])
            for mode in args.modes:
                runs: dict[str, list[dict]] = {label: [] for label, _ in sides}
                for repeat in range(args.repeat):
                    for label, src in sides if repeat % 2 == 0 else sides[::-1]:
                        if mode == "warm":
                            runs[label].append(run_child(root, mode, src, filled[label]))
                            continue
                        empty = Path(tempfile.mkdtemp(prefix="scale-open-home-"))
                        try:
                            runs[label].append(run_child(root, mode, src, empty))
                        finally:
                            if mode == "cold" and not any(filled[label].iterdir()):
                                shutil.rmtree(filled[label])
                                shutil.move(empty, filled[label])
                            shutil.rmtree(empty, ignore_errors=True)
                for label, _ in sides:
                    side_runs = runs[label]
                    best = min(side_runs, key=lambda r: r["seconds"])
                    rows += [{"label": label, "episodes": episodes, "mode": mode, **r} for r in side_runs]
                    if args.json:
                        with args.json.open("a") as f:
                            for r in side_runs:
                                f.write(json.dumps({"label": label, "episodes": episodes, "mode": mode, **r}) + "\n")
                    spread = ""
                    if len(side_runs) > 1:
                        walls = sorted(r["seconds"] for r in side_runs)
                        cpus = sorted(r.get("cpu_seconds", -1) for r in side_runs)
                        spread = f" (runs: {walls[0]:.2f}-{walls[-1]:.2f} s, CPU {cpus[0]:.2f}-{cpus[-1]:.2f} s)"
                    print(
                        f"| {label} | {episodes} | {mode} | {best['seconds']:.2f} "
                        f"| {best.get('cpu_seconds', -1):.2f} | {_growth_cell(best)} "
                        f"| {best['after_rss_mb']:.0f} | {best['after_pss_mb']:.0f} | {best['bytes_read_mb']:.1f} "
                        f"| {best['requests']} | {best.get('parquet_files_read', '-')} | {best['digest']} |{spread}",
                        flush=True,
                    )
        finally:
            for home in filled.values():
                shutil.rmtree(home, ignore_errors=True)
    print_exponents(rows)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
