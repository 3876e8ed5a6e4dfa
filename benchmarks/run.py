"""Benchmark harness: this project's loader (A) side by side with LeRobot's own loaders (B, C, D).

Run from the repository root (``benchmarks/run.py`` as a script works the same way):

    python -m benchmarks.run --suite quick          # A and D, small dataset, ACT, 0 and 2 workers, 1 run
    python -m benchmarks.run --suite full           # the matrix of benchmarks/speed_results.md (~1 h)
    python -m benchmarks.run --suite lerobot-0.6.1  # A against LeRobot 0.6.1 (B, C): speed_lerobot_0.6.1_results.md

A suite is a preset of the options below; any option given explicitly overrides its preset.

Loaders (each run is a separate subprocess, so imports, workers and memory are measured alone):

* A: ``lerobot_nodes`` through ``drivers/lerobot_nodes_driver.py`` (its ``IMPLEMENTATION`` line
  says whether it is the streaming dataset or the map-style placeholder), under ``/work/venv``;
* B: LeRobot 0.6.1 ``LeRobotDataset`` (map-style, PyAV backend, ``return_uint8``) + ``DataLoader``;
* C: LeRobot 0.6.1 ``StreamingLeRobotDataset`` + ``DataLoader``; B and C under ``/work/lerobot-venv``;
* D: LeRobot's episode streaming (branch ``codex/episode-video-streaming-byte-cache``):
  ``StreamingLeRobotDataset(..., repeat=True)`` + ``DataLoader(num_workers=min(workers, 1))`` as that
  branch's ``lerobot-train`` builds it, under ``/work/lerobot-episode-venv``.

For every repetition the harness walks all configurations and, inside each configuration, runs
the selected loaders back to back (the order rotates per repetition), so machine noise hits all alike.
Before each run the dataset files (and LeRobot's HF ``datasets`` cache) are evicted from the page
cache, so ``read_bytes`` counts real storage reads. One unmeasured warm-up run per dataset and
loader first builds whatever each loader caches on first open (HF Arrow cache, sidecars).

Per run: steady-state samples/s, time to first batch, peak RSS and PSS summed over the driver and
its DataLoader workers (``/proc/<pid>/smaps_rollup`` sampled in a thread), bytes read
(``/proc/<pid>/io`` ``read_bytes`` and ``rchar`` summed over the process tree) against the payload
bytes of the delivered samples, decoded frames per delivered frame (``decode_counter.c`` preloaded
into every driver), batch wait p50/p95/p99. Report: the suite's page (``--report-out``; ``full``:
``benchmarks/speed_results.md`` with plots in ``benchmarks/plots/speed/``; ``quick``: inside the
run directory); raw JSON lines and ``summary.json`` under ``/work/bench-data/results/<run id>/``.
``benchmarks/RESULTS.md`` is written by hand around these pages and is never overwritten.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import datetime as dt
import functools
import itertools
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "drivers"))

import _driver_common as common  # noqa: E402
import bench_data  # noqa: E402

PROJECT_PYTHON = Path(os.environ.get("LRN_PROJECT_PYTHON", "/work/venv/bin/python"))
LEROBOT_PYTHON = Path(os.environ.get("LRN_LEROBOT_PYTHON", "/work/lerobot-venv/bin/python"))
EPISODE_PYTHON = Path(os.environ.get("LRN_LEROBOT_EPISODE_PYTHON", "/work/lerobot-episode-venv/bin/python"))
RESULTS_DIR = bench_data.BENCH_DATA / "results"
BUILD_DIR = bench_data.BENCH_DATA / "build"
HF_HOME = bench_data.BENCH_DATA / "hf-home"

LOADERS = {
    "A": ("lerobot_nodes", "lerobot_nodes_driver.py", PROJECT_PYTHON),
    "B": ("LeRobot map-style", "lerobot_mapstyle_driver.py", LEROBOT_PYTHON),
    "C": ("LeRobot streaming", "lerobot_streaming_driver.py", LEROBOT_PYTHON),
    "D": ("LeRobot episode streaming (branch)", "lerobot_episode_streaming_driver.py", EPISODE_PYTHON),
}
DATASET_CHOICES = ("small", "large", "long-gop")
WINDOWS = ("none", "act", "diffusion")
# Diffusion Policy drops the last 7 frames of each episode from its sampler (LeRobot's
# ``drop_n_last_frames``); ACT and "no window" drop none. Only B has a sampler that takes it.
DROP_N_LAST = {"none": 0, "act": 0, "diffusion": 7}
MB = 1024 * 1024


# ----------------------------------------------------------------------------- helpers
def log(message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", flush=True)


def command_output(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"({' '.join(cmd)} failed: {exc})"


def machine_description() -> dict[str, Any]:
    def python_versions(python: Path, modules: Iterable[str]) -> str:
        code = (
            "import importlib, sys\n"
            "out = [sys.version.split()[0]]\n"
            f"for m in {list(modules)!r}:\n"
            "    try:\n"
            "        out.append(m + ' ' + getattr(importlib.import_module(m), '__version__', '?'))\n"
            "    except Exception as exc:\n"
            "        out.append(m + ' missing (' + type(exc).__name__ + ')')\n"
            "print(', '.join(out))\n"
        )
        return command_output([str(python), "-c", code])

    return {
        "lscpu": command_output(["lscpu"]),
        "memory": command_output(["free", "-h"]),
        "kernel": platform.platform(),
        "nproc": os.cpu_count(),
        "disk": command_output(["df", "-h", str(bench_data.BENCH_DATA)]),
        "project_env": python_versions(
            PROJECT_PYTHON, ["torch", "torchdata", "av", "pyarrow", "lerobot_nodes"]
        ),
        "lerobot_env": python_versions(
            LEROBOT_PYTHON, ["torch", "torchvision", "torchcodec", "av", "datasets", "pyarrow", "lerobot"]
        )
        if LEROBOT_PYTHON.exists()
        else "(not set up)",
        "lerobot_episode_env": python_versions(
            EPISODE_PYTHON, ["torch", "torchvision", "torchcodec", "av", "datasets", "pyarrow", "lerobot"]
        )
        if EPISODE_PYTHON.exists()
        else "(not set up)",
        "ffmpeg": command_output(["ffmpeg", "-hide_banner", "-version"]).splitlines()[:1],
    }


def build_decode_counter() -> Path:
    """Compile ``decode_counter.c`` (gcc) into the bench-data build folder when it changed."""
    source = HERE / "decode_counter.c"
    target = BUILD_DIR / "libdecode_counter.so"
    if target.is_file() and target.stat().st_mtime >= source.stat().st_mtime:
        return target
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", "-o", str(target), str(source), "-ldl", "-lpthread"], check=True
    )
    return target


# ----------------------------------------------------------------------------- datasets
@dataclass
class DatasetFacts:
    name: str
    root: str
    repo_id: str
    fps: int
    camera_keys: list[str]
    features: dict[str, Any]
    total_frames: int
    total_episodes: int
    resolution: str
    payload_bytes: int
    video_payload_bytes: int
    data_payload_bytes: int
    file_bytes: int

    @property
    def payload_per_frame(self) -> float:
        return self.payload_bytes / self.total_frames


def _episodes_table(root: Path) -> dict[str, list[Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(p) for p in sorted((root / "meta" / "episodes").rglob("*.parquet"))]
    table = pa.concat_tables(tables, promote_options="default")
    keep = [c for c in table.column_names if not c.startswith("stats/")]
    return table.select(keep).to_pydict()


def payload_of(dataset: bench_data.BenchDataset) -> DatasetFacts:
    """Bytes of the selected (here: all) episodes: MP4 packets inside each episode's span per camera,
    plus each data Parquet file's bytes apportioned to its episodes by row count. Cached as JSON."""
    import av

    root = dataset.root
    info = json.loads((root / "meta" / "info.json").read_text())
    cameras = [k for k, spec in info["features"].items() if spec.get("dtype") == "video"]
    cache = bench_data.BENCH_DATA / "payload" / f"{dataset.name}.json"
    file_bytes = sum(p.stat().st_size for p in bench_data.dataset_files(root))
    if cache.is_file():
        cached = json.loads(cache.read_text())
        if cached.get("file_bytes") == file_bytes:
            return DatasetFacts(**cached)
    episodes = _episodes_table(root)
    n = len(episodes["episode_index"])
    video_bytes = 0
    for camera in cameras:
        by_file: dict[tuple[int, int], list[int]] = {}
        for i in range(n):
            key = (episodes[f"videos/{camera}/chunk_index"][i], episodes[f"videos/{camera}/file_index"][i])
            by_file.setdefault(key, []).append(i)
        for (chunk, file_index), rows in by_file.items():
            path = root / info["video_path"].format(
                video_key=camera, chunk_index=chunk, file_index=file_index
            )
            times: list[float] = []
            sizes: list[int] = []
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                assert stream.time_base is not None
                for packet in container.demux(stream):
                    if packet.pts is None or packet.size == 0:
                        continue
                    times.append(float(packet.pts * stream.time_base))
                    sizes.append(packet.size)
            order = sorted(range(len(times)), key=times.__getitem__)
            times = [times[i] for i in order]
            cumulative = list(itertools.accumulate((sizes[i] for i in order), initial=0))
            half = 0.5 / info["fps"]
            for i in rows:
                start = bisect.bisect_left(times, episodes[f"videos/{camera}/from_timestamp"][i] - half)
                stop = bisect.bisect_left(times, episodes[f"videos/{camera}/to_timestamp"][i] - half)
                video_bytes += cumulative[stop] - cumulative[start]
    data_bytes = 0
    by_data: dict[tuple[int, int], int] = {}
    for i in range(n):
        key = (episodes["data/chunk_index"][i], episodes["data/file_index"][i])
        by_data[key] = by_data.get(key, 0) + episodes["length"][i]
    for (chunk, file_index), _rows in by_data.items():
        data_bytes += (
            (root / info["data_path"].format(chunk_index=chunk, file_index=file_index)).stat().st_size
        )
    shape = info["features"][cameras[0]]["shape"]
    facts = DatasetFacts(
        name=dataset.name,
        root=str(root),
        repo_id=dataset.repo_id,
        fps=int(info["fps"]),
        camera_keys=cameras,
        features={k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in info["features"].items()},
        total_frames=int(info["total_frames"]),
        total_episodes=int(info["total_episodes"]),
        resolution=f"{len(cameras)} cam {shape[0]}x{shape[1]}",
        payload_bytes=video_bytes + data_bytes,
        video_payload_bytes=video_bytes,
        data_payload_bytes=data_bytes,
        file_bytes=file_bytes,
    )
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(asdict(facts), indent=2) + "\n")
    return facts


def decode_limit(facts: DatasetFacts, seconds: float, redo: bool) -> dict[str, Any]:
    out = bench_data.BENCH_DATA / "decode-limit" / f"{facts.name}.json"
    if out.is_file() and not redo:
        cached = json.loads(out.read_text())
        if "cpu_limit_fps" in cached:
            return cached
    log(f"decode limit of {facts.name} ({seconds:.0f} s per measurement)")
    subprocess.run(
        [
            str(PROJECT_PYTHON),
            str(HERE / "decode_limit.py"),
            "--root",
            facts.root,
            "--seconds",
            str(seconds),
            "--out",
            str(out),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return json.loads(out.read_text())


# ----------------------------------------------------------------------------- memory / io sampling
def _rollup(pid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            text = handle.read()
    except OSError:
        return None
    rss = pss = 0
    for line in text.splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("Pss:"):
            pss = int(line.split()[1]) * 1024
    return rss, pss


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class TreeSampler(threading.Thread):
    """Samples RSS/PSS (summed) and per-process I/O of a process tree until stopped."""

    def __init__(self, root_pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.root_pid = root_pid
        self.interval = interval
        self.peak_rss = self.peak_pss = 0
        self.max_processes = 0
        self.samples = 0
        self.io_last: dict[tuple[int, str | None], dict[str, int]] = {}
        self.cpu_last: dict[tuple[int, str | None], float] = {}
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def sample(self) -> tuple[int, int]:
        rss = pss = 0
        pids = common.process_tree(self.root_pid)
        for pid in pids:
            rollup = _rollup(pid)
            if rollup is not None:
                rss += rollup[0]
                pss += rollup[1]
            io = common.read_io(pid)
            cpu = common.read_cpu(pid)
            key = (pid, _start_time(pid))
            with self._lock:
                if io is not None:
                    self.io_last[key] = io
                if cpu is not None:
                    self.cpu_last[key] = cpu
        with self._lock:
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            self.max_processes = max(self.max_processes, len(pids))
            self.samples += 1
        return rss, pss

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def io_total(self) -> dict[str, float]:
        with self._lock:
            return {
                "read_bytes": sum(v["read_bytes"] for v in self.io_last.values()),
                "rchar": sum(v["rchar"] for v in self.io_last.values()),
                "cpu_s": sum(self.cpu_last.values()),
            }


def machine_busy_s() -> float:
    """CPU seconds all cores spent not idle since boot (``/proc/stat``)."""
    with open("/proc/stat") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / common.CLOCK_TICKS


# ----------------------------------------------------------------------------- one run
@dataclass
class RunSpec:
    loader: str
    dataset: str
    window: str
    num_workers: int
    rep: int
    num_batches: int | None
    warmup: bool = False


def hf_cache_files() -> list[Path]:
    root = HF_HOME / "datasets"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def run_one(spec: RunSpec, facts: DatasetFacts, args: argparse.Namespace, shim: Path, run_dir: Path) -> dict:
    name, script, python = LOADERS[spec.loader]
    config = {
        "repo_id": facts.repo_id,
        "root": facts.root,
        "camera_keys": facts.camera_keys,
        "delta_timestamps": common.delta_timestamps(
            spec.window, facts.fps, facts.camera_keys, facts.features
        ),
        "drop_n_last_frames": DROP_N_LAST[spec.window],
        "num_workers": spec.num_workers,
        "batch_size": args.batch_size,
        "prefetch_factor": args.prefetch_factor,
        "mp_context": args.mp_context,
        "seed": args.seed,
        "num_batches": spec.num_batches,
        "decode_check_batches": args.decode_check_batches,
    }
    counter = run_dir / "decode-counter.bin"
    counter.write_bytes(b"\0" * 8)
    env = dict(os.environ)
    env.update(
        {
            "LD_PRELOAD": str(shim),
            "LRN_DECODE_COUNTER_FILE": str(counter),
            "HF_HOME": str(HF_HOME),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("PYTHONPATH", None)
    dataset_paths = bench_data.dataset_files(Path(facts.root))
    bench_data.evict_from_page_cache(dataset_paths + hf_cache_files())
    tag = "warmup" if spec.warmup else ("epoch" if spec.num_batches is None else f"r{spec.rep}")
    stderr_path = run_dir / "logs" / f"{tag}-{spec.loader}-{facts.name}-{spec.window}-w{spec.num_workers}.log"
    stderr_path.parent.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {**asdict(spec), "loader_name": name, "status": "ok", "log": str(stderr_path)}
    started = time.perf_counter()
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(
            [str(python), str(HERE / "drivers" / script), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            cwd=str(run_dir),
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        sampler = TreeSampler(proc.pid, args.sample_interval)
        lines: list[str] = []

        def read_until(prefix: str, timeout: float) -> str | None:
            reader_result: list[str] = []

            def reader() -> None:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if line.startswith(prefix):
                        reader_result.append(line)
                        return
                    lines.append(line)

            thread = threading.Thread(target=reader, daemon=True)
            thread.start()
            thread.join(timeout)
            return reader_result[0] if reader_result else None

        try:
            if read_until(common.READY, 300) is None:
                raise RuntimeError("driver never became ready")
            base_rss, base_pss = sampler.sample()
            base_io = sampler.io_total()
            sampler.start()
            busy_start, wall_start = machine_busy_s(), time.perf_counter()
            record["loadavg_start"] = Path("/proc/loadavg").read_text().split()[:3]
            proc.stdin.write("go\n")
            proc.stdin.flush()
            line = read_until(common.RESULT, args.run_timeout)
            if line is None:
                raise RuntimeError(f"no result within {args.run_timeout} s")
            sampler.sample()
            sampler.stop()
            record["resident_dataset_bytes"] = bench_data.resident_bytes(dataset_paths)
            record["resident_cache_bytes"] = bench_data.resident_bytes(hf_cache_files())
            record["machine_busy_s"] = machine_busy_s() - busy_start
            record["measure_wall_s"] = time.perf_counter() - wall_start
            record["result"] = json.loads(line[len(common.RESULT) :])
            record["base_rss"], record["base_pss"] = base_rss, base_pss
            record["peak_rss"], record["peak_pss"] = sampler.peak_rss, sampler.peak_pss
            record["max_processes"] = sampler.max_processes
            record["memory_samples"] = sampler.samples
            io_total = sampler.io_total()
            record["io_run"] = {k: io_total[k] - base_io[k] for k in io_total}
            proc.stdin.write("exit\n")
            proc.stdin.flush()
            proc.wait(timeout=120)
        except Exception as exc:  # a failed run is recorded, the matrix goes on
            record["status"] = "error"
            record["error"] = f"{type(exc).__name__}: {exc}"
            if sampler.is_alive():
                sampler.stop()
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait()
    record["returncode"] = proc.returncode
    record["stdout_other"] = lines[-20:]
    record["wall_s"] = time.perf_counter() - started
    if record["status"] == "ok" and proc.returncode not in (0, None):
        record["status"] = "error"
        record["error"] = f"driver exited with {proc.returncode}"
    if record["status"] != "ok":
        tail = stderr_path.read_text(errors="replace").strip().splitlines()[-8:]
        record["error_tail"] = tail
    derive(record, facts)
    return record


@functools.cache
def selection_lengths(root: str) -> tuple[int, ...]:
    """Frame counts of every episode of the dataset at ``root`` (the benchmarks read them all)."""
    return tuple(int(n) for n in _episodes_table(Path(root))["length"])


@functools.cache
def gop_frames(root: str, camera: str) -> int | None:
    """Frames between key frames of ``camera``'s first video file (the median), or None."""
    import av

    files = sorted((Path(root) / "videos" / camera).rglob("*.mp4"))
    if not files:
        return None
    with av.open(str(files[0])) as container:
        keys = [
            i
            for i, packet in enumerate(container.demux(container.streams.video[0]))
            if packet.size and packet.is_keyframe
        ]
    gaps = [b - a for a, b in itertools.pairwise(keys)]
    return int(statistics.median(gaps)) if gaps else None


def mixing_figures(result: dict, facts: DatasetFacts) -> dict[str, Any]:
    """Distinct episodes per batch and same-episode pairs within 5 frames / one GOP, next to a uniform
    shuffle of the same selection and batch size (``lerobot_nodes.batch_mixing``)."""
    mixing = result.get("mixing")
    if not mixing:
        return {}
    from lerobot_nodes.batch_mixing import MixingTally

    tally = MixingTally()
    start = 0
    for size in mixing["sizes"]:
        tally.observe(mixing["episodes"][start : start + size], mixing["frames"][start : start + size])
        start += size
    gop = gop_frames(facts.root, facts.camera_keys[0]) if facts.camera_keys else None
    figures = tally.figures(list(selection_lengths(facts.root)), gop=gop)
    return {
        "distinct_episodes": figures.distinct_episodes,
        "uniform_distinct_episodes": figures.uniform_distinct_episodes,
        "pairs_within_5_pct": 100 * figures.near_pairs,
        "uniform_pairs_within_5_pct": 100 * figures.uniform_near_pairs,
        **(
            {
                "pairs_within_gop_pct": 100 * figures.gop_pairs,
                "uniform_pairs_within_gop_pct": 100 * figures.uniform_gop_pairs,
            }
            if gop
            else {}
        ),
    }


def derive(record: dict, facts: DatasetFacts) -> None:
    """Per-run figures from the raw measurements."""
    result = record.get("result")
    if not result:
        return
    m: dict[str, Any] = {}
    m["samples"] = result["samples"]
    m["samples_per_s"] = result["samples_per_s"]
    m["samples_per_s_e2e"] = result["samples_per_s_e2e"]
    m["ttfb_s"] = result["ttfb_s"]
    m["peak_rss_mb"] = record["peak_rss"] / MB
    m["peak_pss_mb"] = record["peak_pss"] / MB
    m["base_pss_mb"] = record["base_pss"] / MB
    # What the loader adds beyond its imports: peak of the tree (workers included) minus the driver
    # after imports (before the dataset exists).
    m["pss_growth_mb"] = (record["peak_pss"] - record["base_pss"]) / MB
    m["wait_p50_ms"] = _ms(result["wait_p50_s"])
    m["wait_p95_ms"] = _ms(result["wait_p95_s"])
    m["wait_p99_ms"] = _ms(result["wait_p99_s"])
    fps = result["frames_per_sample"]
    m["frames_per_sample"] = fps
    m["read_mb"] = record["io_run"]["read_bytes"] / MB
    wall = record.get("measure_wall_s")
    if wall:
        m["loader_cores"] = record["io_run"]["cpu_s"] / wall
        m["other_cores"] = max(0.0, (record["machine_busy_s"] - record["io_run"]["cpu_s"]) / wall)
    if result.get("cpu_first_s") is not None and result["steady_samples"]:
        m["cpu_ms_per_sample"] = (
            1000 * (result["cpu_end_s"] - result["cpu_first_s"]) / result["steady_samples"]
        )
    m["rchar_mb"] = record["io_run"]["rchar"] / MB
    delivered_payload = result["samples"] * facts.payload_per_frame
    m["read_per_payload"] = record["io_run"]["read_bytes"] / delivered_payload if delivered_payload else None
    m["rchar_per_payload"] = record["io_run"]["rchar"] / delivered_payload if delivered_payload else None
    if record.get("resident_dataset_bytes") is not None:
        dataset_read = record["resident_dataset_bytes"] + (record.get("resident_cache_bytes") or 0)
        m["dataset_read_mb"] = dataset_read / MB
        m["dataset_read_per_payload"] = dataset_read / delivered_payload if delivered_payload else None
    first, end = result.get("io_first"), result.get("io_end")
    steady_payload = result["steady_samples"] * facts.payload_per_frame
    if first and end and steady_payload:
        m["steady_read_per_payload"] = (end["read_bytes"] - first["read_bytes"]) / steady_payload
        m["steady_rchar_per_payload"] = (end["rchar"] - first["rchar"]) / steady_payload
    m.update(decode_figures(result, fps))
    m.update(mixing_figures(result, facts))
    record["metrics"] = m


def decode_figures(result: dict, fps: int) -> dict[str, Any]:
    """Decoded frames per delivered frame: exact (the idle-to-idle check), steady state and whole run."""
    m: dict[str, Any] = {}
    if result.get("decoded_end") is None or result.get("decoded_first") is None:
        return m
    steady_frames = result["steady_samples"] * fps
    if steady_frames:
        m["decoded_per_delivered_steady"] = (result["decoded_end"] - result["decoded_first"]) / steady_frames
    check = result.get("decode_check")
    if check and check["frames"] and check["idle"] and check["decoded"]:
        m["decoded_per_delivered"] = check["decoded"] / check["frames"]
    elif check and check["frames"] and check["idle"] and steady_frames:
        # Nothing decoded for the extra batches: the epoch ended with them already queued (a
        # short dataset, the DataLoader's prefetch queue full), so no batch was started for
        # them. The steady-state count (batches 1..N) stands in.
        m["decoded_per_delivered"] = m["decoded_per_delivered_steady"]
    total_frames = result["samples"] * fps
    if total_frames:
        m["decoded_per_delivered_total"] = (result["decoded_end"] - result["decoded_start"]) / total_frames
    return m


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


# ----------------------------------------------------------------------------- the matrix
def plan(args: argparse.Namespace, datasets: list[DatasetFacts]) -> list[tuple[RunSpec, DatasetFacts]]:
    runs: list[tuple[RunSpec, DatasetFacts]] = []
    loaders = list(args.loaders)
    for facts in datasets:
        for loader in loaders:
            runs.append((RunSpec(loader, facts.name, "none", 0, 0, args.warmup_batches, True), facts))
    for rep in range(args.runs):
        order = loaders[rep % len(loaders) :] + loaders[: rep % len(loaders)]
        for facts in datasets:
            batches = (
                args.batches_small if facts.name == bench_data.small_dataset().name else args.batches_large
            )
            for window in args.windows:
                for workers in args.workers:
                    for loader in order:
                        runs.append((RunSpec(loader, facts.name, window, workers, rep, batches), facts))
    if args.epoch_check:
        small = [f for f in datasets if f.name == bench_data.small_dataset().name]
        for facts in small[:1]:
            for loader in loaders:
                runs.append((RunSpec(loader, facts.name, "none", 2, 0, None), facts))
    return runs


def summarize(records: list[dict]) -> list[dict]:
    """Median (and min/max) of each metric over the repetitions of each configuration."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        if record.get("warmup"):
            continue
        key = (
            record["dataset"],
            record["window"],
            record["num_workers"],
            record["loader"],
            "epoch" if record["num_batches"] is None else "fixed",
        )
        groups.setdefault(key, []).append(record)
    rows = []
    for key, group in groups.items():
        ok = [r for r in group if r["status"] == "ok" and "metrics" in r]
        row: dict[str, Any] = dict(
            zip(("dataset", "window", "num_workers", "loader", "mode"), key, strict=True)
        )
        row["runs"] = len(ok)
        row["failed"] = len(group) - len(ok)
        row["errors"] = sorted({r.get("error", "") for r in group if r["status"] != "ok"})
        row["label"] = next((r["result"]["label"] for r in ok), None)
        row["placeholder"] = any(r["result"]["info"].get("placeholder") for r in ok)
        row["shapes"] = ok[0]["result"]["shapes"] if ok else None
        metrics: dict[str, dict[str, float]] = {}
        for name in ok[0]["metrics"] if ok else {}:
            values = [r["metrics"][name] for r in ok if r["metrics"].get(name) is not None]
            if values:
                metrics[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        row["metrics"] = metrics
        rows.append(row)
    return rows


def merge_runs(run_dirs: list[Path]) -> tuple[dict[str, Any], list[dict]]:
    """One report from several runs (e.g. the matrix and a separate epoch check)."""
    metas = [json.loads((d / "meta.json").read_text()) for d in run_dirs]
    records = [
        json.loads(line)
        for d in run_dirs
        for line in (d / "raw.jsonl").read_text().splitlines()
        if line.strip()
    ]
    for record in records:  # runs recorded before a metric existed get it from their raw figures
        if "metrics" in record and "peak_pss" in record and "base_pss" in record:
            record["metrics"].setdefault("pss_growth_mb", (record["peak_pss"] - record["base_pss"]) / MB)
        if record.get("metrics") and record.get("result"):
            record["metrics"].update(decode_figures(record["result"], record["metrics"]["frames_per_sample"]))
    meta = dict(metas[0])
    meta["runs"] = [{"run_id": m["run_id"], "command": m["command"], "args": m["args"]} for m in metas]
    meta["finished"] = metas[-1].get("finished", "?")
    meta.pop("matrix_wall_s", None)
    meta["matrix_wall_s_each"] = [m.get("matrix_wall_s") for m in metas]
    datasets = {d["name"]: d for m in metas for d in m["datasets"]}
    meta["datasets"] = list(datasets.values())
    meta["decode_limits"] = {k: v for m in metas for k, v in m["decode_limits"].items()}
    return meta, records


# Preset argument sets (``--suite``); an option given on the command line overrides its preset.
# ``full`` is the matrix that produced benchmarks/speed_results.md (run 20261201-135743, issue 12's
# final pass); ``lerobot-0.6.1`` the matrix of benchmarks/speed_lerobot_0.6.1_results.md (issue 7,
# A against LeRobot 0.6.1's map-style and streaming loaders); ``quick`` proves the harness end to
# end in a few minutes and writes its page inside the run directory, leaving benchmarks/ alone.
SUITES: dict[str, dict[str, Any]] = {
    "quick": {
        "loaders": ["A", "D"],
        "datasets": ["small"],
        "windows": ["act"],
        "workers": [0, 2],
        "runs": 1,
        "batches_small": 8,
        "batches_large": 8,
        "epoch_check": False,
        "report_out": None,
    },
    "full": {
        "loaders": ["A", "D"],
        "datasets": ["small", "large", "long-gop"],
        "windows": list(WINDOWS),
        "workers": [0, 2],
        "runs": 3,
        "batches_small": 20,
        "batches_large": 20,
        "epoch_check": False,
        "report_out": HERE / "speed_results.md",
    },
    "lerobot-0.6.1": {
        "loaders": ["A", "B", "C"],
        "datasets": ["small", "large"],
        "windows": list(WINDOWS),
        "workers": [0, 2],
        "runs": 3,
        "batches_small": 12,
        "batches_large": 8,
        "epoch_check": True,
        "report_out": HERE / "speed_lerobot_0.6.1_results.md",
    },
}


def suites_text() -> str:
    lines = ["suites (the options each presets):"]
    for name, preset in SUITES.items():
        options = []
        for key, value in preset.items():
            flag = "--" + key.replace("_", "-")
            if key == "epoch_check":
                options.append(flag if value else "--no-epoch-check")
            elif key == "report_out":
                shown = Path(value).relative_to(HERE.parent) if value else "<run dir>/report.md"
                options.append(f"{flag} {shown}")
            else:
                options.append(f"{flag} {' '.join(map(str, value)) if isinstance(value, list) else value}")
        lines.append(f"  {name}: " + " ".join(options))
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description=__doc__,
        epilog=suites_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--suite",
        choices=sorted(SUITES),
        default="full",
        help="preset of the options below (default: full); explicit options override it",
    )
    parser.add_argument("--quick", action="store_true", help="the same as --suite quick")
    parser.add_argument(
        "--datasets",
        nargs="+",
        choices=DATASET_CHOICES,
        help="small, large (generated AV1), long-gop (generated H.264 g=30 with B-frames, 3 cameras)",
    )
    parser.add_argument("--windows", nargs="+", choices=WINDOWS)
    parser.add_argument("--workers", nargs="+", type=int, help="DataLoader num_workers values")
    parser.add_argument("--loaders", nargs="+", choices=sorted(LOADERS), help="any of A B C D")
    parser.add_argument("--runs", type=int, help="repetitions per configuration, median reported")
    parser.add_argument("--batches-small", type=int, help="batches per run on the small dataset")
    parser.add_argument("--batches-large", type=int, help="batches per run on the generated datasets")
    parser.add_argument("--warmup-batches", type=int, default=2)
    parser.add_argument(
        "--decode-check-batches",
        type=int,
        default=3,
        help="extra batches after the timed ones for the exact decoded/delivered count (0: off)",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--prefetch-factor", type=int, default=4, help="as LeRobot's TrainPipelineConfig")
    parser.add_argument(
        "--mp-context", default="spawn", help="DataLoader worker start method (LeRobot: spawn)"
    )
    parser.add_argument("--seed", type=int, default=1000, help="as LeRobot's TrainPipelineConfig")
    parser.add_argument(
        "--epoch-check",
        action=argparse.BooleanOptionalAction,
        help="also run one full epoch of the small dataset (no window, 2 workers) per loader",
    )
    parser.add_argument("--sample-interval", type=float, default=0.1, help="memory sampling period (s)")
    parser.add_argument("--run-timeout", type=float, default=900)
    parser.add_argument("--decode-seconds", type=float, default=8.0)
    parser.add_argument("--redo-decode-limit", action="store_true")
    parser.add_argument("--no-warmup", action="store_true")
    parser.add_argument(
        "--report-out",
        type=Path,
        help="write the report to this Markdown file, plots beside it under plots/<name without "
        "_results>/ (default: the suite's page; quick: report.md in the run directory)",
    )
    parser.add_argument(
        "--report-only",
        type=Path,
        nargs="+",
        metavar="RUN_DIR",
        help="rebuild the report and plots from finished runs (several: their records are merged)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.suite = "quick"
    args.quick = args.suite == "quick"
    report_out_given = args.report_out is not None
    for name, value in SUITES[args.suite].items():
        if getattr(args, name) is None:
            setattr(args, name, list(value) if isinstance(value, list) else value)
    if args.report_out is not None:
        args.report_out = args.report_out.resolve()
        if args.report_out == HERE / "RESULTS.md":
            parser.error("benchmarks/RESULTS.md is written by hand; the harness writes its suite's page")
    if args.report_only and not report_out_given:
        args.report_out = None  # main() picks the page of the suite the runs were made with
    return args


def invocation(argv: list[str] | None) -> str:
    """The command line as run, the interpreter first (``-m benchmarks.run`` or the script's path)."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    entry = (
        ["-m", "benchmarks.run"]
        if main_spec is not None and main_spec.name == "benchmarks.run"
        else ["benchmarks/run.py"]
    )
    return " ".join(shlex.quote(a) for a in [str(PROJECT_PYTHON), *entry, *(argv or sys.argv[1:])])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = invocation(argv)

    import report  # local module; imported late so --help stays cheap

    if args.report_only:
        meta, records = merge_runs(args.report_only)
        # The page of the suite the runs were made with (runs from before --suite: their own run directory).
        suite_page = SUITES.get(meta["args"].get("suite", ""), {}).get("report_out")
        report_path = args.report_out or suite_page or args.report_only[-1] / "report.md"
        report.write(meta, records, summarize(records), report_path.parent, report_path.name)
        log(f"wrote {report_path}")
        return 0

    for python in sorted({LOADERS[loader][2] for loader in args.loaders} | {PROJECT_PYTHON}):
        if not python.exists():
            raise SystemExit(
                f"{python} is missing; see benchmarks/README.md, 'Setup' (or leave the loaders "
                "that need it out, e.g. --loaders A)"
            )
    run_id = dt.datetime.now().strftime("%Y%m%d-%H%M%S") + ("-quick" if args.quick else "")
    run_dir = RESULTS_DIR / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    report_path = args.report_out or run_dir / "report.md"
    log(f"run {run_id}: raw results in {run_dir}")
    shim = build_decode_counter()
    datasets: list[bench_data.BenchDataset] = []
    if "small" in args.datasets:
        datasets.append(bench_data.small_dataset())
    if "large" in args.datasets:
        datasets.append(bench_data.ensure_large_dataset(log))
    if "long-gop" in args.datasets:
        datasets.append(bench_data.ensure_long_gop_dataset(log))
    facts = [payload_of(d) for d in datasets]
    limits = {f.name: decode_limit(f, args.decode_seconds, args.redo_decode_limit) for f in facts}
    meta = {
        "run_id": run_id,
        "command": command,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine_description(),
        "datasets": [asdict(f) for f in facts],
        "decode_limits": limits,
        "drivers": {k: {"name": v[0], "script": v[1], "python": str(v[2])} for k, v in LOADERS.items()},
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "cwd": os.getcwd(),
        "results_dir": str(RESULTS_DIR),
    }
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    runs = plan(args, facts)
    if args.no_warmup:
        runs = [r for r in runs if not r[0].warmup]
    log(f"{len(runs)} runs planned")
    records: list[dict] = []
    t_start = time.perf_counter()
    with open(run_dir / "raw.jsonl", "w") as raw:
        for i, (spec, dataset_facts) in enumerate(runs, 1):
            record = run_one(spec, dataset_facts, args, shim, run_dir)
            records.append(record)
            raw.write(json.dumps(record) + "\n")
            raw.flush()
            m = record.get("metrics", {})
            what = "warm-up" if spec.warmup else f"rep {spec.rep}"
            if record["status"] == "ok":
                log(
                    f"{i}/{len(runs)} {what} {spec.loader} {spec.dataset} {spec.window} w{spec.num_workers}: "
                    f"{_fmt(m.get('samples_per_s'))} samples/s, ttfb {_fmt(m.get('ttfb_s'))} s, "
                    f"PSS {_fmt(m.get('peak_pss_mb'))} MB, decoded/delivered {_fmt(m.get('decoded_per_delivered'))}, "
                    f"episodes/batch {_fmt(m.get('distinct_episodes'))} (uniform {_fmt(m.get('uniform_distinct_episodes'))}), "
                    f"pairs within 5 frames {_fmt(m.get('pairs_within_5_pct'))} % (uniform {_fmt(m.get('uniform_pairs_within_5_pct'))} %), "
                    f"wall {record['wall_s']:.0f} s"
                )
            else:
                log(
                    f"{i}/{len(runs)} {what} {spec.loader} {spec.dataset} {spec.window} w{spec.num_workers}: "
                    f"FAILED {record.get('error')}"
                )
    meta["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    meta["matrix_wall_s"] = time.perf_counter() - t_start
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    summary = summarize(records)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    report.write(meta, records, summary, report_path.parent, report_path.name)
    log(f"done in {meta['matrix_wall_s'] / 60:.1f} min; wrote {report_path}")
    return 0


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


if __name__ == "__main__":
    raise SystemExit(main())
