"""Encoding and reference decoding helpers shared by the mp4 tests (real files, PyAV)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

FPS = 30


def encode_with_pts(
    path: Path,
    frames: np.ndarray,
    encoder: str,
    options: dict[str, str],
    first_pts: int = 0,
    gap_every: int = 0,
    movflags: str | None = None,
) -> Path:
    """Encode frame ``i`` at ``pts = first_pts + i`` (+1 every ``gap_every`` frames: dropped frames).

    A non-zero ``first_pts`` makes the muxer write an empty edit.
    """
    container_options = {"movflags": movflags} if movflags else {}
    with av.open(str(path), "w", options=container_options) as container:
        stream = container.add_stream(encoder, rate=FPS, options=options)
        stream.pix_fmt = "yuv420p"
        stream.height, stream.width = frames.shape[1:3]
        stream.time_base = Fraction(1, FPS)
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = first_pts + i + (i // gap_every if gap_every else 0)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def demuxed_packets(path: Path) -> np.ndarray:
    """``(pts, dts, pos, size, keyframe)`` of every packet of the first video stream, FFmpeg's view."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rows = [
            (packet.pts, packet.dts, packet.pos, packet.size, packet.is_keyframe)
            for packet in container.demux(stream)
            if packet.size
        ]
    return np.array(rows, dtype=np.int64)


def decoded_frames(path: Path | str) -> dict[int, np.ndarray]:
    """Every frame of the whole file, keyed by pts: what the map-style reader decodes."""
    with av.open(str(path)) as container:
        return {
            frame.pts: frame.to_ndarray(format="rgb24")
            for frame in container.decode(container.streams.video[0])
        }
