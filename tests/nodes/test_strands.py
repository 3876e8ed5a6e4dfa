"""Stranded runs: an episode with fewer GOP runs than the anchors a batch takes of it (issue 24 item 2).

A run read in ``ways`` strands (``strand_run``) is a permutation of the run whose ``ways`` consecutive
anchors are pairwise at least ``STRAND_STRIDE - 1`` frames apart, and whose decoder never reads more
than ``strand_reach`` frames ahead of the run's lowest undelivered frame; the sampler with strands
resumes exactly (coverage and determinism: ``test_open_runs``) and refuses a checkpoint of another run
rule; and on 8 episodes of 120 frames with GOP 60 (two runs per episode, a batch of 32
takes 4 anchors of each) strands bring same-episode near pairs from about 3x a uniform shuffle's to
below it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_nodes.batch_mixing import NEAR_FRAMES, MixingTally, uniform_mixing
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.nodes.pool_sampler import STRAND_STRIDE, RunStrands, frame_order, strand_reach, strand_run
from lerobot_nodes.testing.resume_contract import assert_resumes_exactly

from .test_open_runs import _sampler as open_runs_sampler


def _reach_used(order: np.ndarray, first: int, length: int) -> int:
    """How far the decoder of ``order`` (a run of ``length`` frames from ``first``) reads ahead of the
    run's lowest undelivered frame at most."""
    delivered = np.zeros(length, dtype=bool)
    furthest, lowest, reach = -1, 0, 0
    for frame in (order - first).tolist():
        delivered[frame] = True
        furthest = max(furthest, frame)
        while lowest < length and delivered[lowest]:
            lowest += 1
        if lowest < length:
            reach = max(reach, furthest - lowest)
    return reach


@settings(max_examples=300, deadline=None)
@given(length=st.integers(0, 400), ways=st.integers(1, 8), first=st.integers(0, 1000))
def test_a_stranded_run_keeps_neighbouring_anchors_apart_within_its_reach(length, ways, first):
    run = np.arange(first, first + length, dtype=np.int64)
    order = strand_run(run, ways)
    assert sorted(order.tolist()) == run.tolist()
    if length < ways * STRAND_STRIDE or ways == 1:
        assert order.tolist() == run.tolist() and strand_reach(length, ways) == 0
        return
    for i in range(len(order)):
        window = order[i : i + ways]
        gaps = np.abs(window[:, None] - window[None, :])[np.triu_indices(len(window), 1)]
        assert gaps.min(initial=STRAND_STRIDE) >= STRAND_STRIDE - 1 > NEAR_FRAMES, (i, window.tolist())
    assert _reach_used(order, first, length) <= strand_reach(length, ways) <= (ways - 1) * 2 * STRAND_STRIDE


def test_the_ways_a_batch_needs_fit_the_budget():
    strands = RunStrands(draws=4, kept=4, frames_per_episode=46)
    assert strands.ways(open_runs=2, run_length=60) == 2  # 4 anchors a batch over 2 runs
    assert strands.ways(open_runs=4, run_length=60) == 1  # one per run already
    assert strands.ways(open_runs=1, run_length=60) == 4
    assert strands.ways(open_runs=2, run_length=13) == 1  # too short for two strands of 7
    # Two runs keep 2 x (4 + 8) frames with two ways: a budget of 23 frames per episode cannot.
    assert RunStrands(draws=4, kept=4, frames_per_episode=23).ways(open_runs=2, run_length=60) == 1
    assert RunStrands(draws=8, kept=4, frames_per_episode=2 * (4 + 20)).ways(open_runs=2, run_length=60) == 3


def _sampler(lengths, gop, strands, open_runs=5, seed=0, pool_size=8, strategy="round_robin"):
    episodes = list(range(len(lengths)))
    return open_runs_sampler(episodes, lengths, open_runs, gop, seed, pool_size, strategy, strands=strands)


STRANDS = RunStrands(draws=4, kept=4, frames_per_episode=46)


def test_stranded_runs_keep_the_resume_contract():
    assert_resumes_exactly(
        lambda: _sampler([120, 90, 61, 150, 33, 120], 60, STRANDS, pool_size=4),
        cuts=[0, 1, 7, 100, 301, 573, 574],
        consume=lambda item: (item.episode, item.frame, item.reach),
    )


def test_items_carry_their_runs_reach_and_the_strands_are_in_the_saved_settings():
    items = list(_sampler([120] * 2, 60, STRANDS))
    assert {i.reach for i in items} == {strand_reach(60, 2)}
    plain = list(_sampler([120] * 2, 60, None))
    assert {i.reach for i in plain} == {0}
    order = frame_order(0, 0, 0, 120, run_starts=[60], open_runs=5, strands=STRANDS)
    assert sorted(order.tolist()) == list(range(120))
    saved = _sampler([120] * 2, 60, STRANDS)
    next(saved)
    for other in (None, RunStrands(draws=4, kept=4, frames_per_episode=47)):
        with pytest.raises(ConfigError, match="strands"):
            _sampler([120] * 2, 60, other).reset(saved.state_dict())


def _near_pairs(lengths, strands):
    tally = MixingTally()
    items = list(_sampler(lengths, 60, strands))
    for start in range(0, len(items) - 31, 32):
        batch = items[start : start + 32]
        tally.observe([i.episode for i in batch], [i.frame for i in batch])
    return tally.figures(lengths).near_pairs


def test_strands_bring_the_near_pairs_of_few_long_gop_episodes_to_a_shuffles():
    """8 episodes of 120 frames, GOP 60 (the HEVC g60 dataset of RESULTS 14): a batch of 32 takes 4
    anchors of each episode from its 2 runs. Read forward, each run gives a batch two neighbouring
    frames (3.2x a shuffle's near pairs); in 2 strands, two frames 7-8 apart."""
    lengths = [120] * 8
    uniform = uniform_mixing(lengths, 32).near_pairs
    assert _near_pairs(lengths, None) > 3 * uniform
    assert _near_pairs(lengths, STRANDS) <= uniform
