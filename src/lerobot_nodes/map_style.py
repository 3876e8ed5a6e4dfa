"""The map-style reader: LeRobot's ``LeRobotDataset.__getitem__``, through a byte source.

It is the ``--dataset.streaming=false`` path and the oracle every streaming test compares
against. It reads each data file whole (cached), decodes video like LeRobot's PyAV backend
and returns, key for key, what LeRobot returns.
"""

from __future__ import annotations

import bisect
import io
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from .errors import MetadataError
from .format.dataset_properties import LeRobotDatasetProperties
from .format.depth import DEFAULT_DEPTH_UNIT
from .format.episode_data import EpisodeData
from .format.meta import DatasetMeta, load_meta, select_episodes
from .format.parquet import episode_rows
from .mp4.file_video import FileVideoDecoderCache
from .sample.assemble import SampleSpec, assemble_sample
from .sources import ByteSource
from .sources.resolve import open_source


class MapStyleLeRobotDataset(LeRobotDatasetProperties, Dataset):
    """A LeRobot v3 dataset indexed by frame, with LeRobot's constructor argument names.

    ``dataset[i]`` is the ``i``-th frame of the selected episodes (the global frame index
    when no episode filter is given), returned exactly as LeRobot's map-style dataset
    returns it. Depth cameras come back dequantised, float32 ``(1, H, W)`` in
    ``depth_output_unit`` (``"mm"``, LeRobot's default, or ``"m"``), see :mod:`lerobot_nodes.format.depth`.
    """

    def __init__(
        self,
        repo_id: str | None = None,
        root: str | os.PathLike[str] | ByteSource | None = None,
        episodes: Sequence[int] | None = None,
        image_transforms: Callable[[Any], Any] | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = 1e-4,
        revision: str | None = None,
        return_uint8: bool = False,
        *,
        repo_type: str = "dataset",
        token: str | bool | None = None,
        depth_output_unit: str = DEFAULT_DEPTH_UNIT,
    ) -> None:
        self.repo_id = repo_id
        self.source = open_source(root, repo_id=repo_id, revision=revision, repo_type=repo_type, token=token)
        self.meta: DatasetMeta = load_meta(self.source, repo_id=repo_id)
        self.episodes = select_episodes(self.meta, episodes)
        self.tolerance_s = tolerance_s
        self.return_uint8 = return_uint8
        self.delta_timestamps = delta_timestamps
        self.depth_output_unit = depth_output_unit
        self.spec = SampleSpec.from_meta(
            self.meta, delta_timestamps, tolerance_s, image_transforms, depth_output_unit=depth_output_unit
        )
        lengths = self.meta.episodes.length[self.episodes]
        self._starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        self._decoders = FileVideoDecoderCache(self.source)
        self._tables: OrderedDict[str, pa.Table] = OrderedDict()
        self._episode_cache: OrderedDict[int, EpisodeData] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self._starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """``(episode, frame in episode)`` of the ``index``-th selected frame."""
        if not 0 <= index < self._starts[-1]:
            raise IndexError(f"index {index} out of range for {self._starts[-1]} frames")
        position = bisect.bisect_right(self._starts, index) - 1
        return self.episodes[position], index - int(self._starts[position])

    # -- reading -----------------------------------------------------------------------
    def _data_table(self, path: str) -> pa.Table:
        with self._lock:
            table = self._tables.get(path)
            if table is not None:
                self._tables.move_to_end(path)
                return table
        raw = self.source.read_file(path)
        try:
            table = pq.read_table(io.BytesIO(raw))
        except (pa.ArrowException, OSError) as exc:
            raise MetadataError(f"{path} in {self.source.url} is not a readable Parquet file: {exc}") from None
        with self._lock:
            self._tables[path] = table
            while len(self._tables) > 2:
                self._tables.popitem(last=False)
        return table

    def episode_data(self, episode: int) -> EpisodeData:
        """The converted rows of ``episode`` (cached, a few episodes at a time)."""
        with self._lock:
            cached = self._episode_cache.get(episode)
            if cached is not None:
                self._episode_cache.move_to_end(episode)
                return cached
        path = self.meta.data_file(episode)
        data = episode_rows(self._data_table(path), self.meta, episode, path)
        with self._lock:
            self._episode_cache[episode] = data
            while len(self._episode_cache) > 16:
                self._episode_cache.popitem(last=False)
        return data

    def __getitem__(self, index: int) -> dict[str, Any]:
        episode, frame = self.locate(int(index))
        data = self.episode_data(episode)

        def decode(key: str, timestamps: list[float]) -> torch.Tensor:
            start, stop = self.meta.video_span(episode, key)
            decoder = self._decoders.get(self.meta.video_file(episode, key))
            decoder.check_span(start, stop, episode, key, slack_s=max(self.tolerance_s, 0.5 / self.fps))
            return decoder.decode(
                [start + t for t in timestamps], self.tolerance_s, self.return_uint8, depth=key in self.spec.depth_videos
            )

        return assemble_sample(self.spec, data, frame, decode)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(source={self.source.url!r}, episodes={self.num_episodes}, "
            f"frames={self.num_frames}, features={list(self.features)})"
        )
