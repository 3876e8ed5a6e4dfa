"""What a decoder needs to know about a clip: where each sample is and when it is presented.

A :class:`ClipLayout` is made once, by :func:`~lerobot_nodes.mp4.plan.plan_clip` from the
source's sample tables (the same tables the clip's ``moov`` is written from), so a decoder of a
planned clip never parses the ``moov`` back. A :class:`Clip` pairs the materialised bytes with
that layout; :func:`~lerobot_nodes.mp4.clip.read_clip_layout` recovers the layout from the bytes
alone for clips that arrive without one (a clip saved to a file, a test).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ClipOrigin:
    """Where a clip's samples come from (also written into the clip's ``uuid`` box)."""

    path: str
    time_offset: int
    """Source pts = clip pts + ``time_offset`` (ticks of the clip's timescale)."""
    source_sample_start: int
    first_needed_pts: int
    last_needed_pts: int
    """Source presentation times of the first and last frame of the planned span."""


@dataclass(frozen=True, eq=False)
class ClipLayout:
    """The samples of one clip, in decode order, on the **source** timeline.

    ``offsets``/``sizes``: each sample's bytes in the clip; ``pts``/``dts``: source
    presentation and decode times (ticks of ``timescale``); ``keyframes``: sync samples.
    ``codec_config`` is the decoder's extradata (the ``av1C``/``avcC``/``hvcC`` payload).
    """

    codec: str
    timescale: int
    codec_config: bytes
    offsets: np.ndarray
    sizes: np.ndarray
    pts: np.ndarray
    dts: np.ndarray
    keyframes: np.ndarray
    origin: ClipOrigin

    @property
    def path(self) -> str:
        return self.origin.path

    def __len__(self) -> int:
        return len(self.sizes)

    def equals(self, other: ClipLayout) -> bool:
        """Same codec, timescale, extradata, origin and per-sample arrays."""
        arrays = ("offsets", "sizes", "pts", "dts", "keyframes")
        return (
            (self.codec, self.timescale, self.codec_config, self.origin)
            == (other.codec, other.timescale, other.codec_config, other.origin)
            and all(np.array_equal(getattr(self, name), getattr(other, name)) for name in arrays)
        )


@dataclass(frozen=True, eq=False)
class Clip:
    """A materialised clip (``data``, a self-contained mini-MP4) and its :class:`ClipLayout`."""

    data: bytes
    layout: ClipLayout

    def __len__(self) -> int:
        return len(self.data)


__all__ = ["Clip", "ClipLayout", "ClipOrigin"]
