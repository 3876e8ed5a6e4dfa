"""Mutated and truncated real MP4s give only clean errors: never another exception, never a hang.

When a mutated file is still accepted, the rest of the pipeline must hold up too: planning,
clip materialisation (``len == plan.size``), re-reading the clip and decoding a few frames
raise only this package's errors.
"""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from lerobot_nodes.errors import FrameTimestampError, VideoDecodeError, VideoIndexError
from lerobot_nodes.mp4 import ClipDecoder, materialize_clip, read_clip, read_index_from_bytes
from lerobot_nodes.mp4.plan import plan_clip

from .mp4_edit import top_level

INTERESTING_WORDS = [0, 1, 2, 7, 8, 16, 255, 0x7FFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF]  # fmt: skip
MUTATION_SETTINGS = settings(
    max_examples=300,
    deadline=5000,  # milliseconds per example: a hang fails the test instead of stalling it
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@dataclass(frozen=True)
class Mutation:
    """A truncation (``length``) or byte overwrites, printed small when hypothesis reports it."""

    length: int | None = None
    writes: tuple[tuple[int, bytes], ...] = ()

    def apply(self, data: bytes) -> bytes:
        if self.length is not None:
            return data[: self.length]
        buffer = bytearray(data)
        for position, value in self.writes:
            buffer[position : position + len(value)] = value
        return bytes(buffer)


@st.composite
def mutations(draw: st.DrawFn, size: int, moov: tuple[int, int]) -> Mutation:
    """Truncation anywhere, or bytes / 32-bit words overwritten (mostly inside moov)."""
    kind = draw(st.sampled_from(["truncate", "moov_bytes", "moov_word", "moov_word", "anywhere"]))
    moov_start, moov_end = moov
    if kind == "truncate":
        return Mutation(length=draw(st.integers(0, size - 1)))
    if kind == "moov_word":
        words = st.one_of(st.sampled_from(INTERESTING_WORDS), st.integers(0, 2**32 - 1))
        writes = draw(
            st.lists(st.tuples(st.integers(moov_start, moov_end - 4), words), min_size=1, max_size=3)
        )
        return Mutation(writes=tuple((position, struct.pack(">I", word)) for position, word in writes))
    low, high = (moov_start, moov_end - 1) if kind == "moov_bytes" else (0, size - 1)
    writes = draw(st.lists(st.tuples(st.integers(low, high), st.integers(0, 255)), min_size=1, max_size=8))
    return Mutation(writes=tuple((position, bytes([value])) for position, value in writes))


def _exercise(data: bytes, span_seed: float) -> None:
    try:
        index = read_index_from_bytes(data, "mutated.mp4")
    except VideoIndexError:
        return
    sorted_pts = np.sort(index.pts)
    first = sorted_pts[int(span_seed * (len(sorted_pts) - 1))] / index.timescale
    try:
        plan = plan_clip(index, first, first + 0.2)
    except (FrameTimestampError, VideoIndexError):
        return
    chunks = [data[start:end] for start, end in plan.byte_ranges]
    clip = materialize_clip(plan, chunks)
    assert len(clip) == plan.size
    clip_index, origin = read_clip(clip)  # the clip of an accepted index always parses
    assert len(clip_index) == plan.sample_count and origin.time_offset == plan.time_offset
    decoder = ClipDecoder(clip)
    with contextlib.suppress(VideoDecodeError, FrameTimestampError):
        decoder.frames_at(decoder.timestamps_s[:2].tolist())


def _moov_range(path: Path) -> tuple[int, int]:
    _, start, size = next(box for box in top_level(path) if box[0] == b"moov")
    return start, start + size


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["av1_faststart", "h264", "h264_starts_at_7"])
def test_mutated_files_raise_only_clean_errors(videos, variant):
    _check_mutations_of(videos[variant])


@pytest.mark.timeout(300)
def test_mutated_multi_episode_file(multi_episode):
    _check_mutations_of(multi_episode["h264"].path)


@pytest.mark.timeout(300)
def test_a_codec_dropping_a_frame_raises_instead_of_looping(videos, multi_episode):
    """Hypothesis seed 5 (hypothesis 6.170) found a clip whose codec never outputs a wanted frame:
    the decoder drained at the clean cut after it, went back to its key frame, and drained again,
    forever (the test stalled instead of failing). Now the frame is a clean VideoDecodeError."""
    for path in (*(videos[v] for v in ("av1_faststart", "h264", "h264_starts_at_7")), multi_episode["h264"].path):
        _check_mutations_of(path, fixed_seed=5)


def _check_mutations_of(path, fixed_seed=None):
    """Hypothesis-mutated copies of ``path`` index, plan and decode cleanly or raise clean errors."""
    data = path.read_bytes()

    @MUTATION_SETTINGS
    @given(mutations(len(data), _moov_range(path)), st.floats(0, 1))
    def check(mutation: Mutation, span_seed: float) -> None:
        _exercise(mutation.apply(data), span_seed)

    if fixed_seed is not None:
        check = seed(fixed_seed)(check)
    check()


@pytest.mark.timeout(120)
def test_every_truncation_of_the_moov_is_rejected(videos):
    """Cutting the file anywhere inside (or before the end of) moov is always a VideoIndexError."""
    path = videos["h264_faststart"]
    data = path.read_bytes()
    _, moov_end = _moov_range(path)
    for length in range(0, moov_end, 7):
        with pytest.raises(VideoIndexError):
            read_index_from_bytes(data[:length], "truncated.mp4")
