"""Write real LeRobotDataset v3.0 folders (Parquet + multi-episode MP4) for tests and demos.

The layout, column names, dtypes, rollover rules and per-episode MP4 handling mirror the
LeRobot v3 writer: episodes are encoded one by one, the first episode of a video file is moved
into place as encoded (``moov`` at the end) and later ones are appended by stream-copy
concatenation (``movflags=faststart``). Data, each camera's videos and the episodes metadata
roll over into new files independently.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot_nodes.errors import DemoWriteError
from lerobot_nodes.home import lerobot_home
from lerobot_nodes.testing.video import (
    Codec,
    concatenate_videos,
    encode_video,
    synthetic_frames,
    video_duration_s,
)

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DEMO_DATASET_NAME = "lerobot-nodes-demo"
DEMO_DATASET_VERSION = "v1"

DEFAULT_TASKS = (
    "pick up the red cube and place it in the bin",
    "open the top drawer",
    "push the blue block to the goal",
)
DEFAULT_CAMERAS = ("observation.images.top", "observation.images.wrist")
SO101_JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
STAT_KEYS = ("min", "max", "mean", "std", "count", *QUANTILES)
# LeRobot's episode-metadata writer buffers this many rows per Parquet write (one row group).
EPISODES_ROWS_PER_ROW_GROUP = 10

_MB = 1024 * 1024
# About 60 % of one camera's demo footage (~0.2 MB), so each camera splits into exactly two MP4s.
_DEMO_VIDEO_MB = 0.12
_ARROW_TYPES = {"float32": pa.float32(), "float64": pa.float64(), "int64": pa.int64(), "bool": pa.bool_()}


@dataclass(frozen=True)
class _Feature:
    """One non-video feature: name, numpy dtype string, shape and per-dimension names."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    names: list[str] | None = None

    @property
    def is_scalar(self) -> bool:
        return self.shape == (1,)

    def spec(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), "names": self.names}

    def arrow_type(self) -> pa.DataType:
        value_type = _ARROW_TYPES[self.dtype]
        return value_type if self.is_scalar else pa.list_(value_type, self.shape[0])

    def hf_spec(self) -> dict[str, Any]:
        value = {"dtype": self.dtype, "_type": "Value"}
        return value if self.is_scalar else {"feature": value, "length": self.shape[0], "_type": "List"}


DEFAULT_FEATURES = (
    _Feature("timestamp", "float32", (1,)),
    _Feature("frame_index", "int64", (1,)),
    _Feature("episode_index", "int64", (1,)),
    _Feature("index", "int64", (1,)),
    _Feature("task_index", "int64", (1,)),
)


@dataclass(frozen=True)
class _Layout:
    """Everything about the dataset that is fixed before the first episode is written."""

    root: Path
    fps: int
    features: tuple[_Feature, ...]
    cameras: tuple[str, ...]
    height: int
    width: int
    codec: Codec
    open_gop: bool
    gop: int | None
    video_faststart: bool
    data_limit_bytes: float
    video_limit_bytes: float
    chunks_size: int
    seed: int


def _next_file(chunk_index: int, file_index: int, chunks_size: int) -> tuple[int, int]:
    """LeRobot's ``update_chunk_file_indices``: next file, wrapping into a new chunk."""
    if file_index == chunks_size - 1:
        return chunk_index + 1, 0
    return chunk_index, file_index + 1


# ----------------------------------------------------------------------------- episode content


def _sub_seed(*keys: int) -> int:
    """A stable 32-bit seed derived from integer keys (independent streams per episode/camera)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1)[0])


def _joint_names(dim: int) -> list[str]:
    if dim == len(SO101_JOINTS):
        return [f"{joint}.pos" for joint in SO101_JOINTS]
    return [f"joint_{i}.pos" for i in range(dim)]


def _build_features(state_dim: int, action_dim: int, extra_features: bool) -> tuple[_Feature, ...]:
    features = [
        _Feature("observation.state", "float32", (state_dim,), _joint_names(state_dim)),
        _Feature("action", "float32", (action_dim,), _joint_names(action_dim)),
    ]
    if extra_features:
        features += [
            _Feature("observation.environment_state", "float64", (3,), ["x", "y", "z"]),
            _Feature("next.reward", "int64", (1,)),
            _Feature("next.done", "bool", (1,)),
        ]
    return (*features, *DEFAULT_FEATURES)


def _smooth_signal(rng: np.random.Generator, length: int, dim: int, fps: int) -> np.ndarray:
    """(length + 1, dim) float64 joint-like trajectories: a few sinusoids plus a slow drift."""
    t = np.arange(length + 1, dtype=np.float64)[:, None] / fps
    amplitude = rng.uniform(0.2, 1.0, size=(3, dim))
    frequency = rng.uniform(0.05, 0.6, size=(3, dim))
    phase = rng.uniform(0.0, 2.0 * np.pi, size=(3, dim))
    waves = amplitude[:, None] * np.sin(2.0 * np.pi * frequency[:, None] * t[None] + phase[:, None])
    drift = rng.normal(0.0, 0.1, size=dim) * t
    return waves.sum(axis=0) / 2.0 + drift


def _episode_columns(
    layout: _Layout, episode_index: int, length: int, first_index: int, task_index: int
) -> dict[str, np.ndarray]:
    """Per-frame values of every non-video feature for one episode, in the feature dtypes."""
    rng = np.random.default_rng(_sub_seed(layout.seed, episode_index, 1))
    frame_index = np.arange(length, dtype=np.int64)
    columns: dict[str, np.ndarray] = {}
    for feature in layout.features:
        if feature.name == "observation.state":
            trajectory = _smooth_signal(rng, length, feature.shape[0], layout.fps)
            columns[feature.name] = trajectory[:-1].astype(np.float32)
        elif feature.name == "action":
            # Actions lead the state by one frame, like a position controller's targets.
            target = _smooth_signal(rng, length, feature.shape[0], layout.fps)[1:]
            columns[feature.name] = (target + rng.normal(0.0, 0.01, target.shape)).astype(np.float32)
        elif feature.name == "observation.environment_state":
            columns[feature.name] = _smooth_signal(rng, length, feature.shape[0], layout.fps)[:-1]
        elif feature.name == "next.reward":
            columns[feature.name] = (frame_index == length - 1).astype(np.int64)
        elif feature.name == "next.done":
            columns[feature.name] = frame_index == length - 1
        elif feature.name == "timestamp":
            columns[feature.name] = (frame_index / layout.fps).astype(np.float32)
        elif feature.name == "frame_index":
            columns[feature.name] = frame_index
        elif feature.name == "episode_index":
            columns[feature.name] = np.full(length, episode_index, dtype=np.int64)
        elif feature.name == "index":
            columns[feature.name] = first_index + frame_index
        elif feature.name == "task_index":
            columns[feature.name] = np.full(length, task_index, dtype=np.int64)
        else:
            raise AssertionError(f"no generator for feature {feature.name}")
    return columns


def _episode_table(layout: _Layout, columns: dict[str, np.ndarray], schema: pa.Schema) -> pa.Table:
    arrays = []
    for feature in layout.features:
        values = columns[feature.name]
        if feature.is_scalar:
            arrays.append(pa.array(values, type=feature.arrow_type()))
        else:
            flat = pa.array(values.reshape(-1), type=_ARROW_TYPES[feature.dtype])
            arrays.append(pa.FixedSizeListArray.from_arrays(flat, feature.shape[0]))
    return pa.Table.from_arrays(arrays, schema=schema)


def _data_schema(features: Sequence[_Feature]) -> pa.Schema:
    """Arrow schema of data files, with the HF ``datasets`` feature metadata LeRobot stores."""
    hf_info = {"info": {"features": {f.name: f.hf_spec() for f in features}}}
    fields = [pa.field(f.name, f.arrow_type()) for f in features]
    return pa.schema(fields, metadata={"huggingface": json.dumps(hf_info)})


# ----------------------------------------------------------------------------- statistics


def _array_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot stat keys over axis 0 of ``values`` (float64), quantiles by linear interpolation."""
    values = values.astype(np.float64)
    stats = {
        "min": values.min(axis=0),
        "max": values.max(axis=0),
        "mean": values.mean(axis=0),
        "std": values.std(axis=0),
        "count": np.array([len(values)], dtype=np.int64),
    }
    quantiles = np.quantile(values, list(QUANTILES.values()), axis=0)
    stats.update(zip(QUANTILES, quantiles, strict=True))
    return stats


def _image_sample_indices(num_frames: int) -> np.ndarray:
    """LeRobot's ``sample_indices``: about ``n**0.75`` evenly spaced frames, at least min(100, n)."""
    min_samples = min(100, num_frames)
    num_samples = max(min_samples, min(int(num_frames**0.75), 10_000))
    return np.round(np.linspace(0, num_frames - 1, num_samples)).astype(int)


def _downsample_for_stats(frames: np.ndarray) -> np.ndarray:
    """LeRobot's ``auto_downsample_height_width``: stride images larger than 300 px to ~150 px."""
    height, width = frames.shape[1:3]
    if max(height, width) < 300:
        return frames
    factor = int(max(height, width) / 150)
    return frames[:, ::factor, ::factor]


def _image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel stats of sampled RGB frames scaled to [0, 1], shaped (3, 1, 1) like LeRobot.

    Computed exactly from 256-bin histograms, which gives the same values as
    ``_array_stats`` on the pixels at a fraction of the cost.
    """
    sampled = _downsample_for_stats(frames[_image_sample_indices(len(frames))])
    channels = np.moveaxis(sampled, -1, 0).reshape(3, -1)
    histograms = np.stack([np.bincount(channel, minlength=256) for channel in channels])
    levels = np.arange(256, dtype=np.float64) / 255.0
    num_pixels = channels.shape[1]
    mean = histograms @ levels / num_pixels
    variance = (histograms * (levels[None, :] - mean[:, None]) ** 2).sum(axis=1) / num_pixels
    cumulative = histograms.cumsum(axis=1)
    present = histograms > 0
    stats = {
        "min": levels[present.argmax(axis=1)],
        "max": levels[255 - present[:, ::-1].argmax(axis=1)],
        "mean": mean,
        "std": np.sqrt(variance),
    }
    for key, q in QUANTILES.items():
        stats[key] = np.array([_sorted_value_interpolated(c, levels, q) for c in cumulative])
    result = {key: value.reshape(3, 1, 1) for key, value in stats.items()}
    result["count"] = np.array([len(sampled)], dtype=np.int64)
    return {key: result[key] for key in STAT_KEYS}


def _sorted_value_interpolated(cumulative: np.ndarray, levels: np.ndarray, q: float) -> float:
    """``np.quantile(values, q)`` (linear method) from the cumulative histogram of the values."""
    position = q * (cumulative[-1] - 1)
    below, above = int(np.floor(position)), int(np.ceil(position))
    low = levels[np.searchsorted(cumulative, below, side="right")]
    high = levels[np.searchsorted(cumulative, above, side="right")]
    return float(low + (high - low) * (position - below))


def _episode_stats(
    layout: _Layout, columns: dict[str, np.ndarray], frames: dict[str, np.ndarray]
) -> dict[str, dict[str, np.ndarray]]:
    """Stats of every feature of one episode, keyed like ``stats.json`` (features order)."""
    stats: dict[str, dict[str, np.ndarray]] = {}
    for feature in layout.features[: -len(DEFAULT_FEATURES)]:
        stats[feature.name] = _array_stats(columns[feature.name].reshape(len(columns["index"]), -1))
    for camera in layout.cameras:
        stats[camera] = _image_stats(frames[camera])
    for feature in DEFAULT_FEATURES:
        values = columns[feature.name]
        if feature.name == "timestamp":
            # LeRobot computes stats on the float64 frame times, before the float32 column cast.
            values = columns["frame_index"] / layout.fps
        stats[feature.name] = _array_stats(values.reshape(-1, 1))
    return stats


def _aggregate_stats(episode_stats: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Combine per-episode stats like LeRobot: exact min/max, count-weighted mean, parallel-formula
    std, summed count, and quantiles as count-weighted averages (as found in LeRobot-written
    ``stats.json`` files)."""
    counts = np.array([s["count"][0] for s in episode_stats], dtype=np.float64)
    shape = (-1,) + (1,) * np.ndim(episode_stats[0]["mean"])
    weights = (counts / counts.sum()).reshape(shape)
    means = np.stack([s["mean"] for s in episode_stats])
    stds = np.stack([s["std"] for s in episode_stats])
    mean = (weights * means).sum(axis=0)
    variance = (weights * (stds**2 + (means - mean) ** 2)).sum(axis=0)
    combined = {
        "min": np.min([s["min"] for s in episode_stats], axis=0),
        "max": np.max([s["max"] for s in episode_stats], axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": np.array([int(counts.sum())], dtype=np.int64),
    }
    for key in QUANTILES:
        combined[key] = (weights * np.stack([s[key] for s in episode_stats])).sum(axis=0)
    return {key: combined[key] for key in STAT_KEYS}


# ----------------------------------------------------------------------------- file writers


class _DataFileWriter:
    """Appends episodes to ``data/chunk-XXX/file-XXX.parquet``, one row group per episode.

    Rolls over (LeRobot's rule) when the current file's size on disk plus its average bytes per
    frame times the incoming episode's frames reaches the size limit.
    """

    def __init__(self, root: Path, schema: pa.Schema, limit_bytes: float, chunks_size: int) -> None:
        self._root = root
        self._schema = schema
        self._limit_bytes = limit_bytes
        self._chunks_size = chunks_size
        self._chunk_index = 0
        self._file_index = 0
        self._frames_in_file = 0
        self._writer: pq.ParquetWriter | None = None

    def _path(self) -> Path:
        return self._root / DATA_PATH.format(chunk_index=self._chunk_index, file_index=self._file_index)

    def _must_roll_over(self, new_frames: int) -> bool:
        size = self._path().stat().st_size
        return size + size / self._frames_in_file * new_frames >= self._limit_bytes

    def add(self, table: pa.Table) -> tuple[int, int]:
        """Write one episode's rows; return the ``(chunk_index, file_index)`` that holds them."""
        if self._writer is not None and self._must_roll_over(table.num_rows):
            self.close()
            self._chunk_index, self._file_index = _next_file(
                self._chunk_index, self._file_index, self._chunks_size
            )
        if self._writer is None:
            self._path().parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self._path(), self._schema, compression="snappy")
            self._frames_in_file = 0
        self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self._frames_in_file += table.num_rows
        return self._chunk_index, self._file_index

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


@dataclass(frozen=True)
class _VideoSpan:
    """Where one episode of one camera lives: file indices and its ``[from, to)`` seconds."""

    chunk_index: int
    file_index: int
    from_timestamp: float
    to_timestamp: float


@dataclass
class _VideoFileWriter:
    """Collects one camera's per-episode MP4s into ``videos/<key>/chunk-XXX/file-XXX.mp4``.

    A file starts when the pending bytes plus the incoming episode's bytes reach the limit
    (LeRobot's video rule, with the concatenated size approximated by the sum of the parts).
    A file of one episode is the episode's MP4 moved into place; several are concatenated by
    stream copy. ``from_timestamp`` accumulates the episodes' ``video_duration_s``.
    """

    root: Path
    video_key: str
    limit_bytes: float
    chunks_size: int
    faststart: bool
    _chunk_index: int = field(default=0, init=False)
    _file_index: int = field(default=0, init=False)
    _pending: list[Path] = field(default_factory=list, init=False)
    _pending_bytes: int = field(default=0, init=False)
    _duration_s: float = field(default=0.0, init=False)

    def _path(self) -> Path:
        return self.root / VIDEO_PATH.format(
            video_key=self.video_key, chunk_index=self._chunk_index, file_index=self._file_index
        )

    def add(self, episode_mp4: Path) -> _VideoSpan:
        """Queue one episode's MP4 (consumed) and return where it will live."""
        size = episode_mp4.stat().st_size
        if self._pending and self._pending_bytes + size >= self.limit_bytes:
            self._flush()
            self._chunk_index, self._file_index = _next_file(
                self._chunk_index, self._file_index, self.chunks_size
            )
        start = self._duration_s
        self._duration_s += video_duration_s(episode_mp4)
        self._pending.append(episode_mp4)
        self._pending_bytes += size
        return _VideoSpan(self._chunk_index, self._file_index, start, self._duration_s)

    def _flush(self) -> None:
        target = self._path()
        target.parent.mkdir(parents=True, exist_ok=True)
        if len(self._pending) == 1:
            shutil.move(self._pending[0], target)
        else:
            concatenate_videos(self._pending, target, faststart=self.faststart)
        self._pending, self._pending_bytes, self._duration_s = [], 0, 0.0

    def close(self) -> None:
        if self._pending:
            self._flush()


# ----------------------------------------------------------------------------- metadata


def _stats_arrow_type(key: str, ndim: int) -> pa.DataType:
    if key == "count":
        return pa.list_(pa.int64())
    value_type: pa.DataType = pa.float64()
    for _ in range(ndim):
        value_type = pa.list_(value_type)
    return value_type


def _episodes_schema(stats_ndims: dict[str, int], cameras: Sequence[str]) -> pa.Schema:
    """Columns and types of ``meta/episodes`` files, in LeRobot's order."""
    int64 = pa.int64()
    fields = [
        pa.field("episode_index", int64),
        pa.field("tasks", pa.list_(pa.string())),
        pa.field("length", int64),
        pa.field("data/chunk_index", int64),
        pa.field("data/file_index", int64),
        pa.field("dataset_from_index", int64),
        pa.field("dataset_to_index", int64),
    ]
    for camera in cameras:
        fields += [
            pa.field(f"videos/{camera}/chunk_index", int64),
            pa.field(f"videos/{camera}/file_index", int64),
            pa.field(f"videos/{camera}/from_timestamp", pa.float64()),
            pa.field(f"videos/{camera}/to_timestamp", pa.float64()),
        ]
    for name, ndim in stats_ndims.items():
        fields += [pa.field(f"stats/{name}/{key}", _stats_arrow_type(key, ndim)) for key in STAT_KEYS]
    fields += [pa.field("meta/episodes/chunk_index", int64), pa.field("meta/episodes/file_index", int64)]
    return pa.schema(fields)


def _write_episodes_metadata(
    root: Path, rows: list[dict[str, Any]], schema: pa.Schema, limit_bytes: float, chunks_size: int
) -> None:
    """Write ``meta/episodes`` files, row groups of 10 rows, rolling over when the in-memory
    size of the file's rows plus one average row reaches the limit (LeRobot's meta rule)."""
    # The meta/episodes/* columns only exist once this rollover is planned, so size rows without them.
    base_schema = pa.schema([f for f in schema if not f.name.startswith("meta/episodes/")])
    files: dict[tuple[int, int], list[dict[str, Any]]] = {}
    location, file_bytes = (0, 0), 0
    for row in rows:
        row_bytes = pa.Table.from_pylist([row], schema=base_schema).nbytes
        rows_in_file = len(files.get(location, []))
        if rows_in_file and file_bytes + file_bytes / rows_in_file >= limit_bytes:
            location, file_bytes = _next_file(*location, chunks_size), 0
        file_bytes += row_bytes
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = location
        files.setdefault(location, []).append(row)
    for (chunk_index, file_index), file_rows in files.items():
        path = root / EPISODES_PATH.format(chunk_index=chunk_index, file_index=file_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(file_rows, schema=schema)
        pq.write_table(table, path, row_group_size=EPISODES_ROWS_PER_ROW_GROUP, compression="snappy")


def _write_tasks(root: Path, tasks: Sequence[str]) -> None:
    """``meta/tasks.parquet`` as pandas writes LeRobot's DataFrame indexed by ``task``."""
    table = pa.table(
        {"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(tasks, pa.string())}
    )
    pandas_metadata = {
        "index_columns": ["task"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": "task",
                "field_name": "task",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
    }
    table = table.replace_schema_metadata({"pandas": json.dumps(pandas_metadata)})
    pq.write_table(table, root / "meta" / "tasks.parquet", compression="snappy")


def _write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=4) + "\n")


def _stats_to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, Any]]:
    return {name: {key: np.asarray(value).tolist() for key, value in s.items()} for name, s in stats.items()}


def _video_info(path: Path, codec: Codec, gop: int | None = None) -> dict[str, Any]:
    """The ``info`` block of a video feature: probed stream facts plus the encoder settings."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        probed = {
            "video.height": stream.height,
            "video.width": stream.width,
            "video.codec": stream.codec_context.codec.canonical_name,
            "video.pix_fmt": stream.pix_fmt,
            "video.fps": int(stream.base_rate or stream.average_rate or 0),
            "video.channels": 3,
            "has_audio": bool(container.streams.audio),
        }
    settings = {"av1": (2, 30, 12), "h264": (30, 23, None), "hevc": (30, 28, None)}[codec]
    return {
        **probed,
        "video.g": settings[0] if gop is None else gop,
        "video.crf": settings[1],
        "video.preset": settings[2],
        "video.fast_decode": 0,
        "video.video_backend": "pyav",
        "video.extra_options": {},
        "is_depth_map": False,
    }


def _info_json(
    layout: _Layout,
    features_spec: dict[str, Any],
    lengths: Sequence[int],
    num_tasks: int,
    data_files_size_in_mb: float,
    video_files_size_in_mb: float,
) -> dict[str, Any]:
    return {
        "codebase_version": CODEBASE_VERSION,
        "fps": layout.fps,
        "features": features_spec,
        "total_episodes": len(lengths),
        "total_frames": int(sum(lengths)),
        "total_tasks": num_tasks,
        "chunks_size": layout.chunks_size,
        "data_files_size_in_mb": data_files_size_in_mb,
        "video_files_size_in_mb": video_files_size_in_mb,
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if layout.cameras else None,
        "robot_type": "lerobot_nodes_synthetic",
        "splits": {"train": f"0:{len(lengths)}"},
    }


def _features_spec(layout: _Layout) -> dict[str, Any]:
    """``info.json`` features in LeRobot order: user features, cameras, then default features."""
    user = layout.features[: -len(DEFAULT_FEATURES)]
    spec = {f.name: f.spec() for f in user}
    for camera in layout.cameras:
        first_file = layout.root / VIDEO_PATH.format(video_key=camera, chunk_index=0, file_index=0)
        spec[camera] = {
            "dtype": "video",
            "shape": [layout.height, layout.width, 3],
            "names": ["height", "width", "channels"],
            "info": _video_info(first_file, layout.codec, layout.gop),
        }
    spec.update({f.name: f.spec() for f in DEFAULT_FEATURES})
    return spec


# ----------------------------------------------------------------------------- public API


def _episode_plan(
    seed: int, num_episodes: int | None, episode_lengths: Sequence[int] | None, num_tasks: int
) -> tuple[list[int], list[int]]:
    """Episode lengths and, per episode, an index into the caller's task list (from ``seed``)."""
    rng = np.random.default_rng(_sub_seed(seed, 0))
    if episode_lengths is None:
        count = 6 if num_episodes is None else num_episodes
        lengths = [int(n) for n in rng.integers(20, 81, size=count)]
    else:
        lengths = [int(n) for n in episode_lengths]
        if num_episodes is not None and num_episodes != len(lengths):
            raise ValueError(f"num_episodes={num_episodes} but {len(lengths)} episode_lengths given")
    if not lengths or min(lengths) < 1:
        raise ValueError(f"need at least one episode and one frame per episode, got lengths {lengths}")
    choices = [int(i) for i in rng.integers(0, num_tasks, size=len(lengths))]
    return lengths, choices


def _index_tasks_by_first_use(tasks: Sequence[str], choices: Sequence[int]) -> tuple[list[str], list[int]]:
    """LeRobot numbers tasks in order of first use: return (tasks table, per-episode task_index)."""
    table: list[str] = []
    for choice in choices:
        if tasks[choice] not in table:
            table.append(tasks[choice])
    return table, [table.index(tasks[choice]) for choice in choices]


def _check_root_is_free(root: Path) -> None:
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"refusing to write a dataset into non-empty directory {root}")
    root.mkdir(parents=True, exist_ok=True)


def write_dataset(
    root: str | os.PathLike[str],
    *,
    num_episodes: int | None = None,
    episode_lengths: Sequence[int] | None = None,
    cameras: Sequence[str] = DEFAULT_CAMERAS,
    height: int = 48,
    width: int = 64,
    fps: int = 30,
    codec: Codec = "av1",
    video_faststart: bool = True,
    state_dim: int = 6,
    action_dim: int = 6,
    tasks: Sequence[str] = DEFAULT_TASKS,
    data_file_size_in_mb: float = 100,
    video_files_size_in_mb: float = 200,
    chunks_size: int = 1000,
    extra_features: bool = False,
    seed: int = 0,
    open_gop: bool = False,
    gop: int | None = None,
) -> Path:
    """Write a LeRobotDataset v3.0 at ``root`` (must be absent or empty) and return its path.

    ``num_episodes`` defaults to 6 with lengths drawn from 20..80; ``episode_lengths`` fixes them.
    Guarantees: LeRobot's v3 layout and column types; one data row group per episode; rows in
    global ``index`` order; ``timestamp = frame_index / fps`` (float32); data, each camera's
    videos and episode metadata roll over independently by the size limits (MB, floats allowed)
    and ``chunks_size``; multi-episode MP4s are stream-copy concatenations (``moov`` first iff
    ``video_faststart``), single-episode MP4s are stored as encoded (``moov`` last);
    ``from_timestamp`` is the summed duration of the preceding episodes in the same MP4. The same
    arguments always produce the same Parquet bytes and decoded frames.
    """
    root = Path(root)
    _check_root_is_free(root)
    if len(set(tasks)) != len(tasks) or not tasks:
        raise ValueError(f"tasks must be distinct and non-empty, got {list(tasks)}")
    lengths, choices = _episode_plan(seed, num_episodes, episode_lengths, len(tasks))
    task_table, task_indices = _index_tasks_by_first_use(tasks, choices)
    layout = _Layout(
        root=root,
        fps=fps,
        features=_build_features(state_dim, action_dim, extra_features),
        cameras=tuple(cameras),
        height=height,
        width=width,
        codec=codec,
        open_gop=open_gop,
        gop=gop,
        video_faststart=video_faststart,
        data_limit_bytes=data_file_size_in_mb * _MB,
        video_limit_bytes=video_files_size_in_mb * _MB,
        chunks_size=chunks_size,
        seed=seed,
    )
    rows, episode_stats = _write_episodes_payload(layout, lengths, task_indices, task_table)

    stats_ndims = {name: np.ndim(s["mean"]) for name, s in episode_stats[0].items()}
    schema = _episodes_schema(stats_ndims, layout.cameras)
    _write_episodes_metadata(root, rows, schema, layout.data_limit_bytes, chunks_size)
    _write_tasks(root, task_table)
    global_stats = {name: _aggregate_stats([s[name] for s in episode_stats]) for name in stats_ndims}
    _write_json(root / "meta" / "stats.json", _stats_to_json(global_stats))
    info = _info_json(
        layout, _features_spec(layout), lengths, len(task_table), data_file_size_in_mb, video_files_size_in_mb
    )
    _write_json(root / "meta" / "info.json", info)
    return root


def _write_episodes_payload(
    layout: _Layout, lengths: Sequence[int], task_indices: Sequence[int], task_table: Sequence[str]
) -> tuple[list[dict[str, Any]], list[dict[str, dict[str, np.ndarray]]]]:
    """Write data Parquet and MP4 files episode by episode; return episode rows and stats."""
    schema = _data_schema(layout.features)
    data_writer = _DataFileWriter(layout.root, schema, layout.data_limit_bytes, layout.chunks_size)
    video_writers = {
        camera: _VideoFileWriter(
            layout.root, camera, layout.video_limit_bytes, layout.chunks_size, layout.video_faststart
        )
        for camera in layout.cameras
    }
    rows: list[dict[str, Any]] = []
    all_stats: list[dict[str, dict[str, np.ndarray]]] = []
    first_index = 0
    with tempfile.TemporaryDirectory(dir=layout.root, prefix=".staging-") as staging:
        for episode_index, (length, task_index) in enumerate(zip(lengths, task_indices, strict=True)):
            columns = _episode_columns(layout, episode_index, length, first_index, task_index)
            chunk_index, file_index = data_writer.add(_episode_table(layout, columns, schema))
            row: dict[str, Any] = {
                "episode_index": episode_index,
                "tasks": [task_table[task_index]],
                "length": length,
                "data/chunk_index": chunk_index,
                "data/file_index": file_index,
                "dataset_from_index": first_index,
                "dataset_to_index": first_index + length,
            }
            frames = {}
            for camera_number, camera in enumerate(layout.cameras):
                frames[camera] = synthetic_frames(
                    length,
                    layout.height,
                    layout.width,
                    seed=_sub_seed(layout.seed, episode_index, 2, camera_number),
                )
                episode_mp4 = Path(staging) / f"{camera}-episode-{episode_index:06d}.mp4"
                encode_video(
                    episode_mp4, frames[camera], layout.fps, layout.codec, g=layout.gop, open_gop=layout.open_gop
                )
                span = video_writers[camera].add(episode_mp4)
                row[f"videos/{camera}/chunk_index"] = span.chunk_index
                row[f"videos/{camera}/file_index"] = span.file_index
                row[f"videos/{camera}/from_timestamp"] = span.from_timestamp
                row[f"videos/{camera}/to_timestamp"] = span.to_timestamp
            stats = _episode_stats(layout, columns, frames)
            for name, feature_stats in stats.items():
                row.update({f"stats/{name}/{key}": feature_stats[key].tolist() for key in STAT_KEYS})
            rows.append(row)
            all_stats.append(stats)
            first_index += length
        data_writer.close()
        for writer in video_writers.values():
            writer.close()
    return rows, all_stats


DEMO_WRITE_ADVICE = (
    "free space there, or point HF_LEROBOT_HOME at a writable disk with a few MB free, or stream your own dataset "
    "with --dataset.root=PATH / --dataset.repo_id=OWNER/NAME"
)


def ensure_demo_dataset() -> Path:
    """Return the demo dataset under ``$HF_LEROBOT_HOME/lerobot-nodes-demo/v1``, writing it once.

    12 episodes, 2 cameras at 96x128, AV1, each camera rolled over into 2 MP4 files. It is
    written beside its final place and renamed into it, so readers never see a partial dataset
    and concurrent callers agree on one copy.
    """
    target = lerobot_home() / DEMO_DATASET_NAME / DEMO_DATASET_VERSION
    if (target / "meta" / "info.json").is_file():
        return target
    made_parent = not target.parent.exists()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{DEMO_DATASET_VERSION}-partial-"))
    except OSError as error:
        raise DemoWriteError(f"cannot write the demo dataset to {target}: {error.strerror or error}; {DEMO_WRITE_ADVICE}") from error
    try:
        write_dataset(staging, num_episodes=12, height=96, width=128, video_files_size_in_mb=_DEMO_VIDEO_MB)
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared like HF's
        os.rename(staging, target)
    except OSError as error:
        # Another process renamed its copy into place first; theirs is equally valid.
        if not (target / "meta" / "info.json").is_file():
            shutil.rmtree(staging, ignore_errors=True)
            if made_parent:
                with contextlib.suppress(OSError):  # left only if empty: another writer may be using it
                    target.parent.rmdir()
            raise DemoWriteError(
                f"cannot write the demo dataset to {target}: {error.strerror or error}; {DEMO_WRITE_ADVICE}"
            ) from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
