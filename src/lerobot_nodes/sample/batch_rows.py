"""A batch's data columns gathered per episode, not per sample.

When batches are assembled in the reader, a decode thread only decodes a sample's camera frames
and hands on a :class:`PartialSample`; the batcher then fills every data column and pad mask of
the whole batch with one numpy gather per (column, episode) (:func:`gather_rows`), straight into
the batch's storage. The values equal :func:`lerobot_nodes.sample.assemble.row_values` of each sample
stacked by ``default_collate`` (the batching tests compare both against the map-style reader);
the per-sample route stays for what a gather cannot hold: columns of Python objects (strings,
embedded images, language) and delta-window keys that are not numeric columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..format.episode_data import EpisodeData
from .assemble import SampleSpec, dataset_index_of, episode_tasks, finish_sample, row_values, task_of
from .windows import pad_key


@dataclass(frozen=True)
class PartialSample:
    """A sample's camera frames (in :func:`~lerobot_nodes.sample.assemble.camera_frames` order), its rows
    still to be gathered with its batch."""

    spec: SampleSpec
    cameras: Mapping[str, Any]
    episode: EpisodeData
    frame: int

    def complete(self) -> dict[str, Any]:
        """The whole sample, as :func:`~lerobot_nodes.sample.assemble.assemble_sample` returns it."""
        return finish_sample(self.spec, self.cameras, row_values(self.spec, self.episode, self.frame), self.episode, self.frame)


RowLayout = list[tuple[str, np.dtype, tuple[int, ...]]]
"""``(key, dtype, shape)`` of each stacked row column and pad mask, in sample key order."""


def row_layout(spec: SampleSpec, episodes: Sequence[EpisodeData], count: int) -> RowLayout | None:
    """The stacked columns of ``count`` samples drawn from ``episodes``; None when they cannot be
    gathered (a column of Python objects, an image feature, a window over a non-numeric key)."""
    first = episodes[0]
    offsets = spec.offsets or {}
    for episode in episodes:
        if episode.objects or episode.column_order != first.column_order:
            return None
    if (
        spec.image_keys
        or "task_index" in offsets
        or any(key not in spec.video_keys and key not in first.arrays for key in offsets)
    ):
        return None
    layout: RowLayout = []
    for key in first.column_order:
        column = first.arrays[key]
        trailing = column.shape[1:]
        if any(episode.arrays[key].shape[1:] != trailing for episode in episodes):
            return None  # the per-sample collate names the key and its shapes
        window = (len(offsets[key]),) if key in offsets and key not in spec.video_keys else ()
        layout.append((key, column.dtype, (count, *window, *trailing)))
    for key, key_offsets in offsets.items():
        layout.append((pad_key(key), np.dtype(np.bool_), (count, len(key_offsets))))
    return layout


def gather_rows(
    spec: SampleSpec, picks: Sequence[tuple[EpisodeData, int]], out: Mapping[str, np.ndarray]
) -> list[str]:
    """Fill ``out`` (arrays shaped as :func:`row_layout` says) with the rows of each ``(episode,
    frame)`` pick, in pick order; returns each pick's task."""
    offsets = spec.offsets or {}
    by_episode: dict[int, tuple[EpisodeData, list[int], list[int]]] = {}
    for position, (episode, frame) in enumerate(picks):
        entry = by_episode.setdefault(id(episode), (episode, [], []))
        entry[1].append(position)
        entry[2].append(frame)
    tasks: list[str] = [""] * len(picks)
    for episode, position_list, frame_list in by_episode.values():
        positions = np.asarray(position_list)
        frames = np.asarray(frame_list)
        last = episode.length - 1
        for key in episode.column_order:
            column = episode.arrays[key]
            if key in offsets and key not in spec.video_keys:
                out[key][positions] = column[np.clip(frames[:, None] + offsets[key], 0, last)]
            else:
                out[key][positions] = column[frames]
        for key, key_offsets in offsets.items():
            wanted = frames[:, None] + key_offsets
            out[pad_key(key)][positions] = (wanted < 0) | (wanted > last)
        names = episode_tasks(spec, episode)
        for position, frame, task_index in zip(
            position_list, frame_list, episode.arrays["task_index"][frames].tolist(), strict=True
        ):
            tasks[position] = task_of(spec, task_index, episode.episode_index, frame, names)
    return tasks


def dataset_indexes(picks: Sequence[tuple[EpisodeData, int]]) -> list[int] | None:
    """Each pick's dataset in a mixture (None outside one): a batch's ``dataset_index`` column."""
    found = [dataset_index_of(episode) for episode, _ in picks]
    return None if any(index is None for index in found) else [int(index) for index in found]  # type: ignore[arg-type]
