"""``delta_timestamps`` -> per-key query frames and ``<key>_is_pad`` masks, as LeRobot does.

A window is resolved inside the whole episode: the frame ``anchor + round(delta * fps)`` is
clamped to the episode, and the pad mask is True where clamping happened. This mirrors
LeRobot's map-style ``_get_query_indices`` exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pprint import pformat

import numpy as np

from ..errors import ConfigError

PAD_SUFFIX = "_is_pad"


def pad_key(key: str) -> str:
    """Name of the pad mask returned beside ``key`` (``action`` -> ``action_is_pad``)."""
    return f"{key}{PAD_SUFFIX}"


def check_delta_timestamps(
    delta_timestamps: Mapping[str, Sequence[float]], fps: int, tolerance_s: float
) -> None:
    """Raise ``ConfigError`` (a ``ValueError``, as in LeRobot) listing every delta off the ``1/fps`` grid."""
    outside = {}
    for key, deltas in delta_timestamps.items():
        bad = [d for d in deltas if abs(d * fps - round(d * fps)) / fps > tolerance_s]
        if bad:
            outside[key] = bad
    if outside:
        raise ConfigError(
            "The following delta_timestamps are found outside of tolerance range. "
            f"Please make sure they are multiples of 1/{fps} +/- tolerance ({tolerance_s} s) and adjust "
            f"their values accordingly.\n{pformat(outside)}"
        )


def delta_indices(delta_timestamps: Mapping[str, Sequence[float]], fps: int) -> dict[str, np.ndarray]:
    """Frame offsets per key: ``round(delta * fps)``, order and duplicates preserved."""
    return {key: np.array([round(d * fps) for d in deltas], dtype=np.int64) for key, deltas in delta_timestamps.items()}


@dataclass(frozen=True)
class Window:
    """Frames (episode-relative, clamped into the episode) to read for one key, and the pad mask."""

    frames: np.ndarray
    is_pad: np.ndarray


def resolve_window(frame: int, length: int, offsets: np.ndarray) -> Window:
    """The window of ``offsets`` around ``frame`` of an episode of ``length`` frames."""
    wanted = frame + offsets
    if len(wanted) and wanted.min() >= 0 and wanted.max() < length:
        # Most anchors' windows lie inside the episode: nothing to clamp (a per-sample hot path).
        return Window(frames=wanted, is_pad=np.zeros(len(wanted), dtype=bool))
    return Window(frames=np.clip(wanted, 0, length - 1), is_pad=(wanted < 0) | (wanted >= length))
