"""delta_timestamps windows follow LeRobot's map-style rules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lerobot_nodes.sample.windows import check_delta_timestamps, delta_indices, resolve_window


def test_offsets_are_rounded_deltas_in_order_with_duplicates():
    offsets = delta_indices({"action": [0.0, 1 / 30, 1 / 30, -2 / 30]}, fps=30)
    assert offsets["action"].tolist() == [0, 1, 1, -2]


def test_deltas_off_the_frame_grid_are_rejected_with_the_offenders():
    with pytest.raises(ValueError, match=r"multiples of 1/30") as error:
        check_delta_timestamps({"action": [0.0, 0.02], "observation.state": [0.0]}, fps=30, tolerance_s=1e-4)
    assert "0.02" in str(error.value) and "action" in str(error.value)
    check_delta_timestamps({"action": [0.0, 1 / 30 + 5e-5]}, fps=30, tolerance_s=1e-4)


@given(
    length=st.integers(1, 60),
    data=st.data(),
    offsets=st.lists(st.integers(-80, 80), min_size=1, max_size=20),
    episode_start=st.integers(0, 10_000),
)
def test_window_equals_lerobot_absolute_formula(length, data, offsets, episode_start):
    frame = data.draw(st.integers(0, length - 1))
    window = resolve_window(frame, length, np.array(offsets, dtype=np.int64))
    absolute = episode_start + frame
    episode_end = episode_start + length
    expected = [max(episode_start, min(episode_end - 1, absolute + d)) - episode_start for d in offsets]
    expected_pad = [(absolute + d < episode_start) | (absolute + d >= episode_end) for d in offsets]
    assert window.frames.tolist() == expected
    assert window.is_pad.tolist() == expected_pad
