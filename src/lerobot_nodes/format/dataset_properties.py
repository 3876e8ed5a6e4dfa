"""The read-only properties LeRobot training reads from any dataset object."""

from __future__ import annotations

from typing import Any

from .meta import DatasetMeta


class LeRobotDatasetProperties:
    """``fps``, ``features``, ``num_episodes`` and ``num_frames`` from ``meta`` and ``episodes``."""

    meta: DatasetMeta
    episodes: list[int]

    @property
    def fps(self) -> int:
        return self.meta.fps

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return self.meta.features

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    @property
    def num_frames(self) -> int:
        """Frames of the selected episodes."""
        return int(self.meta.episodes.length[self.episodes].sum())
