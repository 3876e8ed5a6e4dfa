"""Frames decoded from clips are bit-identical to decoding the whole file; decoding does only what is needed."""

from __future__ import annotations

import io
import json
import threading
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_nodes.errors import FrameTimestampError, VideoIndexError
from lerobot_nodes.mp4 import (
    Clip,
    ClipDecoder,
    ClipPlan,
    VideoIndex,
    decode_clip,
    materialize_clip,
    read_clip,
    read_clip_layout,
    read_index,
)
from lerobot_nodes.mp4.decode import DEFAULT_FRAME_CACHE_SIZE, frames_to_keep
from lerobot_nodes.mp4.plan import plan_clip
from lerobot_nodes.sources import LocalSource

from .mp4_media import decoded_frames


def _clip(path: Path, plan: ClipPlan) -> bytes:
    return materialize_clip(plan, LocalSource(path.parent).read_ranges(path.name, plan.byte_ranges))


def _hwc(frames: torch.Tensor) -> list[np.ndarray]:
    return [frame.permute(1, 2, 0).numpy() for frame in frames]


def _random_spans(index: VideoIndex, count: int, seed: int) -> list[tuple[float, float]]:
    rng = np.random.default_rng(seed)
    sorted_pts = np.sort(index.pts)
    spans = [(0, len(index))]
    for _ in range(count):
        first = int(rng.integers(0, len(index)))
        spans.append((first, int(rng.integers(first + 1, min(len(index), first + 30) + 1))))
    out = []
    for first, stop in spans:
        end = sorted_pts[stop] if stop < len(index) else sorted_pts[-1] + 512
        out.append((sorted_pts[first] / index.timescale, end / index.timescale))
    return out


VARIANTS = [
    "av1", "av1_g32", "h264", "h264_faststart", "h264_g2", "h264_open_gop", "h264_negative_cts",
    "h264_starts_at_7", "av1_starts_at_2", "h264_dropped_frames", "hevc",
]  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_frame_of_random_spans_is_bit_identical(videos, variant):
    path = videos[variant]
    index = read_index(path)
    reference = decoded_frames(path)
    for from_s, to_s in _random_spans(index, 5, seed=len(variant)):
        plan = plan_clip(index, from_s, to_s)
        clip = _clip(path, plan)
        needed = [pts for pts in sorted(reference) if plan.first_needed_pts <= pts <= plan.last_needed_pts]
        assert len(needed) == plan.needed_count
        timestamps = [pts / index.timescale for pts in needed]
        frames = decode_clip(clip, timestamps)
        for pts, frame in zip(needed, _hwc(frames), strict=True):
            np.testing.assert_array_equal(frame, reference[pts], err_msg=f"{variant} pts {pts}")
        # The decoder of a planned clip takes the plan's layout and parses no moov: same frames.
        torch.testing.assert_close(decode_clip(Clip(clip, plan.layout), timestamps), frames, rtol=0, atol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_plans_layout_is_what_the_clips_moov_says(videos, variant):
    path = videos[variant]
    index = read_index(path)
    for from_s, to_s in _random_spans(index, 8, seed=7 + len(variant)):
        plan = plan_clip(index, from_s, to_s)
        parsed = read_clip_layout(_clip(path, plan))
        assert plan.layout.equals(parsed), (variant, from_s, to_s)
        assert plan.layout.offsets[0] == len(plan.header) and len(plan.layout) == plan.sample_count


@pytest.mark.parametrize("variant", ["av1", "h264", "h264_open_gop", "h264_starts_at_7"])
def test_ffmpeg_opens_the_clip_alone(videos, variant):
    """The clip is a valid MP4 on its own; its pts are source pts minus ``plan.time_offset``."""
    path = videos[variant]
    index = read_index(path)
    reference = decoded_frames(path)
    for from_s, to_s in _random_spans(index, 3, seed=1):
        plan = plan_clip(index, from_s, to_s)
        clip = _clip(path, plan)
        with av.open(io.BytesIO(clip)) as container:
            stream = container.streams.video[0]
            assert stream.time_base == Fraction(1, index.timescale)
            assert stream.frames == plan.sample_count
            got = {
                frame.pts + plan.time_offset: frame.to_ndarray(format="rgb24")
                for frame in container.decode(stream)
            }
        for pts in range(plan.first_needed_pts, plan.last_needed_pts + 1):
            if pts in reference:
                np.testing.assert_array_equal(got[pts], reference[pts])
        _, origin = read_clip(clip)
        assert origin.time_offset == plan.time_offset and origin.path == path.name


def _episodes(dataset: Path) -> list[dict]:
    table = pq.read_table(dataset / "meta/episodes/chunk-000/file-000.parquet")
    return table.to_pylist()


def _cameras(dataset: Path) -> list[str]:
    features = json.loads((dataset / "meta/info.json").read_text())["features"]
    return [key for key, feature in features.items() if feature["dtype"] == "video"]


def _video_path(row: dict, camera: str) -> str:
    chunk, file = row[f"videos/{camera}/chunk_index"], row[f"videos/{camera}/file_index"]
    return f"videos/{camera}/chunk-{chunk:03d}/file-{file:03d}.mp4"


def _reference_episode(path: Path, from_s: float, to_s: float) -> dict[int, np.ndarray]:
    """What the map-style reader decodes: seek to the key frame before the episode, decode through it."""
    frames = {}
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        container.seek(round(from_s / stream.time_base) - 1, backward=True, any_frame=False, stream=stream)
        for frame in container.decode(stream):
            if frame.time >= to_s - 1 / 60:
                break
            if frame.time >= from_s - 1 / 60:  # the seek lands on a key frame of the previous episode
                frames[frame.pts] = frame.to_ndarray(format="rgb24")
    return frames


def test_lerobot_dataset_every_frame_of_every_episode(lerobot_written):
    root = lerobot_written.root
    source = LocalSource(root)
    for episode, row in enumerate(_episodes(root)):
        for camera in _cameras(root):
            path = _video_path(row, camera)
            from_s, to_s = row[f"videos/{camera}/from_timestamp"], row[f"videos/{camera}/to_timestamp"]
            index = read_index(path, source=source)
            plan = plan_clip(index, from_s, to_s)
            assert plan.needed_count == row["length"]
            assert len(plan.byte_ranges) == 1
            clip = materialize_clip(plan, source.read_ranges(path, plan.byte_ranges))
            assert len(clip) == plan.size
            reference = _reference_episode(root / path, from_s, to_s)
            assert len(reference) == row["length"]
            timestamps = [from_s + i / 30 for i in range(row["length"])]  # LeRobot's query times
            with ClipDecoder(clip) as decoder:
                frames = decoder.frames_at(timestamps)
                assert decoder.samples_decoded == plan.sample_count and decoder.restarts == 1
            for pts, frame in zip(sorted(reference), _hwc(frames), strict=True):
                np.testing.assert_array_equal(
                    frame, reference[pts], err_msg=f"episode {episode} {camera} pts {pts}"
                )


def test_lerobot_golden_frames(lerobot_written):
    """Frames from clips equal what LeRobot 0.6.1's map-style dataset returned."""
    root = lerobot_written.root
    manifest = json.loads((lerobot_written.golden / "manifest.json").read_text())
    golden = np.load(lerobot_written.golden / manifest["configs"]["none"]["npz_file"])
    data = pa.concat_tables(
        pq.read_table(path, columns=["index", "timestamp", "episode_index"])
        for path in sorted(root.glob("data/chunk-*/file-*.parquet"))
    )
    assert data["index"].to_pylist() == list(range(len(data)))
    timestamps, episode_of = data["timestamp"].to_pylist(), data["episode_index"].to_pylist()
    episodes = _episodes(root)
    source = LocalSource(root)
    for index_in_dataset in manifest["indices"]:
        row = episodes[episode_of[index_in_dataset]]
        for camera in _cameras(root):
            index = read_index(_video_path(row, camera), source=source)
            from_s = row[f"videos/{camera}/from_timestamp"]
            plan = plan_clip(index, from_s, row[f"videos/{camera}/to_timestamp"])
            clip = materialize_clip(plan, source.read_ranges(index.path, plan.byte_ranges))
            frame = decode_clip(clip, [from_s + timestamps[index_in_dataset]])[0]
            np.testing.assert_array_equal(frame.numpy(), golden[f"{index_in_dataset}/{camera}"])


# -- access patterns ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def h264_episode(multi_episode):
    file = multi_episode["h264"]
    index = read_index(file.path)
    plan = plan_clip(index, *file.spans[2])
    return index, plan, _clip(file.path, plan), decoded_frames(file.path)


def _times(index: VideoIndex, pts: list[int]) -> list[float]:
    return [p / index.timescale for p in pts]


def test_forward_windows_decode_each_sample_once(h264_episode):
    index, plan, clip, reference = h264_episode
    needed = [p for p in sorted(reference) if plan.first_needed_pts <= p <= plan.last_needed_pts]
    decoder = ClipDecoder(clip)
    for previous, current in zip(needed, needed[1:], strict=False):
        frames = decoder.frames_at(_times(index, [previous, current]))  # like delta_timestamps [-1/fps, 0]
        np.testing.assert_array_equal(_hwc(frames)[1], reference[current])
    assert decoder.samples_decoded == plan.sample_count
    assert decoder.restarts == 1


def test_backward_access_restarts_at_the_key_frame_before(h264_episode):
    index, plan, clip, reference = h264_episode
    needed = [p for p in sorted(reference) if plan.first_needed_pts <= p <= plan.last_needed_pts]
    decoder = ClipDecoder(clip, frame_cache_size=1)
    decoder.frames_at(_times(index, [needed[-1]]))
    before = decoder.samples_decoded
    target = needed[len(needed) // 2]
    np.testing.assert_array_equal(_hwc(decoder.frames_at(_times(index, [target])))[0], reference[target])
    assert decoder.restarts == 2
    target_sample = int(np.flatnonzero(index.pts == target)[0]) - plan.sample_start
    key = max(
        k for k in np.flatnonzero(index.keyframes[plan.sample_start : plan.sample_stop]) if k <= target_sample
    )
    # From the key frame to the target, plus at most the decoder's reordering delay.
    assert decoder.samples_decoded - before <= target_sample - key + 1 + 4


@pytest.mark.parametrize("variant", ["av1", "h264", "h264_open_gop"])
def test_random_order_gives_the_same_frames_and_decodes_little(videos, variant):
    path = videos[variant]
    index = read_index(path)
    reference = decoded_frames(path)
    plan = plan_clip(index, 0.0, 10.0)
    decoder = ClipDecoder(_clip(path, plan), frame_cache_size=2)
    order = np.random.default_rng(3).permutation(sorted(reference))
    for pts in order[:25]:
        before = decoder.samples_decoded
        frame = _hwc(decoder.frames_at(_times(index, [int(pts)])))[0]
        np.testing.assert_array_equal(frame, reference[int(pts)])
        if variant == "av1":  # g=2, no reordering: the key frame and at most one more sample
            assert decoder.samples_decoded - before <= 2


def test_threads_with_their_own_decoders(multi_episode):
    file = multi_episode["av1"]
    index = read_index(file.path)
    reference = decoded_frames(file.path)
    clips = [(_clip(file.path, plan := plan_clip(index, *span)), plan) for span in file.spans]
    shared = ClipDecoder(clips[0][0])
    errors: list[BaseException] = []

    def work(clip: bytes, plan: ClipPlan) -> None:
        try:
            for decoder in (ClipDecoder(clip), shared):
                own = decoder is not shared
                pts = (
                    [p for p in sorted(reference) if plan.first_needed_pts <= p <= plan.last_needed_pts]
                    if own
                    else [
                        p
                        for p in sorted(reference)
                        if clips[0][1].first_needed_pts <= p <= clips[0][1].last_needed_pts
                    ]
                )
                for p in pts[::3]:
                    np.testing.assert_array_equal(
                        _hwc(decoder.frames_at(_times(index, [p])))[0], reference[p]
                    )
        except BaseException as error:  # noqa: BLE001 - reported to the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=clip_and_plan) for clip_and_plan in clips]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


# -- API contract ------------------------------------------------------------------------


def test_tolerance_and_float_output(videos):
    path = videos["av1"]
    index = read_index(path)
    clip = _clip(path, plan_clip(index, 0.0, 1.0))
    exact = decode_clip(clip, [10 / 30, 11 / 30])
    assert exact.shape == (2, 3, index.height, index.width) and exact.dtype == torch.uint8
    assert torch.equal(decode_clip(clip, [10 / 30 + 5e-5, 11 / 30 - 5e-5]), exact)
    as_float = decode_clip(clip, [10 / 30, 11 / 30], return_uint8=False)
    assert as_float.dtype == torch.float32 and torch.equal(as_float, exact.float() / 255)
    with pytest.raises(
        FrameTimestampError, match="^One or several query timestamps unexpectedly violate the tolerance"
    ):
        decode_clip(clip, [10.5 / 30])
    assert torch.equal(decode_clip(clip, [10.4 / 30], tolerance_s=0.5 / 30), exact[:1])
    with pytest.raises(FrameTimestampError):
        decode_clip(clip, [5.0])  # outside the clip
    repeated = decode_clip(clip, [11 / 30, 10 / 30, 11 / 30])
    assert torch.equal(repeated, exact[[1, 0, 1]])


def test_leading_pictures_outside_the_clip_are_not_offered(videos):
    """An open-GOP clip never returns a frame whose references it does not hold."""
    index = read_index(videos["h264_open_gop"])
    key = next(k for k in index.keyframe_indices[1:] if np.any(index.pts[k + 1 : k + 4] < index.pts[k]))
    plan = plan_clip(index, index.pts[key] / index.timescale, index.pts[key] / index.timescale + 0.2)
    decoder = ClipDecoder(_clip(videos["h264_open_gop"], plan))
    assert plan.sample_start == key
    assert decoder.timestamps_s[0] == index.pts[key] / index.timescale
    leading_pts = int(index.pts[key + 1 : key + 4].min())
    with pytest.raises(FrameTimestampError):
        decoder.frames_at([leading_pts / index.timescale])


def test_decoder_from_plan_and_fetched_chunks(videos):
    path = videos["h264"]
    index = read_index(path)
    plan = plan_clip(index, 0.5, 1.2)
    chunks = LocalSource(path.parent).read_ranges(path.name, plan.byte_ranges)
    decoder = ClipDecoder.from_plan(plan, chunks)
    assert decoder.needed_span_s == (
        plan.first_needed_pts / index.timescale,
        plan.last_needed_pts / index.timescale,
    )
    assert torch.equal(decoder.frames_at([0.6, 0.7]), decode_clip(materialize_clip(plan, chunks), [0.6, 0.7]))


def test_not_a_clip(videos):
    with pytest.raises(VideoIndexError, match="not a clip"):
        ClipDecoder(videos["av1"].read_bytes())


@pytest.mark.parametrize("variant", ["h264", "h264_g2", "h264_open_gop", "hevc", "hevc_g2", "av1", "av1_g32"])
def test_gop_runs_in_random_order_decode_each_packet_about_once(videos, variant):
    """Anchors visited GOP by GOP (random GOP order, ascending inside): the frames of a full
    decode, each packet sent about once (exactly once for closed GOPs: a B-frame GOP is drained
    at its end instead of being fed the next GOP's packets)."""
    from lerobot_nodes.mp4 import DecodedFrameBudget
    from lerobot_nodes.mp4.plan import gop_starts

    path = videos[variant]
    index = read_index(path)
    reference = decoded_frames(path)
    presented = sorted(reference)
    span = (presented[0] / index.timescale, (presented[-1] + index.frame_duration) / index.timescale)
    plan = plan_clip(index, *span)
    starts = gop_starts(index, *span).tolist()
    bounds = [*starts, len(presented)]
    runs = [presented[bounds[i] : bounds[i + 1]] for i in range(len(starts))]
    budget = DecodedFrameBudget(limit_bytes=4 * 64 * 96 * 3)  # four frames of the 64x96 videos
    decoder = ClipDecoder(_clip(path, plan), frame_budget=budget)
    for run in np.random.default_rng(5).permutation(len(runs)):
        for pts in runs[run]:
            frame = _hwc(decoder.frames_at(_times(index, [pts])))[0]
            np.testing.assert_array_equal(frame, reference[pts], err_msg=f"{variant} pts {pts}")
            assert budget.resident_bytes <= 4 * 64 * 96 * 3
    if variant in ("h264_open_gop", "hevc_g2"):  # leading pictures reach back into the previous GOP
        assert decoder.samples_decoded <= 1.3 * plan.sample_count, (decoder.samples_decoded, plan.sample_count)
        if variant == "hevc_g2":  # short open GOPs were merged into longer runs
            assert len(starts) < len(index.keyframe_indices)
    else:
        assert decoder.samples_decoded == plan.sample_count, (decoder.samples_decoded, plan.sample_count, decoder.drains)


@pytest.mark.parametrize(
    ("variant", "window", "kept"),
    [("av1", 1, 1), ("av1", 2, 2), ("av1", 9, DEFAULT_FRAME_CACHE_SIZE), ("h264", 1, 4), ("h264", 2, 5), ("hevc", 1, 4)],
)
def test_frames_kept_follow_the_camera_window_and_reordering(videos, variant, window, kept):
    # AV1 as LeRobot writes it presents frames in decode order; x264/x265 with B-frames do not.
    path = videos[variant]
    index = read_index(path)
    plan = plan_clip(index, 0.0, 10.0)
    layout = read_clip_layout(_clip(path, plan))
    assert frames_to_keep(layout, window) == kept


@pytest.mark.parametrize(("variant", "window"), [("av1", 1), ("av1", 2), ("h264", 1), ("h264", 2), ("hevc", 1)])
def test_ascending_windows_decode_each_sample_once_with_the_frames_kept(videos, variant, window):
    # What the pool sampler's forward runs ask of a decoder: each anchor's window, anchors ascending.
    path = videos[variant]
    index = read_index(path)
    reference = decoded_frames(path)
    plan = plan_clip(index, 0.0, 10.0)
    clip = _clip(path, plan)
    decoder = ClipDecoder(clip, frame_cache_size=frames_to_keep(read_clip_layout(clip), window))
    presented = sorted(reference)
    for anchor in range(window - 1, len(presented)):
        wanted = presented[anchor - window + 1 : anchor + 1]
        frames = _hwc(decoder.frames_at(_times(index, wanted)))
        for frame, pts in zip(frames, wanted, strict=True):
            np.testing.assert_array_equal(frame, reference[pts])
    assert decoder.samples_decoded == plan.sample_count and decoder.restarts == 1
