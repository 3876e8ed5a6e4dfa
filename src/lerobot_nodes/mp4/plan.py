"""Clip planning: which samples and byte ranges an episode span of one camera needs.

A :class:`ClipPlan` is computed from a :class:`~lerobot_nodes.mp4.index.VideoIndex` alone,
before any payload byte is read, and carries everything :func:`~lerobot_nodes.mp4.clip.materialize_clip`
needs and the :class:`~lerobot_nodes.mp4.layout.ClipLayout` a decoder of the clip needs (it
does not keep a reference to the index).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import FrameTimestampError, VideoIndexError
from ..sources.ranges import ByteRange, coalesce
from .index import VideoIndex
from .layout import ClipLayout, ClipOrigin
from .mux import ClipTables, build_clip_header


@dataclass(frozen=True)
class ClipPlan:
    """The samples, byte ranges and exact clip size for one span of one video file.

    - ``sample_start``/``sample_stop``: the half-open decode-order range of samples fetched.
      It starts at a key frame presented no later than the first needed frame (open-GOP safe)
      and, for reordered (B-frame) video, ends at the end of the GOP holding the last needed
      frame, so the decoded presentation times have no holes.
    - ``first_needed_pts``/``last_needed_pts``: presentation times (ticks of ``timescale``) of
      the first and last frame shown in ``[from_s, to_s)``; ``needed_count`` frames in all.
    - ``byte_ranges``: sorted, coalesced ``(start, end)`` ranges of the file, end exclusive.
    - ``size``: the exact length of the materialised clip, ``len(header) + payload_size``.
    - ``time_offset``: source pts = clip pts + ``time_offset`` (the clip has no edit list).
    """

    path: str
    codec: str
    timescale: int
    from_s: float
    to_s: float
    sample_start: int
    sample_stop: int
    first_needed_pts: int
    last_needed_pts: int
    needed_count: int
    time_offset: int
    byte_ranges: list[ByteRange]
    segments: tuple[tuple[int, int, int], ...]
    """``(range index, start, end)`` slices of the fetched chunks, in decode order."""
    payload_size: int
    header: bytes
    """``ftyp``, ``moov`` and the ``mdat`` header of the clip."""
    size: int
    layout: ClipLayout
    """The clip's samples as a decoder sees them (the tables its ``moov`` is written from)."""

    @property
    def sample_count(self) -> int:
        return self.sample_stop - self.sample_start

    @property
    def fetch_size(self) -> int:
        """Bytes to fetch: the sum of ``byte_ranges``."""
        return sum(end - start for start, end in self.byte_ranges)


def plan_clip(index: VideoIndex, from_s: float, to_s: float) -> ClipPlan:
    """Plan the clip holding every frame presented in ``[from_s, to_s)``.

    A frame is needed when its pts lies in ``[round(from_s * ts) - tol, round(to_s * ts) - tol)``
    with ``tol`` half a frame, which absorbs LeRobot's float seconds, millisecond-rounded empty
    edits and the few-tick drifts of concatenated files. Raises :class:`FrameTimestampError`
    when no frame is presented in the span and :class:`VideoIndexError` when no key frame
    precedes it.
    """
    if not (math.isfinite(from_s) and math.isfinite(to_s)) or to_s <= from_s:
        raise ValueError(f"{index.path}: invalid span [{from_s}, {to_s}) s")
    timescale = index.timescale
    tolerance = index.frame_duration / 2
    order = index.presentation_order
    sorted_pts = index.presentation_pts
    # Float ticks: exact up to 2**53 ticks, and no overflow for absurd spans (they find no frame).
    low = float(np.rint(from_s * timescale)) - tolerance
    high = float(np.rint(to_s * timescale)) - tolerance
    first_rank = int(np.searchsorted(sorted_pts, low, side="left"))
    stop_rank = int(np.searchsorted(sorted_pts, high, side="left"))
    if stop_rank <= first_rank:
        raise FrameTimestampError(f"{index.path}: no frame is presented in [{from_s}, {to_s}) s")
    needed = order[first_rank:stop_rank]
    first_needed_pts = int(sorted_pts[first_rank])
    sample_start = _start_keyframe(index, int(needed.min()), first_needed_pts)
    last_needed = int(needed.max())
    sample_stop = _gop_end(index, last_needed) if index.is_reordered else last_needed + 1

    offsets = index.offsets[sample_start:sample_stop]
    sizes = index.sizes[sample_start:sample_stop]
    byte_ranges, segments = _coalesce(offsets, sizes)
    tables = _clip_tables(index, sample_start, sample_stop)
    time_offset = int(index.dts[sample_start])
    payload_size = int(sizes.sum())
    last_needed_pts = int(sorted_pts[stop_rank - 1])
    header = build_clip_header(
        index,
        tables,
        payload_size,
        time_offset=time_offset,
        source_sample_start=sample_start,
        first_needed_pts=first_needed_pts,
        last_needed_pts=last_needed_pts,
    )
    # The clip's mdat holds the samples back to back, in decode order, right after the header.
    clip_offsets = np.empty(len(sizes), dtype=np.int64)
    clip_offsets[0] = len(header)
    np.cumsum(sizes[:-1], out=clip_offsets[1:])
    clip_offsets[1:] += len(header)
    layout = ClipLayout(
        codec=index.codec,
        timescale=timescale,
        codec_config=index.codec_config,
        offsets=clip_offsets,
        sizes=sizes,
        pts=index.pts[sample_start:sample_stop],
        dts=index.dts[sample_start:sample_stop],
        keyframes=index.keyframes[sample_start:sample_stop],
        origin=ClipOrigin(index.path, time_offset, sample_start, first_needed_pts, last_needed_pts),
    )
    return ClipPlan(
        path=index.path,
        codec=index.codec,
        timescale=timescale,
        from_s=float(from_s),
        to_s=float(to_s),
        sample_start=sample_start,
        sample_stop=sample_stop,
        first_needed_pts=first_needed_pts,
        last_needed_pts=last_needed_pts,
        needed_count=stop_rank - first_rank,
        time_offset=time_offset,
        byte_ranges=byte_ranges,
        segments=segments,
        payload_size=payload_size,
        header=header,
        size=len(header) + payload_size,
        layout=layout,
    )


def _start_keyframe(index: VideoIndex, first_decode: int, first_pts: int) -> int:
    """The last key frame at or before ``first_decode`` whose pts is not after ``first_pts``.

    The pts condition matters for open GOP: the leading pictures of an I-frame come after it in
    decode order but reference the previous GOP, so they cannot be decoded from it.
    """
    keys = index.keyframe_indices
    position = int(np.searchsorted(keys, first_decode, side="right")) - 1
    if position >= 0 and index.pts[keys[position]] <= first_pts:
        return int(keys[position])
    candidates = keys[: max(position, 0)]
    usable = np.flatnonzero(index.pts[candidates] <= first_pts)
    if len(usable) == 0:
        raise VideoIndexError(
            f"{index.path}: no key frame precedes the frame at pts {first_pts} (sample {first_decode})"
        )
    return int(candidates[usable[-1]])


def _start_keyframes(index: VideoIndex, samples: np.ndarray) -> np.ndarray:
    """:func:`_start_keyframe` of every sample (decode indices), each at its own pts; vectorised
    for the common case, the scalar rule for the leading pictures of open GOPs."""
    keys = index.keyframe_indices
    positions = np.searchsorted(keys, samples, side="right") - 1
    clamped = np.maximum(positions, 0)
    starts = keys[clamped].astype(np.int64)
    direct = (positions >= 0) & (index.pts[starts] <= index.pts[samples])
    for i in np.flatnonzero(~direct):
        starts[i] = _start_keyframe(index, int(samples[i]), int(index.pts[samples[i]]))
    return starts


def _gop_end(index: VideoIndex, last_decode: int) -> int:
    """The index of the first key frame after ``last_decode`` (or the sample count)."""
    keys = index.keyframe_indices
    position = int(np.searchsorted(keys, last_decode, side="right"))
    return int(keys[position]) if position < len(keys) else len(index)


def _coalesce(
    offsets: np.ndarray, sizes: np.ndarray
) -> tuple[list[ByteRange], tuple[tuple[int, int, int], ...]]:
    """Sorted merged byte ranges, and the decode-order segments that map samples into them."""
    ends = offsets + sizes
    breaks = np.flatnonzero(offsets[1:] != ends[:-1]) + 1
    segment_first = np.concatenate(([0], breaks))
    segment_last = np.concatenate((breaks, [len(offsets)])) - 1
    segment_starts = offsets[segment_first]
    segment_ends = ends[segment_last]

    ranges = coalesce(zip(segment_starts.tolist(), segment_ends.tolist(), strict=True))
    range_starts = np.array([start for start, _ in ranges], dtype=np.int64)
    range_of_segment = np.searchsorted(range_starts, segment_starts, side="right") - 1
    segments = tuple(
        (int(r), int(start - range_starts[r]), int(end - range_starts[r]))
        for r, start, end in zip(
            range_of_segment.tolist(), segment_starts.tolist(), segment_ends.tolist(), strict=True
        )
    )
    return [(start, end) for start, end in ranges], segments


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run-length encoding ``(counts, values)`` of a 1-d array."""
    change = np.flatnonzero(values[1:] != values[:-1]) + 1
    starts = np.concatenate(([0], change))
    counts = np.diff(np.append(starts, len(values)))
    return counts.astype(np.int64), values[starts].astype(np.int64)


def _clip_tables(index: VideoIndex, start: int, stop: int) -> ClipTables:
    durations = index.durations[start:stop]
    composition = index.pts[start:stop] - index.dts[start:stop]
    keyframes = index.keyframes[start:stop]
    return ClipTables(
        sizes=index.sizes[start:stop],
        time_to_sample=_runs(durations),
        composition_offsets=_runs(composition) if np.any(composition) else None,
        sync_samples=None if keyframes.all() else np.flatnonzero(keyframes).astype(np.int64) + 1,
    )


OPEN_GOP_MIN_RUN = 12
"""Frames an anchor run spans at least when it starts at an open-GOP key frame: restarting there
decodes leading pictures that are thrown away (about 1.5 packets at HEVC ``g=2``), so short
open GOPs are merged until that overhead is small next to the frames a run delivers."""


def gop_starts(index: VideoIndex, from_s: float, to_s: float, open_gop_min_run: int = OPEN_GOP_MIN_RUN) -> np.ndarray:
    """:func:`clip_gop_starts` of the clip :func:`plan_clip` plans for ``[from_s, to_s)``."""
    return clip_gop_starts(index, plan_clip(index, from_s, to_s), open_gop_min_run)


def clip_gop_starts(index: VideoIndex, plan: ClipPlan, open_gop_min_run: int = OPEN_GOP_MIN_RUN) -> np.ndarray:
    """Episode-relative frame positions where an anchor run may start, ascending from 0.

    Frame ``r`` is the ``r``-th frame presented in ``[from_s, to_s)`` (the same span rule as
    :func:`plan_clip`). Its restart point is the key frame a decoder starts at to produce it
    (the last key frame at or before it in decode order whose pts is not after it: open-GOP
    safe). A position is returned where the restart point changes (a GOP in presentation
    order starts), so every run between two returned positions is reachable from one key
    frame by decoding forward only. Where that key frame has leading pictures (open GOP), the
    position is skipped unless the run before it already spans ``open_gop_min_run`` frames.
    ``plan`` is the clip's plan (:func:`plan_clip` of the span), made once per episode.
    """
    order = index.presentation_order
    sorted_pts = index.presentation_pts
    first_rank = int(np.searchsorted(sorted_pts, plan.first_needed_pts, side="left"))
    samples = order[first_rank : first_rank + plan.needed_count]
    keys = _start_keyframes(index, samples).tolist()
    clip_pts = index.pts[plan.sample_start : plan.sample_stop]
    after = np.minimum.accumulate(clip_pts[::-1])[::-1]
    before = np.maximum.accumulate(clip_pts)
    starts = [0]
    for rank in range(1, len(keys)):
        if keys[rank] == keys[rank - 1]:
            continue
        k = keys[rank] - plan.sample_start
        clean = 0 < k < len(clip_pts) and before[k - 1] < after[k] and clip_pts[k] == after[k]
        if clean or rank - starts[-1] >= open_gop_min_run:
            starts.append(rank)
    return np.array(starts, dtype=np.int64)
