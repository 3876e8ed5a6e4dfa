"""Real MP4 files for the mp4 tests, encoded once per session with PyAV (no mocks)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from lerobot_nodes.testing.video import concatenate_videos, encode_video, synthetic_frames, video_duration_s

from .mp4_media import encode_with_pts

HEIGHT, WIDTH = 64, 96


@pytest.fixture(scope="session")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Single-episode files covering every layout and timing variant the index must handle."""
    root = tmp_path_factory.mktemp("mp4-variants")
    frames = synthetic_frames(75, HEIGHT, WIDTH, seed=3)
    files = {
        "av1": encode_video(root / "av1.mp4", frames, codec="av1"),
        "av1_faststart": encode_video(root / "av1_faststart.mp4", frames, codec="av1", faststart=True),
        "av1_g32": encode_video(root / "av1_g32.mp4", frames, codec="av1", g=32),
        "h264": encode_video(root / "h264.mp4", frames, codec="h264"),
        "h264_faststart": encode_video(root / "h264_faststart.mp4", frames, codec="h264", faststart=True),
        "h264_g2": encode_video(root / "h264_g2.mp4", frames, codec="h264", g=2),
        "h264_open_gop": encode_video(root / "h264_open_gop.mp4", frames, codec="h264", g=12, open_gop=True),
    }
    x264 = {"g": "30"}
    files["h264_negative_cts"] = encode_with_pts(
        root / "h264_negative_cts.mp4", frames, "libx264", x264, movflags="negative_cts_offsets"
    )
    files["h264_starts_at_7"] = encode_with_pts(
        root / "h264_starts_at_7.mp4", frames, "libx264", x264, first_pts=7
    )
    files["av1_starts_at_2"] = encode_with_pts(
        root / "av1_starts_at_2.mp4", frames, "libsvtav1", {"g": "2", "preset": "12", "svtav1-params": "lp=1"}, first_pts=2
    )
    files["h264_dropped_frames"] = encode_with_pts(
        root / "h264_vfr.mp4", frames, "libx264", x264, gap_every=7
    )
    # PyAV's wheels ship libx265; a build without it fails here, by name, rather than skipping.
    files["hevc"] = encode_with_pts(
        root / "hevc.mp4", frames, "libx265", {"g": "30", "x265-params": "log-level=none"}
    )
    # x265 with a two-frame GOP: open GOP (CRA key frames whose leading pictures reach back).
    files["hevc_g2"] = encode_video(root / "hevc_g2.mp4", frames, codec="hevc", g=2)
    return files


@dataclass(frozen=True)
class MultiEpisodeFile:
    """A LeRobot-style concatenation and each episode's ``[from_s, to_s)`` and frame count."""

    path: Path
    spans: list[tuple[float, float]]
    lengths: list[int]


def _concatenated(root: Path, codec: str, lengths: list[int], faststart: bool) -> MultiEpisodeFile:
    parts, spans, start = [], [], 0.0
    for episode, length in enumerate(lengths):
        part = encode_video(
            root / f"{codec}-ep{episode}.mp4",
            synthetic_frames(length, HEIGHT, WIDTH, seed=episode),
            codec=codec,
        )
        duration = video_duration_s(part)
        spans.append((start, start + duration))
        start += duration
        parts.append(part)
    name = f"{codec}-{'faststart' if faststart else 'moov-at-end'}.mp4"
    return MultiEpisodeFile(concatenate_videos(parts, root / name, faststart=faststart), spans, lengths)


EPISODE_LENGTHS = [31, 18, 45, 23, 38, 27]


@pytest.fixture(scope="session")
def multi_episode(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MultiEpisodeFile]:
    """Six episodes per file, as LeRobot's writer concatenates them (AV1 and H.264)."""
    root = tmp_path_factory.mktemp("mp4-episodes")
    return {
        "av1": _concatenated(root, "av1", EPISODE_LENGTHS, faststart=True),
        "h264": _concatenated(root, "h264", EPISODE_LENGTHS, faststart=True),
        "h264_moov_at_end": _concatenated(root, "h264", EPISODE_LENGTHS[:3], faststart=False),
    }
