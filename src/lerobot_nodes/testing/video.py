"""Synthetic camera footage and LeRobot-identical MP4 encoding / concatenation (PyAV).

The encoders reproduce what LeRobot writes so that tests exercise real-world byte layouts:
AV1 via ``libsvtav1`` (g=2, crf=30, preset=12, ``svtav1-params=fast-decode=0:lp=1``) or H.264
via ``libx264`` defaults (B-frames, preset medium). Streams use time base ``1/fps`` and
``pts = frame number``. Concatenation is LeRobot's stream copy through the concat demuxer,
written with ``movflags=faststart``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Literal

import av
import numpy as np

Codec = Literal["av1", "h264", "hevc"]

# Frames are synthesised in blocks so memory stays bounded for long or large clips.
_FRAMES_PER_BLOCK = 32


def synthetic_frames(
    num_frames: int, height: int, width: int, seed: int = 0, start_frame: int = 0
) -> np.ndarray:
    """Return ``(num_frames, height, width, 3)`` uint8 RGB frames of smooth moving content.

    Content is scrolling sinusoidal gradients, a moving disc and a mild low-frequency texture,
    so it compresses like camera footage rather than noise. Frame ``t`` depends only on
    ``(seed, start_frame + t, height, width)``: a clip starting at ``start_frame=k`` equals
    frames ``k..`` of a longer clip with the same seed.
    """
    if num_frames < 0 or height <= 0 or width <= 0:
        raise ValueError(f"invalid frame geometry: {num_frames=} {height=} {width=}")
    rng = np.random.default_rng(seed)
    phases = rng.uniform(0.0, 2.0 * np.pi, size=6).astype(np.float32)
    speeds = rng.uniform(0.01, 0.03, size=3).astype(np.float32)
    base_color = rng.uniform(70.0, 150.0, size=3).astype(np.float32)
    disc_color = rng.uniform(0.0, 255.0, size=3).astype(np.float32)
    texture = _low_frequency_texture(rng, height, width)

    out = np.empty((num_frames, height, width, 3), dtype=np.uint8)
    for block_start in range(0, num_frames, _FRAMES_PER_BLOCK):
        block_end = min(block_start + _FRAMES_PER_BLOCK, num_frames)
        t = np.arange(start_frame + block_start, start_frame + block_end, dtype=np.float32)
        out[block_start:block_end] = _render_block(
            t, height, width, phases, speeds, base_color, disc_color, texture
        )
    return out


def _low_frequency_texture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Smooth random texture in [-1, 1], shape (H, 2W) so it can scroll horizontally."""
    coarse = rng.uniform(-1.0, 1.0, size=(height // 8 + 2, (2 * width) // 8 + 2)).astype(np.float32)
    ys = np.linspace(0.0, coarse.shape[0] - 1.001, height, dtype=np.float32)
    xs = np.linspace(0.0, coarse.shape[1] - 1.001, 2 * width, dtype=np.float32)
    y0, x0 = ys.astype(np.int64), xs.astype(np.int64)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = coarse[y0][:, x0] * (1 - fx) + coarse[y0][:, x0 + 1] * fx
    bottom = coarse[y0 + 1][:, x0] * (1 - fx) + coarse[y0 + 1][:, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


def _render_block(
    t: np.ndarray,
    height: int,
    width: int,
    phases: np.ndarray,
    speeds: np.ndarray,
    base_color: np.ndarray,
    disc_color: np.ndarray,
    texture: np.ndarray,
) -> np.ndarray:
    """Render frames at absolute frame numbers ``t`` as uint8 (T, H, W, 3)."""
    tt = t[:, None, None]
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[None, :, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, None, :]
    two_pi = np.float32(2.0 * np.pi)
    channels = [
        np.sin(two_pi * (1.3 * x + 0.4 * y + speeds[0] * tt) + phases[0]),
        np.sin(two_pi * (0.9 * y - 0.3 * x + speeds[1] * tt) + phases[1]),
        np.sin(two_pi * (0.7 * (x + y) - speeds[2] * tt) + phases[2]),
    ]
    img = base_color + 45.0 * np.stack(channels, axis=-1)

    shift = (t.astype(np.int64) // 2) % width
    cols = (np.arange(width)[None, :] + shift[:, None]) % (2 * width)
    img += 12.0 * texture[:, cols].transpose(1, 0, 2)[..., None]

    cy = 0.5 + 0.3 * np.sin(0.05 * t + phases[3])
    cx = 0.5 + 0.35 * np.sin(0.037 * t + phases[4])
    radius = 0.18 + 0.04 * np.sin(0.07 * t + phases[5])
    aspect = np.float32(width / height)
    dist2 = (y - cy[:, None, None]) ** 2 + ((x - cx[:, None, None]) * aspect) ** 2
    # Soft edge (about two pixels) avoids aliasing artefacts that would inflate the bitrate.
    edge = np.float32(2.0 / height)
    inside = np.clip((radius[:, None, None] - np.sqrt(dist2)) / edge + 0.5, 0.0, 1.0)[..., None]
    img = img * (1.0 - inside) + disc_color * inside
    return np.clip(img, 0.0, 255.0).astype(np.uint8)


def _encoder_settings(
    codec: Codec, g: int | None, crf: int | None, open_gop: bool, bframes: int | None
) -> tuple[str, dict[str, str]]:
    """Return the PyAV encoder name and codec options LeRobot would use."""
    if codec == "av1":
        if open_gop:
            raise ValueError("open_gop is only supported for h264")
        options = {
            "g": str(2 if g is None else g),
            "crf": str(30 if crf is None else crf),
            "preset": "12",
            # lp=1: one encoder thread. SVT-AV1's thread pool deadlocks now and then while flushing
            # (seen here in svt_av1_enc_get_packet); single-threaded it did not in 2,000 encodes
            # under load, and tiny test clips encode ~3x faster. The bitstream layout LeRobot
            # writes (g=2, crf=30, preset 12) is unchanged.
            "svtav1-params": "fast-decode=0:lp=1",
        }
        return "libsvtav1", options
    if codec == "h264":
        options = {"g": str(30 if g is None else g), "crf": str(23 if crf is None else crf)}
        if bframes is not None:
            options["bf"] = str(bframes)
        if open_gop:
            options["x264-params"] = "open-gop=1"
        return "libx264", options
    if codec == "hevc":
        if open_gop:
            raise ValueError("open_gop is only supported for h264")
        options = {"g": str(30 if g is None else g), "crf": str(28 if crf is None else crf)}
        params = ["log-level=none"]
        if bframes is not None:
            params.append(f"bframes={bframes}")
        options["x265-params"] = ":".join(params)
        return "libx265", options
    raise ValueError(f"unsupported codec {codec!r}; expected 'av1', 'h264' or 'hevc'")


def encode_video(
    path: str | os.PathLike[str],
    frames: np.ndarray,
    fps: int = 30,
    codec: Codec = "av1",
    *,
    g: int | None = None,
    crf: int | None = None,
    open_gop: bool = False,
    faststart: bool = False,
    bframes: int | None = None,
) -> Path:
    """Encode ``(T, H, W, 3)`` uint8 RGB frames into an MP4 at ``path`` the way LeRobot does.

    Guarantees: pix_fmt yuv420p, stream time base ``1/fps``, frame ``i`` has ``pts = i``,
    ``moov`` at the end of the file unless ``faststart`` (then ``moov`` precedes ``mdat``).
    ``g``/``crf`` default to LeRobot's AV1 settings (2/30), x264-style H.264 (30/23) or x265
    HEVC (30/28; B-frames, closed GOP as x265 defaults).
    Returns the written path.
    """
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
    if len(frames) == 0:
        raise ValueError("cannot encode an empty clip")
    encoder, codec_options = _encoder_settings(codec, g, crf, open_gop, bframes)
    out_path = Path(path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    container_options = {"movflags": "faststart"} if faststart else {}
    # SVT-AV1 prints its whole configuration at every encoder start unless told to keep to errors;
    # it reads SVT_LOG when an encoder is created, so setting it here is enough.
    os.environ.setdefault("SVT_LOG", "1")
    with av.open(str(out_path), mode="w", options=container_options) as container:
        stream = container.add_stream(encoder, rate=fps, options=codec_options)
        assert isinstance(stream, av.VideoStream)
        stream.pix_fmt = "yuv420p"
        stream.height = int(frames.shape[1])
        stream.width = int(frames.shape[2])
        stream.time_base = Fraction(1, fps)
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return out_path


def _concat_list_line(path: Path) -> str:
    # ffconcat quoting: a single quote is written as '\'' inside a quoted string.
    quoted = str(path.resolve()).replace("'", "'\\''")
    return f"file '{quoted}'\n"


def concatenate_videos(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    faststart: bool = True,
) -> Path:
    """Concatenate MP4s by stream copy (no re-encode), like LeRobot's ``concatenate_video_files``.

    Uses the FFmpeg concat demuxer and remuxes every packet with a DTS into a stream created
    from the input template; the output time base equals the input's. With ``faststart`` (the
    LeRobot behaviour) ``moov`` is written before ``mdat``. ``output`` may be one of
    ``inputs``: the result is written to a temporary file and moved into place.
    """
    input_paths = [Path(p) for p in inputs]
    if not input_paths:
        raise ValueError("no input videos to concatenate")
    out_path = Path(output)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    list_fd, list_name = tempfile.mkstemp(suffix=".ffconcat", dir=out_path.parent)
    tmp_fd, tmp_name = tempfile.mkstemp(suffix=".mp4", dir=out_path.parent)
    os.close(tmp_fd)
    try:
        with os.fdopen(list_fd, "w") as listing:
            listing.write("ffconcat version 1.0\n")
            listing.writelines(_concat_list_line(p) for p in input_paths)
        _remux_concat_list(Path(list_name), Path(tmp_name), faststart)
        shutil.move(tmp_name, out_path)
    finally:
        Path(list_name).unlink(missing_ok=True)
        Path(tmp_name).unlink(missing_ok=True)
    return out_path


def _remux_concat_list(list_path: Path, out_path: Path, faststart: bool) -> None:
    """Stream-copy every video packet described by an ffconcat list into ``out_path``."""
    output_options = {"movflags": "faststart"} if faststart else {}
    with (
        av.open(str(list_path), mode="r", format="concat", options={"safe": "0"}) as source,
        av.open(str(out_path), mode="w", format="mp4", options=output_options) as sink,
    ):
        stream_map = {}
        for in_stream in source.streams.video:
            out_stream = sink.add_stream_from_template(in_stream, opaque=True)
            out_stream.time_base = in_stream.time_base
            stream_map[in_stream.index] = out_stream
        for packet in source.demux(*source.streams.video):
            if packet.dts is None:
                continue
            packet.stream = stream_map[packet.stream.index]
            sink.mux(packet)


def video_duration_s(path: str | os.PathLike[str]) -> float:
    """Duration in seconds as LeRobot computes it for ``from/to_timestamp``.

    ``stream.duration * stream.time_base`` of the first video stream, falling back to the
    container duration when the stream has none.
    """
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.duration is not None and stream.time_base is not None:
            return float(stream.duration * stream.time_base)
        if container.duration is None:
            raise ValueError(f"{path}: neither stream nor container reports a duration")
        return float(container.duration / av.time_base)
