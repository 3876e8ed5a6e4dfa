"""Synthetic LeRobot v3.0 metadata at DROID scale (100k–1M episodes), for tests and benchmarks of opening.

The metadata is faithful to what LeRobot writes (the episodes table split into files, per-episode
``stats/...`` columns, tasks, two cameras); the payload files are empty: only opening the
metadata reads them.
"""

from __future__ import annotations

import functools
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

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


def _file_location(number: int) -> tuple[int, int]:
    return divmod(number, CHUNKS_SIZE)


def _list_array(values: np.ndarray, width: int):
    rows = len(values) // width
    return pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * width), pa.array(values))


def _image_stat_array(values: np.ndarray):
    """(rows, 3) values as list<list<list<double>>> of shape (3, 1, 1) per row."""
    rows = len(values) // 3
    inner = pa.ListArray.from_arrays(pa.array(np.arange(rows * 3 + 1, dtype=np.int32)), pa.array(values))
    middle = pa.ListArray.from_arrays(pa.array(np.arange(rows * 3 + 1, dtype=np.int32)), inner)
    return pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * 3), middle)


def _stats_columns(rows: int, rng: np.random.Generator, features: int | None = None) -> dict:
    columns: dict = {}
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
    names = list(dict.fromkeys(name.split("/")[1] for name in columns))[:features]
    return {name: array for name, array in columns.items() if name.split("/")[1] in names}


def _draw_lengths(rng: np.random.Generator, episodes: int) -> np.ndarray:
    return rng.integers(200, 401, size=episodes).astype(np.int64)


def scale_episode_lengths(episodes: int, seed: int = 0) -> np.ndarray:
    """The episode lengths :func:`write_scale_metadata` writes for ``episodes`` and ``seed`` (the
    rows of episode ``e`` are ``[cumsum[e] - length[e], cumsum[e])``), to check an open against."""
    return _draw_lengths(np.random.default_rng(seed), episodes)


def _empty_files(root: Path, template: str, count: int) -> None:
    """``count`` empty files named by ``template`` (numbered as LeRobot numbers files) under ``root``:
    one ``mkdir`` per chunk folder and one create per file (55,000 payload files at 1M episodes)."""
    made: set[int] = set()
    for number in range(count):
        chunk, file = _file_location(number)
        path = os.path.join(root, template.format(chunk=chunk, file=file))
        if chunk not in made:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            made.add(chunk)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def write_scale_metadata(root: Path, episodes: int, seed: int = 0, stats_features: int | None = None) -> Path:
    """Synthetic v3.0 metadata of ``episodes`` episodes (and an empty payload) at ``root``, laid out as
    LeRobot writes a DROID-sized dataset: 1,000 episodes per ``meta/episodes`` file in row groups of
    10, 200 per data file, 40 per MP4, and per episode the ``stats/...`` columns of the first
    ``stats_features`` features (default all 20: 200 columns). Returns ``root``."""

    rng = np.random.default_rng(seed)
    lengths = _draw_lengths(rng, episodes)
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
    stats_template = _stats_columns(EPISODES_PER_FILE, rng, stats_features)

    def write_episodes_file(number: int) -> None:
        start = number * EPISODES_PER_FILE
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
        pq.write_table(pa.table(columns), path, row_group_size=ROWS_PER_ROW_GROUP, compression="snappy")

    file_count = -(-episodes // EPISODES_PER_FILE)
    for chunk in range(_file_location(file_count - 1)[0] + 1):
        (root / f"meta/episodes/chunk-{chunk:03d}").mkdir(parents=True, exist_ok=True)
    # pyarrow writes without the GIL: a thread per core writes the files (the same bytes in any order).
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        list(pool.map(write_episodes_file, range(file_count)))

    _empty_files(root, "data/chunk-{chunk:03d}/file-{file:03d}.parquet", int(data_file[-1]) + 1)
    for camera in CAMERAS:
        _empty_files(root, f"videos/{camera}/" + "chunk-{chunk:03d}/file-{file:03d}.mp4", int(video_file[-1]) + 1)

    task_table = pa.table({"task_index": pa.array(np.arange(len(tasks), dtype=np.int64)), "task": pa.array(tasks)})
    pq.write_table(task_table, root / "meta" / "tasks.parquet", compression="snappy")
    features: dict[str, dict[str, Any]] = {
        name: {"dtype": "float32", "shape": [width], "names": None} for name, width in VECTOR_FEATURES.items()
    }
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
    return root


def status_kb(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``; Linux), 0 if absent."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


_FIRST_RSS_KB: dict[int, int] = {}


def _measured_call(function: Any, item: Any) -> tuple[Any, int]:
    """``function(item)`` and this process's peak RSS growth in kB since its first call (its VmHWM reset then)."""
    pid = os.getpid()
    if pid not in _FIRST_RSS_KB:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        _FIRST_RSS_KB[pid] = status_kb("VmRSS")
    result = function(item)
    return result, status_kb("VmHWM") - _FIRST_RSS_KB[pid]


class ForkedReaderPeaks:
    """What the forked readers of a ``meta/episodes`` open used, for benchmarks and tests (Linux).

    :meth:`install` wraps ``lerobot_nodes.format.meta.forked_map``: each reader measures its own peak
    RSS growth from its first file on and hands it back beside each result. ``calls`` holds
    ``(readers, the largest reader's growth in kB)`` per forked open, ``items`` every file they read.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.items: list[Any] = []
        self._forked_map: Any = None

    def install(self, meta_module: Any) -> None:
        self._forked_map = meta_module.forked_map
        meta_module.forked_map = self._measured_map

    def _measured_map(self, function: Any, items: Any, processes: int) -> list[Any]:
        pairs = self._forked_map(functools.partial(_measured_call, function), items, processes)
        self.calls.append((processes, max(kb for _, kb in pairs)))
        self.items.extend(file for file, _ in items)  # (the file, the one its reader reads next)
        return [result for result, _ in pairs]
