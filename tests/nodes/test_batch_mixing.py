"""Batch-mixing figures (lerobot_nodes.batch_mixing): exact values on hand-made batches, the
uniform baseline's closed form against a brute-force shuffle, and the report's line and table."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from lerobot_nodes.batch_mixing import (
    MixingTally,
    expected_distinct_episodes,
    near_pair_count,
    uniform_mixing,
)
from lerobot_nodes.metrics import StreamingMetrics


def test_hand_made_batches_give_exact_figures():
    tally = MixingTally()
    # Batch 1: episodes 0,0,0,1 at frames 0,3,10,3: same-episode pairs (0,3) d=3, (0,10) d=10, (3,10) d=7.
    assert tally.observe(torch.tensor([0, 0, 0, 1]), torch.tensor([0, 3, 10, 3]))
    # Batch 2: episodes 2,2,3 at frames 4,4,9: one pair at distance 0 (another epoch's frame).
    assert tally.observe(np.array([2, 2, 3]), np.array([4, 4, 9]))
    figures = tally.figures(gop=8)
    assert figures.batches == 2 and figures.batch_size == 4
    assert figures.distinct_episodes == (2 + 2) / 2
    assert tally.pairs == 6 + 3
    assert figures.near_pairs == 2 / 9  # d=3 and d=0
    assert figures.gop_pairs == 3 / 9  # d < 8: 3, 7, 0
    assert tally.pairs_within(10) == 4
    assert math.isnan(figures.uniform_near_pairs)  # no selection given


def test_a_single_sample_or_a_batch_without_indexes_counts_no_pairs():
    tally = MixingTally()
    assert tally.observe([7], [1])
    assert not tally.observe_batch({"action": torch.zeros(3)})
    assert not tally.observe_batch({"episode_index": torch.tensor([1.5]), "frame_index": torch.tensor([1.0])})
    figures = tally.figures()
    assert figures.batches == 1 and figures.distinct_episodes == 1 and math.isnan(figures.near_pairs)


def test_near_pair_count_matches_enumeration():
    lengths = [1, 2, 5, 9, 9, 30]
    for within in (0, 1, 4, 5, 29, 100):
        brute = sum(
            1 for length in lengths for a, b in itertools.combinations(range(length), 2) if b - a <= within
        )
        assert near_pair_count(lengths, within) == brute


def test_expected_distinct_episodes_matches_enumeration():
    lengths = [3, 1, 2]  # frames: 6; all 20 batches of 3
    frames = [e for e, n in enumerate(lengths) for _ in range(n)]
    batches = list(itertools.combinations(range(len(frames)), 3))
    brute = sum(len({frames[i] for i in batch}) for batch in batches) / len(batches)
    assert expected_distinct_episodes(lengths, 3) == pytest.approx(brute, rel=1e-12)
    assert expected_distinct_episodes(lengths, 10) == pytest.approx(3.0)


def test_uniform_baseline_matches_a_brute_force_shuffle():
    rng = np.random.default_rng(3)
    lengths = rng.integers(20, 400, size=40)
    batch_size = 32
    base = uniform_mixing(lengths, batch_size, gop=30)
    episodes = np.repeat(np.arange(len(lengths)), lengths)
    frames = np.concatenate([np.arange(n) for n in lengths])
    tally = MixingTally()
    for _ in range(30):  # 30 shuffled epochs, full batches only
        order = rng.permutation(len(episodes))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            chosen = order[start : start + batch_size]
            tally.observe(episodes[chosen], frames[chosen])
    measured = tally.figures(lengths, gop=30)
    assert measured.distinct_episodes == pytest.approx(base.distinct_episodes, rel=0.01)
    assert measured.uniform_distinct_episodes == pytest.approx(base.distinct_episodes)
    assert measured.near_pairs == pytest.approx(base.near_pairs, rel=0.05)
    assert measured.gop_pairs == pytest.approx(base.gop_pairs, rel=0.03)


def test_uniform_baseline_is_cheap_for_a_million_episodes():
    lengths = np.random.default_rng(0).integers(50, 2000, size=1_000_000)
    base = uniform_mixing(lengths, 32, gop=30)
    assert 31.9 < base.distinct_episodes <= 32
    assert 0 < base.near_pairs < 1e-8


def test_report_shows_the_figures_with_a_selection():
    metrics = StreamingMetrics(log_every_s=None)
    metrics.set_selection([10, 10], gop_frames=4)
    batches = [
        {"episode_index": torch.tensor([0, 0, 1]), "frame_index": torch.tensor([1, 2, 5])},
        {"episode_index": torch.tensor([1, 0, 1]), "frame_index": torch.tensor([9, 7, 0])},
    ]
    assert len(list(metrics.timed(batches))) == 2
    report = metrics.report()
    mixing = report.mixing
    assert mixing.distinct_episodes == 2.0
    assert mixing.near_pairs == 1 / 6  # (1,2) only; (9,0) is 9 apart
    assert mixing.uniform_near_pairs == 2 * near_pair_count([10], 5) / (20 * 19 / 2)
    assert mixing.uniform_distinct_episodes == pytest.approx(expected_distinct_episodes([10, 10], 3))
    assert "batch mixing" in report.line() and "within one GOP (4)" in report.line()
    assert "distinct episodes per batch" in report.table()
