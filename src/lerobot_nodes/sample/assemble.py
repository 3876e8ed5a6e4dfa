"""Assemble one LeRobot sample from an episode's rows and a video decoder.

Shared by the map-style reader and the streaming decode mapper, so both return the same
keys, dtypes, shapes and key order as LeRobot's map-style ``LeRobotDataset``:
video keys first, then the data columns, then ``<key>_is_pad`` masks, then ``task``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError, MetadataError
from ..format.depth import DEFAULT_DEPTH_UNIT, DepthQuantization, check_depth_unit, dequantize
from ..format.episode_data import EpisodeData, image_value_to_tensor
from ..format.meta import DatasetMeta
from ..format.mixture import MixtureEpisodeData
from .windows import check_delta_timestamps, delta_indices, pad_key, resolve_window

VideoDecodeFn = Callable[[str, list[float]], Any]
"""``(video_key, episode-relative timestamps) -> (T, C, H, W)`` frames; for the depth cameras of
``SampleSpec.depth_videos`` the ``(T, 1, H, W)`` uint16 codes (``depth=True`` decoding), which
:func:`assemble_sample` dequantises. What is not a tensor (the place in a batch the frames were
written into, :class:`~lerobot_nodes.batch_memory.batch_slots.BatchPlace`) is kept as it is."""


@dataclass(frozen=True)
class SampleSpec:
    """What a sample holds, fixed once per dataset."""

    video_keys: tuple[str, ...]
    image_keys: tuple[str, ...]
    depth_keys: tuple[str, ...]
    tasks: tuple[str, ...]
    offsets: Mapping[str, np.ndarray] | None
    image_transforms: Callable[[Any], Any] | None = None
    depth_videos: Mapping[str, DepthQuantization] = dataclasses.field(default_factory=dict)
    """The video cameras that hold depth maps, with their quantisation (``lerobot_nodes.format.depth``)."""
    depth_output_unit: str = DEFAULT_DEPTH_UNIT

    @classmethod
    def from_meta(
        cls,
        meta: DatasetMeta,
        delta_timestamps: Mapping[str, Sequence[float]] | None,
        tolerance_s: float,
        image_transforms: Callable[[Any], Any] | None = None,
        depth_output_unit: str = DEFAULT_DEPTH_UNIT,
    ) -> SampleSpec:
        offsets = None
        if delta_timestamps is not None:
            unknown = sorted(set(delta_timestamps) - set(meta.features))
            if unknown:
                raise ConfigError(
                    f"delta_timestamps names keys that are not features of {meta.source.url}: {unknown}; "
                    f"features are {sorted(meta.features)}"
                )
            check_delta_timestamps(delta_timestamps, meta.fps, tolerance_s)
            offsets = delta_indices(delta_timestamps, meta.fps)
        return cls(
            video_keys=tuple(meta.video_keys),
            image_keys=tuple(meta.image_keys),
            depth_keys=tuple(meta.depth_keys),
            tasks=tuple(meta.tasks),
            offsets=offsets,
            image_transforms=image_transforms,
            depth_videos={
                key: DepthQuantization.from_feature(key, meta.features[key])
                for key in meta.depth_keys
                if key in meta.video_keys
            },
            depth_output_unit=check_depth_unit(depth_output_unit),
        )

    def camera_window_frames(self) -> int:
        """Consecutive frames the widest camera window spans (1 without camera windows)."""
        spans = [
            int(np.max(offsets)) - int(np.min(offsets)) + 1
            for key, offsets in (self.offsets or {}).items()
            if key in self.video_keys and len(offsets)
        ]
        return max(spans, default=1)

    def camera_frames_asked_once(self) -> bool:
        """Whether a camera frame is asked for by one anchor only: every camera window is the anchor's own
        frame (no window, or offsets ``[0]``), so an epoch, which anchors each frame once, asks for each
        frame once. A window of history, or one offset elsewhere (clamped at an episode's edges), asks
        for some frames again."""
        return all(
            np.array_equal(offsets, [0]) for key, offsets in (self.offsets or {}).items() if key in self.video_keys
        )

    def video_timestamps(self, episode: EpisodeData, frame: int) -> dict[str, list[float]]:
        """Episode-relative timestamps of the frames each camera needs for ``frame``."""
        timestamps = episode.arrays["timestamp"]
        wanted = {}
        for key in self.video_keys:
            if self.offsets is not None and key in self.offsets:
                frames = resolve_window(frame, episode.length, self.offsets[key]).frames
                wanted[key] = [float(t) for t in timestamps[frames]]
            else:
                wanted[key] = [float(timestamps[frame])]
        return wanted


def _row_value(episode: EpisodeData, key: str, frame: int) -> Any:
    if key in episode.arrays:
        # np.array copies the row (or scalar) with its dtype: what torch.tensor() gives, cheaper.
        return torch.from_numpy(np.array(episode.arrays[key][frame]))
    value = episode.objects[key][frame]
    return value


def row_values(spec: SampleSpec, episode: EpisodeData, frame: int) -> dict[str, Any]:
    """The data columns of ``frame`` (delta windows where asked, as tensors), then the pad masks
    of every windowed key: a sample's keys after its cameras and before ``task``."""
    item: dict[str, Any] = {key: _row_value(episode, key, frame) for key in episode.column_order}
    for key in spec.image_keys:
        if key in item:
            item[key] = image_value_to_tensor(item[key], key)
    if spec.offsets is not None:
        queried: dict[str, Any] = {}
        for key, offsets in spec.offsets.items():
            window = resolve_window(frame, episode.length, offsets)
            item[pad_key(key)] = torch.from_numpy(window.is_pad.copy())
            if key in spec.video_keys:
                continue
            if key in episode.arrays:
                queried[key] = torch.from_numpy(np.ascontiguousarray(episode.arrays[key][window.frames]))
            elif key in episode.objects:
                values = [episode.objects[key][f] for f in window.frames]
                queried[key] = (
                    torch.stack([image_value_to_tensor(v, key) for v in values]) if key in spec.image_keys else values
                )
            else:
                raise KeyError(f"delta_timestamps key {key!r} is neither a data column nor a video of the dataset")
        item.update(queried)
    return item


def camera_frames(spec: SampleSpec, episode: EpisodeData, frame: int, decode_video: VideoDecodeFn) -> dict[str, Any]:
    """Each camera's frames for ``frame``: ``(C, H, W)``, or ``(T, C, H, W)`` for a camera window
    (depth cameras dequantised), in ``spec.video_keys`` order."""
    frames = {}
    for key, timestamps in spec.video_timestamps(episode, frame).items():
        decoded = decode_video(key, timestamps)
        if isinstance(decoded, torch.Tensor):
            if key in spec.depth_videos:
                decoded = dequantize(decoded, spec.depth_videos[key], spec.depth_output_unit)
            decoded = decoded.squeeze(0)
        frames[key] = decoded
    return frames


def episode_tasks(spec: SampleSpec, episode: EpisodeData) -> Sequence[str]:
    """The task strings ``episode``'s ``task_index`` values name: its own dataset's in a mixture."""
    return episode.tasks if isinstance(episode, MixtureEpisodeData) else spec.tasks


def task_of(spec: SampleSpec, task_index: int, episode: int, frame: int, tasks: Sequence[str] | None = None) -> str:
    """The task string of ``task_index`` in ``tasks`` (default ``spec.tasks``); a clear error naming
    the episode and frame when there is none."""
    tasks = spec.tasks if tasks is None else tasks
    if not 0 <= task_index < len(tasks):
        raise MetadataError(
            f"episode {episode}, frame {frame}: task_index {task_index} is not in meta/tasks.parquet "
            f"({len(tasks)} tasks)"
        )
    return tasks[task_index]


def dataset_index_of(episode: EpisodeData) -> int | None:
    """The index of the dataset ``episode`` belongs to in a mixture (None outside one)."""
    return episode.dataset_index if isinstance(episode, MixtureEpisodeData) else None


def finish_sample(
    spec: SampleSpec, cameras: Mapping[str, Any], rows: Mapping[str, Any], episode: EpisodeData, frame: int
) -> dict[str, Any]:
    """The sample from its camera frames and :func:`row_values`: cameras first, image transforms
    applied, then ``task`` (and in a mixture ``dataset_index``, int64) last."""
    item = {**cameras, **rows}
    if spec.image_transforms is not None:
        for key in spec.video_keys + spec.image_keys:
            if key not in spec.depth_keys:
                item[key] = spec.image_transforms(item[key])
    item["task"] = task_of(spec, int(item["task_index"]), episode.episode_index, frame, episode_tasks(spec, episode))
    dataset_index = dataset_index_of(episode)
    if dataset_index is not None:  # last, as LeRobot's MultiLeRobotDataset adds it
        item["dataset_index"] = torch.tensor(dataset_index)
    return item


def assemble_sample(spec: SampleSpec, episode: EpisodeData, frame: int, decode_video: VideoDecodeFn) -> dict[str, Any]:
    """The sample of ``frame`` (episode-relative) of ``episode``."""
    rows = row_values(spec, episode, frame)
    cameras = camera_frames(spec, episode, frame, decode_video) if spec.video_keys else {}
    return finish_sample(spec, cameras, rows, episode, frame)
