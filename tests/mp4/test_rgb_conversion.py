"""RgbConverter returns exactly ``to_ndarray(format="rgb24")`` in CHW, for real decoded video and other pixel formats."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from lerobot_nodes.mp4.rgb import RgbConverter, planar_conversion_agrees
from lerobot_nodes.testing.video import encode_video, synthetic_frames


def _reference(frame: av.VideoFrame) -> np.ndarray:
    return frame.to_ndarray(format="rgb24").transpose(2, 0, 1)


@pytest.mark.parametrize(
    ("codec", "options"),
    [("av1", {}), ("h264", {"bframes": 3, "g": 30}), ("hevc", {"g": 30})],
)
def test_every_decoded_frame_equals_rgb24(tmp_path: Path, codec: str, options: dict) -> None:
    frames = synthetic_frames(40, 120, 160, seed=11)
    path = encode_video(tmp_path / f"{codec}.mp4", frames, codec=codec, **options)  # type: ignore[arg-type]
    convert = RgbConverter()
    with av.open(str(path)) as container:
        decoded = list(container.decode(video=0))
    assert len(decoded) == 40
    for frame in decoded:
        out = convert(frame)
        assert out.shape == (3, 120, 160) and out.dtype == np.uint8 and out.flags.c_contiguous
        assert np.array_equal(out, _reference(frame)), f"{codec} frame pts {frame.pts}"
    assert planar_conversion_agrees(decoded[0]) is True  # the fast planar path served them


@pytest.mark.parametrize("pixel_format", ["yuv420p", "yuvj420p", "yuv444p", "nv12", "yuv420p10le", "gray"])
def test_other_pixel_formats_equal_rgb24_planar_or_not(pixel_format: str) -> None:
    # nv12 and 10-bit convert differently to planar RGB: the first-frame check sends them through rgb24.
    rng = np.random.default_rng(3)
    convert = RgbConverter()
    for _ in range(3):
        rgb = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format=pixel_format)
        assert np.array_equal(convert(frame), _reference(frame))
    assert planar_conversion_agrees(frame) is not None


def test_a_kind_whose_planar_output_differs_is_converted_through_rgb24() -> None:
    rgb = np.random.default_rng(5).integers(0, 256, (32, 48, 3), dtype=np.uint8)
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="nv12")
    RgbConverter()(frame)
    assert planar_conversion_agrees(frame) is False
    assert np.array_equal(RgbConverter()(frame), _reference(frame))
