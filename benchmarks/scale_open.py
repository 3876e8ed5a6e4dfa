"""How long ``load_meta`` takes to open a DROID-sized dataset, and how much memory it needs.

Writes synthetic LeRobot v3.0 metadata faithful to the on-disk layout: ``meta/info.json`` with
2 cameras and 18 other features, ``meta/episodes/chunk-XXX/file-XXX.parquet`` of 1,000
episodes each in row groups of 10 rows (LeRobot's episode-metadata writer flushes 10 rows at a
time), 217 columns per episode of which 200 are ``stats/<feature>/<stat>`` (20 features x 10
stats, image stats shaped (3, 1, 1) like LeRobot's), ~300 frames per episode, ``tasks.parquet``
and ``stats.json``. The payload is empty files: data rolls over every 200 episodes, each camera's
videos every 40, so the listing ``load_meta`` checks the episodes against is as long as a real
one. Then every (size, mode) is opened in a fresh process:

* ``cold``: the page cache of every ``meta/`` file is dropped first (``posix_fadvise
  DONTNEED``, no root needed), so the metadata is read from disk;
* ``warm``: the files are in the page cache (the process is fresh all the same).

Each child reports the wall time of ``load_meta(LocalSource(root))`` and its CPU time (all
threads; less sensitive than wall time to other work on the machine), the peak RSS growth over
the process's footprint after imports (``VmHWM``), the RSS and PSS left after the open, and a
digest of what was loaded (every episode array and every episode's tasks), so two code
versions can be checked to load the same thing.

    python benchmarks/scale_open.py --episodes 10000 100000
    # the code before a change, from a worktree of HEAD:
    git worktree add /tmp/before HEAD
    python benchmarks/scale_open.py --episodes 10000 100000 --src /tmp/before/src --label before
    git worktree remove /tmp/before

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

EPISODES_PER_FILE = 1000
ROWS_PER_ROW_GROUP = 10
EPISODES_PER_DATA_FILE = 200
EPISODES_PER_VIDEO_FILE = 40
CHUNKS_SIZE = 1000
FPS = 15
CAMERAS = ("observation.images.exterior_1_left", "observation.images.wrist_left")
# 18 non-camera features (DROID-like names and widths) + 2 cameras = 20 features x 10 stats.
VECTOR_FEATURES = {
    "observation.state": 8,
    "observation.state.cartesian_position": 6,
    "observation.state.gripper_position": 1,
    "observation.state.joint_position": 7,
    "action": 8,
    "action.cartesian_position": 6,
    "action.cartesian_velocity": 6,
    "action.gripper_position": 1,
    "action.gripper_velocity": 1,
    "action.joint_position": 7,
    "action.joint_velocity": 7,
    "discount": 1,
    "reward": 1,
    "is_first": 1,
    "timestamp": 1,
    "frame_index": 1,
    "index": 1,
    "task_index": 1,
}
STAT_KEYS = ("min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99")
DEFAULT_ROOT = Path("/tmp/lerobot-nodes-scale-open")


# ----------------------------------------------------------------------------- writing


def _file_location(number: int) -> tuple[int, int]:
    return divmod(number, CHUNKS_SIZE)


def _list_array(values: np.ndarray, width: int):
    import pyarrow as pa

    rows = len(values) // width
    return pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * width), pa.array(values))


def _image_stat_array(values: np.ndarray):
    """(rows, 3) values as list<list<list<double>>> of shape (3, 1, 1) per row."""
    import pyarrow as pa

    rows = len(values) // 3
    inner = pa.ListArray.from_arrays(pa.array(np.arange(rows * 3 + 1, dtype=np.int32)), pa.array(values))
    middle = pa.ListArray.from_arrays(pa.array(np.arange(rows * 3 + 1, dtype=np.int32)), inner)
    return pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * 3), middle)


def _stats_columns(rows: int, rng: np.random.Generator) -> dict:
    columns = {}
    for name, width in VECTOR_FEATURES.items():
        for key in STAT_KEYS:
            if key == "count":
                columns[f"stats/{name}/count"] = _list_array(np.full(rows, 300, dtype=np.int64), 1)
            else:
                columns[f"stats/{name}/{key}"] = _list_array(rng.standard_normal(rows * width), width)
    for camera in CAMERAS:
        for key in STAT_KEYS:
            if key == "count":
                columns[f"stats/{camera}/count"] = _list_array(np.full(rows, 30, dtype=np.int64), 1)
            else:
                columns[f"stats/{camera}/{key}"] = _image_stat_array(rng.random(rows * 3))
    assert len(columns) == 200
    return columns


def write_dataset(root: Path, episodes: int, seed: int = 0) -> None:
    """Synthetic v3.0 metadata of ``episodes`` episodes (and an empty payload) at ``root``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    lengths = rng.integers(200, 401, size=episodes).astype(np.int64)
    to_index = np.cumsum(lengths)
    from_index = to_index - lengths
    tasks = [f"put the {c} object in the {p} (task {i})" for i, (c, p) in
             enumerate((c, p) for c in ("red", "blue", "green", "yellow", "marker", "cup", "lid", "towel")
                       for p in ("bin", "drawer", "bowl", "sink", "box", "left side", "right side"))]
    tasks = (tasks * (max(1, episodes // 20) // len(tasks) + 1))[: max(1, episodes // 20)]
    tasks = [f"{t} #{i}" for i, t in enumerate(tasks)]
    task_of = rng.integers(0, len(tasks), size=episodes)

    episode = np.arange(episodes, dtype=np.int64)
    data_file = episode // EPISODES_PER_DATA_FILE
    video_file = episode // EPISODES_PER_VIDEO_FILE
    durations = lengths / FPS
    # from_timestamp: the summed duration of the preceding episodes in the same MP4.
    starts = np.concatenate([[0.0], np.cumsum(durations)[:-1]])
    first_of_file = (video_file * EPISODES_PER_VIDEO_FILE).astype(np.int64)
    from_ts = starts - starts[first_of_file]
    to_ts = from_ts + durations

    (root / "meta").mkdir(parents=True, exist_ok=True)
    stats_template = _stats_columns(EPISODES_PER_FILE, rng)
    for number, start in enumerate(range(0, episodes, EPISODES_PER_FILE)):
        stop = min(episodes, start + EPISODES_PER_FILE)
        rows = slice(start, stop)
        chunk, file = _file_location(number)
        columns = {
            "episode_index": pa.array(episode[rows]),
            "tasks": pa.array([[tasks[t]] for t in task_of[rows]], pa.list_(pa.string())),
            "length": pa.array(lengths[rows]),
            "data/chunk_index": pa.array(data_file[rows] // CHUNKS_SIZE),
            "data/file_index": pa.array(data_file[rows] % CHUNKS_SIZE),
            "dataset_from_index": pa.array(from_index[rows]),
            "dataset_to_index": pa.array(to_index[rows]),
        }
        for camera in CAMERAS:
            columns[f"videos/{camera}/chunk_index"] = pa.array(video_file[rows] // CHUNKS_SIZE)
            columns[f"videos/{camera}/file_index"] = pa.array(video_file[rows] % CHUNKS_SIZE)
            columns[f"videos/{camera}/from_timestamp"] = pa.array(from_ts[rows])
            columns[f"videos/{camera}/to_timestamp"] = pa.array(to_ts[rows])
        count = stop - start
        for name, array in stats_template.items():
            columns[name] = array.slice(0, count)
        columns["meta/episodes/chunk_index"] = pa.array(np.full(count, chunk, dtype=np.int64))
        columns["meta/episodes/file_index"] = pa.array(np.full(count, file, dtype=np.int64))
        path = root / f"meta/episodes/chunk-{chunk:03d}/file-{file:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns), path, row_group_size=ROWS_PER_ROW_GROUP, compression="snappy")

    for number in range(int(data_file[-1]) + 1):
        chunk, file = _file_location(number)
        path = root / f"data/chunk-{chunk:03d}/file-{file:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    for camera in CAMERAS:
        for number in range(int(video_file[-1]) + 1):
            chunk, file = _file_location(number)
            path = root / f"videos/{camera}/chunk-{chunk:03d}/file-{file:03d}.mp4"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()

    task_table = pa.table({"task_index": pa.array(np.arange(len(tasks), dtype=np.int64)), "task": pa.array(tasks)})
    pq.write_table(task_table, root / "meta" / "tasks.parquet", compression="snappy")
    features = {name: {"dtype": "float32", "shape": [width], "names": None} for name, width in VECTOR_FEATURES.items()}
    for name in ("frame_index", "index", "task_index"):
        features[name] = {"dtype": "int64", "shape": [1], "names": None}
    features["episode_index"] = {"dtype": "int64", "shape": [1], "names": None}
    for camera in CAMERAS:
        features[camera] = {
            "dtype": "video", "shape": [180, 320, 3], "names": ["height", "width", "channels"],
            "info": {"video.height": 180, "video.width": 320, "video.codec": "av1", "video.pix_fmt": "yuv420p",
                     "video.fps": FPS, "video.channels": 3, "has_audio": False},
        }
    info = {
        "codebase_version": "v3.0", "robot_type": "franka", "fps": FPS,
        "total_episodes": episodes, "total_frames": int(lengths.sum()), "total_tasks": len(tasks),
        "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "splits": {"train": f"0:{episodes}"}, "features": features,
    }
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    stats = {name: {k: [0.0] * width if k != "count" else [int(lengths.sum())] for k in STAT_KEYS}
             for name, width in VECTOR_FEATURES.items()}
    (root / "meta" / "stats.json").write_text(json.dumps(stats))
    (root / ".complete").write_text("ok\n")


def dataset_root(base: Path, episodes: int) -> Path:
    return base / f"episodes-{episodes}"


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
    for name in ("episode_index", "length", "dataset_from_index", "dataset_to_index", "data_chunk_index", "data_file_index"):
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


def child(root: Path, mode: str) -> None:
    import lerobot_nodes.format.meta as meta_module
    from lerobot_nodes.sources import LocalSource

    source = LocalSource(root)
    if mode == "cold":
        _drop_page_cache(root)
    base_rss = _status_kb("VmRSS")
    # VmHWM is the process's peak; reset it so the peak is the open's (Linux >= 4.0).
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    started, cpu_started = time.perf_counter(), time.process_time()
    meta = meta_module.load_meta(source)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    peak = _status_kb("VmHWM")
    after_rss = _status_kb("VmRSS")
    pss = _pss_kb()
    result = {
        "module": meta_module.__file__,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "base_rss_mb": base_rss / 1024,
        "peak_rss_mb": peak / 1024,
        "peak_growth_mb": (peak - base_rss) / 1024,
        "after_rss_mb": after_rss / 1024,
        "after_pss_mb": pss / 1024,
        "episodes": len(meta.episodes),
        "bytes_read_mb": source.stats.bytes_read / 2**20,
        "requests": source.stats.requests,
        "digest": _digest(meta),
    }
    print(json.dumps(result))


# ----------------------------------------------------------------------------- driving


def run_child(root: Path, mode: str, src: str | None) -> dict:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(root), "--mode", mode],
        env=env, check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--src", help="put this folder first on PYTHONPATH (e.g. a worktree's src/) for the children")
    parser.add_argument("--label", default="current")
    parser.add_argument("--modes", nargs="+", default=["cold", "warm"], choices=["cold", "warm"])
    parser.add_argument("--repeat", type=int, default=1, help="runs per (size, mode); the best time is shown")
    parser.add_argument("--rewrite", action="store_true")
    parser.add_argument("--json", type=Path, help="append every result as a JSON line to this file")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="warm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.mode)
        return

    for episodes in args.episodes:
        root = dataset_root(args.root, episodes)
        if args.rewrite or not (root / ".complete").exists():
            if root.exists():
                import shutil

                shutil.rmtree(root)
            started = time.perf_counter()
            write_dataset(root, episodes)
            size = sum(p.stat().st_size for p in (root / "meta" / "episodes").rglob("*.parquet"))
            print(f"wrote {root}: {episodes} episodes, meta/episodes {size / 2**20:.0f} MiB "
                  f"in {time.perf_counter() - started:.0f} s", file=sys.stderr)

    header = ("| code | episodes | open | load_meta s | CPU s | peak RSS growth MB | RSS after MB | PSS after MB "
              "| bytes read MiB | requests | digest |")
    print(header)
    print("|" + "---|" * 11)
    for episodes in args.episodes:
        root = dataset_root(args.root, episodes)
        for mode in args.modes:
            runs = [run_child(root, mode, args.src) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["seconds"])
            if args.json:
                with args.json.open("a") as f:
                    for r in runs:
                        f.write(json.dumps({"label": args.label, "episodes": episodes, "mode": mode, **r}) + "\n")
            print(f"| {args.label} | {episodes} | {mode} | {best['seconds']:.2f} | {best.get('cpu_seconds', -1):.2f} "
                  f"| {best['peak_growth_mb']:.0f} "
                  f"| {best['after_rss_mb']:.0f} | {best['after_pss_mb']:.0f} | {best['bytes_read_mb']:.1f} "
                  f"| {best['requests']} | {best['digest']} |", flush=True)


if __name__ == "__main__":
    main()
