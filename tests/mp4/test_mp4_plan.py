"""Clip planning: sample ranges (open GOP, B-frame GOP ends), byte ranges and exact clip sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lerobot_nodes.errors import FrameTimestampError
from lerobot_nodes.mp4 import VideoIndex, materialize_clip, plan_clip, read_index
from lerobot_nodes.sources import LocalSource

FRAME = 1 / 30


def _span_of_frames(index: VideoIndex, first: int, count: int) -> tuple[float, float]:
    """``[from_s, to_s)`` covering presentation ranks ``first .. first + count - 1``."""
    sorted_pts = np.sort(index.pts)
    stop = first + count
    to_s = (
        sorted_pts[stop] / index.timescale
        if stop < len(sorted_pts)
        else sorted_pts[-1] / index.timescale + FRAME
    )
    return sorted_pts[first] / index.timescale, to_s


@pytest.mark.parametrize("name", ["av1", "h264", "h264_moov_at_end"])
def test_each_episode_is_exactly_its_samples(multi_episode, name):
    """LeRobot episodes start with a key frame and end a closed GOP: no preroll, no spill-over."""
    file = multi_episode[name]
    index = read_index(file.path)
    first_sample = 0
    for (from_s, to_s), length in zip(file.spans, file.lengths, strict=True):
        plan = plan_clip(index, from_s, to_s)
        assert (plan.sample_start, plan.sample_stop) == (first_sample, first_sample + length)
        assert plan.needed_count == length
        assert len(plan.byte_ranges) == 1
        assert (
            plan.fetch_size
            == plan.payload_size
            == int(index.sizes[plan.sample_start : plan.sample_stop].sum())
        )
        first_sample += length
    assert first_sample == len(index)


def test_av1_plan_starts_at_preceding_key_and_stops_at_last_needed(videos):
    index = read_index(videos["av1"])
    for first in range(0, 60, 7):
        from_s, to_s = _span_of_frames(index, first, 5)
        plan = plan_clip(index, from_s, to_s)
        assert plan.sample_start == first - first % 2  # g=2, no reordering
        assert plan.sample_stop == first + 5
        assert plan.first_needed_pts == index.pts[first] and plan.last_needed_pts == index.pts[first + 4]


def test_open_gop_start_is_a_key_frame_shown_before_the_first_needed_frame(videos):
    index = read_index(videos["h264_open_gop"])
    keys = index.keyframe_indices
    open_keys = [k for k in keys[1:] if np.any(index.pts[k + 1 : k + 4] < index.pts[k])]
    assert open_keys, "the fixture must contain open-GOP I-frames"
    for key in open_keys:
        leading = [k for k in range(key + 1, key + 4) if index.pts[k] < index.pts[key]]
        first_pts = int(index.pts[leading].min())
        plan = plan_clip(index, first_pts / index.timescale, first_pts / index.timescale + 3 * FRAME)
        assert plan.sample_start < key
        assert index.keyframes[plan.sample_start] and index.pts[plan.sample_start] <= first_pts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("variant", ["h264", "h264_open_gop", "h264_dropped_frames", "h264_negative_cts"])
def test_reordered_plans_end_a_gop_and_decode_a_contiguous_block(videos, variant, data):
    index = read_index(videos[variant])
    first = data.draw(st.integers(0, len(index) - 1))
    count = data.draw(st.integers(1, len(index) - first))
    plan = plan_clip(index, *_span_of_frames(index, first, count))
    assert plan.needed_count == count
    assert plan.sample_stop == len(index) or index.keyframes[plan.sample_stop]
    fetched = np.arange(plan.sample_start, plan.sample_stop)
    # Leading pictures of the start key frame cannot be decoded; every other fetched frame is.
    decodable = np.sort(index.pts[fetched][index.pts[fetched] >= index.pts[plan.sample_start]])
    sorted_pts = np.sort(index.pts)
    low = int(np.searchsorted(sorted_pts, decodable[0]))
    np.testing.assert_array_equal(decodable, sorted_pts[low : low + len(decodable)])  # no holes
    needed = sorted_pts[first : first + count]
    assert decodable[0] <= needed[0] and needed[-1] <= decodable[-1]


def test_half_frame_tolerance(videos):
    index = read_index(videos["h264_starts_at_7"])  # a timeline a few ticks off the frame grid
    base = plan_clip(index, *_span_of_frames(index, 10, 8))
    from_s, to_s = _span_of_frames(index, 10, 8)
    for shift in (-0.45, -0.2, 0.2, 0.45):
        plan = plan_clip(index, from_s + shift * FRAME, to_s + shift * FRAME)
        assert (plan.first_needed_pts, plan.needed_count) == (base.first_needed_pts, base.needed_count)
    assert (
        plan_clip(index, from_s + 0.55 * FRAME, to_s + 0.55 * FRAME).first_needed_pts != base.first_needed_pts
    )


def test_spans_without_frames(videos):
    index = read_index(videos["av1"])
    with pytest.raises(FrameTimestampError, match="no frame"):
        plan_clip(index, 100.0, 101.0)
    with pytest.raises(FrameTimestampError, match="no frame"):
        plan_clip(index, 1.0, 1.0 + 0.4 * FRAME)
    with pytest.raises(FrameTimestampError, match="no frame"):
        plan_clip(index, 1e305, 1e307)
    with pytest.raises(ValueError, match="invalid span"):
        plan_clip(index, 2.0, 1.0)
    with pytest.raises(ValueError, match="invalid span"):
        plan_clip(index, float("nan"), 1.0)


@pytest.mark.parametrize(
    "variant", ["av1", "av1_g32", "h264", "h264_g2", "h264_open_gop", "h264_starts_at_7", "hevc"]
)
def test_planned_size_is_the_clip_size(videos, variant):
    path = videos[variant]
    index = read_index(path)
    source = LocalSource(path.parent)
    rng = np.random.default_rng(7)
    for _ in range(12):
        first = int(rng.integers(0, len(index)))
        count = int(rng.integers(1, len(index) - first + 1))
        plan = plan_clip(index, *_span_of_frames(index, first, count))
        ranges = plan.byte_ranges
        assert all(start < end for start, end in ranges)
        assert all(end < next_start for (_, end), (next_start, _) in zip(ranges, ranges[1:], strict=False))
        clip = materialize_clip(plan, source.read_ranges(path.name, ranges))
        assert len(clip) == plan.size == len(plan.header) + plan.payload_size


def test_clip_header_cost_is_small(multi_episode):
    index = read_index(multi_episode["av1"].path)
    plan = plan_clip(index, *multi_episode["av1"].spans[2])
    # ftyp + moov (fixed boxes, stsd, 4 bytes per sample in stsz, a few runs) + mdat header.
    assert len(plan.header) < 1000 + len(index.stsd) + 8 * plan.sample_count


def test_materialize_rejects_chunks_that_do_not_match(videos):
    index = read_index(videos["av1"])
    plan = plan_clip(index, 0.2, 0.8)
    (start, end) = plan.byte_ranges[0]
    with pytest.raises(ValueError, match="chunks for 1 planned"):
        materialize_clip(plan, [])
    with pytest.raises(ValueError, match="needs"):
        materialize_clip(plan, [bytes(end - start - 1)])
