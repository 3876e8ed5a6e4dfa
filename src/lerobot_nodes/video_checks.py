"""``meta/info.json``'s camera info and ``meta/episodes``' video spans, checked against the MP4 indexes.

A dataset whose metadata disagrees with its videos otherwise fails deep inside an epoch (a
``FrameTimestampError`` at the first frame past the end of a file, a decoder fed the wrong
codec). These checks read nothing: they compare the metadata with the
:class:`~lerobot_nodes.mp4.VideoIndex` of each file (sample entry, size, timescale, sample
times), which opening a dataset needs anyway. Two checks:

- **camera info**: the codec, fps, width and height a camera's ``info`` (or legacy
  ``video_info``) block states must be those of every stream of that camera. A field the
  block does not state is not checked.
- **video spans**: each episode's ``[from_timestamp, to_timestamp)`` must end by the end of
  its file's last frame (its presentation time plus its duration), within ``tolerance_s``.

Scope: the checks cover the episodes they are given and need the indexes of those episodes'
files only. ``StreamingLeRobotDataset`` gives each distributed rank its own episodes
(``nodes.sharder.rank_episodes``), so a rank opens and checks exactly the files it will read,
the ranks together check every selected episode once, and no rank opens the indexes of the
whole dataset (64 ranks of a 5,000-file dataset: ~80 files each, not 5,000).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrays import sorted_unique
from .errors import MetadataError
from .format.meta import INFO_PATH, DatasetMeta
from .mp4.index import VideoIndex

LEROBOT_CODECS = {"av01": "av1", "avc1": "h264", "avc3": "h264", "hvc1": "hevc", "hev1": "hevc"}
"""MP4 sample entry -> the codec name LeRobot writes as ``video.codec`` (PyAV's decoder name)."""
CODEC_ALIASES = {
    "libsvtav1": "av1", "libaom-av1": "av1", "libdav1d": "av1", "av01": "av1",
    "libx264": "h264", "avc": "h264", "avc1": "h264", "avc3": "h264",
    "libx265": "hevc", "h265": "hevc", "hvc1": "hevc", "hev1": "hevc",
}  # fmt: skip
"""Encoder and sample-entry names a ``video.codec`` may hold instead of the decoder name."""


def _number(key: str, field: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise MetadataError(f"{INFO_PATH}: camera {key}'s {field} must be a positive number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class CameraInfo:
    """What ``meta/info.json`` states about one camera's stream; ``None`` = not stated."""

    codec: str | None
    fps: float | None
    width: int | None
    height: int | None

    @classmethod
    def from_feature(cls, key: str, feature: Mapping[str, Any]) -> CameraInfo:
        """From ``features[key]["info"]`` (v3), else the legacy ``features[key]["video_info"]``."""
        info = feature.get("info") or feature.get("video_info") or {}
        codec = info.get("video.codec")
        width = _number(key, "video.width", info.get("video.width"))
        height = _number(key, "video.height", info.get("video.height"))
        return cls(
            codec=CODEC_ALIASES.get(str(codec).lower(), str(codec).lower()) if codec else None,
            fps=_number(key, "video.fps", info.get("video.fps")),
            width=None if width is None else int(width),
            height=None if height is None else int(height),
        )


@dataclass(frozen=True)
class StreamInfo:
    """The facts of one MP4's video stream that the metadata states, from its index."""

    codec: str
    sample_entry: str
    fps: float
    width: int
    height: int
    end_s: float
    """When the last frame stops being shown: its presentation time plus its duration."""

    @classmethod
    def from_index(cls, index: VideoIndex) -> StreamInfo:
        frame_ticks = index.frame_duration
        last = int(index.presentation_order[-1])
        last_ticks = int(index.durations[last]) or frame_ticks  # a muxer may leave the last delta 0
        return cls(
            codec=LEROBOT_CODECS.get(index.sample_entry, index.codec),
            sample_entry=index.sample_entry,
            fps=index.timescale / frame_ticks,
            width=int(index.width),
            height=int(index.height),
            end_s=(int(index.pts[last]) + last_ticks) / index.timescale,
        )


def camera_mismatch(path: str, key: str, stated: CameraInfo, stream: StreamInfo, tolerance_s: float) -> str | None:
    """What ``stated`` gets wrong about the stream of ``path``, or ``None``.

    Frame rates agree when their frame periods differ by at most ``tolerance_s`` (LeRobot's
    tolerance for a frame's time), so a stated 30 fits a 29.97 fps stream.
    """
    says: list[str] = []
    has: list[str] = []
    if stated.codec is not None and stated.codec != stream.codec:
        says.append(f"codec {stated.codec}")
        has.append(f"codec {stream.codec} (sample entry {stream.sample_entry})")
    if stated.fps is not None and abs(1 / stated.fps - 1 / stream.fps) > tolerance_s:
        says.append(f"fps {stated.fps:g}")
        has.append(f"fps {stream.fps:g}")
    wrong_width = stated.width is not None and stated.width != stream.width
    wrong_height = stated.height is not None and stated.height != stream.height
    if wrong_width or wrong_height:
        says.append(f"size {stated.width or '?'}x{stated.height or '?'} (video.width x video.height)")
        has.append(f"size {stream.width}x{stream.height}")
    if not says:
        return None
    return f"{path} (camera {key}): {INFO_PATH} says {', '.join(says)}; the stream has {', '.join(has)}"


def span_overflow(meta: DatasetMeta, episode: int, key: str, stream: StreamInfo, tolerance_s: float) -> str | None:
    """How ``episode``'s span of camera ``key`` reaches past the end of its file, or ``None``."""
    start, stop = meta.video_span(episode, key)
    if stop <= stream.end_s + tolerance_s:
        return None
    return (
        f"episode {episode} (camera {key}): meta/episodes places its frames at [{start:.6f}, {stop:.6f}) s of "
        f"{meta.video_file(episode, key)}, but the file's last frame ends at {stream.end_s:.6f} s "
        f"({stop - stream.end_s:.6f} s past it; tolerance_s is {tolerance_s:g})"
    )


def _episode_stream_ends(
    meta: DatasetMeta, key: str, episodes: np.ndarray, streams: Mapping[str, StreamInfo]
) -> np.ndarray:
    """Per episode of ``episodes``: where its MP4 of camera ``key`` ends (one lookup per file, not per episode)."""
    spans = meta.episodes.videos[key]
    pairs = spans.chunk_index[episodes].astype(np.int64) * (1 << 32) + spans.file_index[episodes].astype(np.int64)
    files, first, inverse = np.unique(pairs, return_index=True, return_inverse=True)
    ends = np.array([streams[meta.video_file(int(episodes[i]), key)].end_s for i in first.tolist()], dtype=np.float64)
    return ends[inverse.reshape(-1)] if len(files) else np.zeros(0)


def overflowing(
    meta: DatasetMeta, key: str, episodes: np.ndarray, streams: Mapping[str, StreamInfo], tolerance_s: float
) -> np.ndarray:
    """Those of ``episodes`` whose span of camera ``key`` ends past its file's last frame (vectorised
    :func:`span_overflow`)."""
    stops = meta.episodes.videos[key].to_timestamp[episodes]
    return episodes[stops > _episode_stream_ends(meta, key, episodes, streams) + tolerance_s]


def stream_infos(meta: DatasetMeta, indexes: Mapping[str, VideoIndex], episodes: np.ndarray) -> dict[str, StreamInfo]:
    """The :class:`StreamInfo` of every MP4 of ``episodes`` (``indexes`` must hold them all)."""
    return {path: StreamInfo.from_index(indexes[path]) for path in meta.video_files(episodes.tolist())}


def span_overflows(
    meta: DatasetMeta, indexes: Mapping[str, VideoIndex], episodes: Iterable[int], tolerance_s: float
) -> np.ndarray:
    """The episodes (sorted, distinct) with a span past the end of its MP4, any camera."""
    chosen = np.fromiter((int(e) for e in episodes), dtype=np.int64)
    streams = stream_infos(meta, indexes, chosen)
    found = [overflowing(meta, key, chosen, streams, tolerance_s) for key in meta.video_keys]
    return sorted_unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def video_problems(
    meta: DatasetMeta,
    indexes: Mapping[str, VideoIndex],
    episodes: Iterable[int],
    tolerance_s: float,
    limit: int | None = None,
) -> list[str]:
    """Every disagreement between the metadata of ``episodes`` and the indexes of their files.

    ``indexes`` must hold every video file of ``episodes``. Camera info problems come first
    (one per file), then span problems in episode order. The comparison is vectorised over the
    episodes; with ``limit``, only the first ``limit`` span problems are formatted and the rest
    are counted in a last line ``... and N more``.
    """
    chosen = np.fromiter((int(e) for e in episodes), dtype=np.int64)
    streams: dict[str, StreamInfo] = {}
    problems: list[str] = []
    for key in meta.video_keys:
        try:
            stated: CameraInfo | None = CameraInfo.from_feature(key, meta.features[key])
        except MetadataError as error:
            stated = None
            problems.append(str(error))
        for path in sorted({meta.video_file(int(e), key) for e in _file_firsts(meta, key, chosen)}):
            streams[path] = StreamInfo.from_index(indexes[path])
            mismatch = None if stated is None else camera_mismatch(path, key, stated, streams[path], tolerance_s)
            if mismatch is not None:
                problems.append(mismatch)
    order = {key: i for i, key in enumerate(meta.video_keys)}
    flagged = sorted(
        (int(e), order[key], key) for key in meta.video_keys for e in overflowing(meta, key, chosen, streams, tolerance_s)
    )
    shown = flagged if limit is None else flagged[:limit]
    for episode, _, key in shown:
        overflow = span_overflow(meta, episode, key, streams[meta.video_file(episode, key)], tolerance_s)
        if overflow is not None:
            problems.append(overflow)
    if len(flagged) > len(shown):
        problems.append(f"... and {len(flagged) - len(shown)} more episode spans past the end of their MP4")
    return problems


def _file_firsts(meta: DatasetMeta, key: str, episodes: np.ndarray) -> np.ndarray:
    """One episode of ``episodes`` per distinct MP4 of camera ``key``."""
    spans = meta.episodes.videos[key]
    pairs = spans.chunk_index[episodes].astype(np.int64) * (1 << 32) + spans.file_index[episodes].astype(np.int64)
    return episodes[np.unique(pairs, return_index=True)[1]]


def check_video_metadata(
    meta: DatasetMeta, indexes: Mapping[str, VideoIndex], episodes: Iterable[int], tolerance_s: float
) -> None:
    """Raise :class:`MetadataError` with the first of :func:`video_problems` (and how many more)."""
    problems = video_problems(meta, indexes, episodes, tolerance_s)
    if problems:
        more = f" (and {len(problems) - 1} more; `lerobot-nodes inspect` lists them all)" if len(problems) > 1 else ""
        raise MetadataError(f"{meta.source.url}: {problems[0]}{more}")
