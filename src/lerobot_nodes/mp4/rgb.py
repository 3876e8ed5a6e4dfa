"""Decoded frames to RGB ``(3, H, W)`` uint8, the values of LeRobot's PyAV backend, cheaply.

LeRobot converts each frame with ``frame.to_ndarray(format="rgb24")`` and permutes it to CHW.
That call builds a new swscale context for every frame (about two thirds of its time on a
240x320 frame) and the permute is a transposing copy. :class:`RgbConverter` keeps one
swscale context per decoder and asks swscale for planar RGB (``gbrp``, planes G, B, R), so
the CHW array is three plain plane copies.

Planar and packed output are the same per-pixel conversion in swscale for the formats video
decoders produce (checked for yuv420p AV1, H.264 and HEVC in the tests, and against LeRobot's
goldens). The converter does not take that on trust: the first frame of every (pixel format,
size, colour space, range) a process sees is converted both ways, and a kind whose planar
result differs by one value is converted through rgb24 from then on.
"""

from __future__ import annotations

import threading

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from .file_video import ONE_SWSCALE_THREAD

_PLANAR_ORDER = (2, 0, 1)
"""``gbrp`` planes holding R, G and B."""

_FrameKind = tuple[str, int, int, int, int]
_planar_agrees: dict[_FrameKind, bool] = {}
_check_lock = threading.Lock()


def _kind(frame: av.VideoFrame) -> _FrameKind:
    return (frame.format.name, frame.width, frame.height, int(frame.colorspace), int(frame.color_range))


class RgbConverter:
    """Converts frames of one decoder; one thread at a time (a decoder's lock serialises it)."""

    __slots__ = ("_reformatter", "_options")

    def __init__(self) -> None:
        self._reformatter = VideoReformatter()
        self._options = {"threads": 1} if ONE_SWSCALE_THREAD else {}

    def __call__(self, frame: av.VideoFrame, out: np.ndarray | None = None) -> np.ndarray:
        """``frame`` as RGB ``(3, H, W)`` uint8, equal to ``to_ndarray(format="rgb24")`` permuted to
        CHW; written into ``out`` (a ``(3, H, W)`` uint8 array) when given, else into a new array."""
        if out is None:
            out = np.empty((3, frame.height, frame.width), dtype=np.uint8)
        kind = _kind(frame)
        agrees = _planar_agrees.get(kind)
        if agrees is None:
            agrees = self._check(frame, kind)
        return self._planar(frame, out) if agrees else self._packed(frame, out)

    def _planar(self, frame: av.VideoFrame, out: np.ndarray) -> np.ndarray:
        converted = self._reformatter.reformat(frame, format="gbrp", **self._options)
        height, width = converted.height, converted.width
        planes = converted.planes
        for channel, index in enumerate(_PLANAR_ORDER):
            plane = planes[index]
            line = plane.line_size
            rows = np.frombuffer(memoryview(plane), dtype=np.uint8, count=height * line)
            out[channel] = rows.reshape(height, width) if line == width else rows.reshape(height, line)[:, :width]
        return out

    def _packed(self, frame: av.VideoFrame, out: np.ndarray) -> np.ndarray:
        rgb = self._reformatter.reformat(frame, format="rgb24", **self._options).to_ndarray()
        out[...] = rgb.transpose(2, 0, 1)
        return out

    def _check(self, frame: av.VideoFrame, kind: _FrameKind) -> bool:
        shape = (3, frame.height, frame.width)
        planar = self._planar(frame, np.empty(shape, dtype=np.uint8))
        agrees = bool(np.array_equal(planar, self._packed(frame, np.empty(shape, dtype=np.uint8))))
        with _check_lock:
            _planar_agrees.setdefault(kind, agrees)
        return agrees


def planar_conversion_agrees(frame: av.VideoFrame) -> bool | None:
    """Whether frames of ``frame``'s kind convert through planar RGB (None: none seen yet)."""
    return _planar_agrees.get(_kind(frame))
