"""Open anchor runs: an episode's GOP runs interleaved, several open at once (issue 24).

The frame order stays a permutation with each run ascending (exact coverage, one decoder per open
run decodes forward); the schedule is a pure function of its inputs and resumes exactly; and the
correlation bound: two anchors of one run are never closer than the open runs in the episode's
own order (exactly ``open_runs`` apart while unopened runs remain), so the anchors of one episode
that share a batch come from different runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_nodes.batch_mixing import MixingTally, uniform_mixing
from lerobot_nodes.nodes import EpisodePoolSampler, RankWorkerSharder
from lerobot_nodes.nodes.pool_sampler import RunStrands, frame_order, interleave_runs
from lerobot_nodes.testing.resume_contract import assert_resumes_exactly


def _runs(lengths):
    bounds = np.cumsum([0, *lengths])
    return [np.arange(bounds[i], bounds[i + 1]) for i in range(len(lengths))]


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), min_size=0, max_size=30), open_runs=st.integers(1, 9))
def test_interleaved_runs_are_a_permutation_with_each_run_ascending_and_far_apart(lengths, open_runs):
    runs = _runs(lengths)
    order = interleave_runs(runs, open_runs)
    total = sum(lengths)
    assert sorted(order.tolist()) == list(range(total))
    run_of = np.repeat(np.arange(len(lengths)), lengths)
    position = np.empty(total, dtype=np.int64)
    position[order] = np.arange(total)
    first = {r: position[run].min() for r, run in enumerate(runs) if len(run)}
    last = {r: position[run].max() for r, run in enumerate(runs) if len(run)}
    for r, run in enumerate(runs):
        where = position[run]
        assert np.all(np.diff(where) > 0)  # ascending within the run: decoded forward
        for i, j in zip(where[:-1], where[1:], strict=True):
            # The bound: at least as far apart as the runs open at j ...
            open_at_j = sum(1 for s in first if first[s] <= j <= last[s])
            assert j - i >= min(open_runs, open_at_j)
            # ... and exactly open_runs apart while a run is still to be opened.
            if any(first[s] > j for s in first):
                assert j - i == open_runs
        assert run_of[run].tolist() == [r] * len(run)
    if open_runs == 1:
        assert order.tolist() == list(range(total))


@given(length=st.integers(1, 200), seed=st.integers(0, 2**31), gop=st.integers(1, 40))
@settings(max_examples=60, deadline=None)
def test_one_open_run_is_todays_order_and_more_keep_the_same_runs(length, seed, gop):
    starts = np.arange(gop, length, gop)
    today = frame_order(seed, 0, 3, length, run_starts=starts)
    interleaved = frame_order(seed, 0, 3, length, run_starts=starts, open_runs=4)
    assert sorted(interleaved.tolist()) == list(range(length))
    assert frame_order(seed, 0, 3, length, run_starts=starts, open_runs=1).tolist() == today.tolist()
    # The same runs opened in the same order: first frames of the runs appear in the same sequence.
    firsts = [f for f in today.tolist() if f % gop == 0]
    assert [f for f in interleaved.tolist() if f % gop == 0] == firsts


def _sampler(episodes, lengths, open_runs, gop, seed=0, pool_size=4, strategy="remaining", strands=None):
    sharder = RankWorkerSharder(
        episodes, lengths, rank=0, world_size=1, worker_id=0, num_workers=1, seed=seed
    )
    return EpisodePoolSampler(
        sharder,
        pool_size=pool_size,
        strategy=strategy,
        seed=seed,
        run_starts=lambda e: np.arange(gop, 10_000, gop),
        runs="gop-test",
        open_runs=open_runs,
        strands=strands,
    )


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 90), min_size=1, max_size=8),
    open_runs=st.integers(1, 8),
    gop=st.integers(1, 40),
    draws=st.integers(0, 6),
    seed=st.integers(0, 2**31),
    strategy=st.sampled_from(("remaining", "round_robin")),
    data=st.data(),
)
def test_open_runs_cover_each_frame_once_same_seed_same_order_and_resume_exactly(
    lengths, open_runs, gop, draws, seed, strategy, data
):
    """With and without stranded runs (``draws`` >= 2: a batch takes that many anchors of an episode)."""
    episodes = list(range(len(lengths)))
    strands = RunStrands(draws=draws, kept=4, frames_per_episode=10_000) if draws >= 2 else None

    def make():
        return _sampler(episodes, lengths, open_runs, gop, seed, strategy=strategy, strands=strands)

    items = list(make())
    expected = [(i.episode, i.frame) for i in items]
    assert sorted(expected) == sorted(
        (e, f) for e, n in zip(episodes, lengths, strict=True) for f in range(n)
    )
    assert [(i.episode, i.frame) for i in make()] == expected
    cut = data.draw(st.integers(0, len(expected)))
    run = make()
    head = [next(run) for _ in range(cut)]
    resumed = make()
    resumed.reset(run.state_dict())
    tail = list(resumed)
    assert [(i.episode, i.frame) for i in head + tail] == expected
    assert [i.reach for i in head + tail] == [i.reach for i in items]
    fast = make()
    fast.reset(None)
    if cut:
        fast.fast_forward(cut)
    assert fast.state_dict() == run.state_dict()


def test_the_open_run_count_is_saved_and_another_count_is_refused():
    from lerobot_nodes.errors import ConfigError

    saved = _sampler([0, 1], [30, 30], 4, 5)
    next(saved)
    other = _sampler([0, 1], [30, 30], 2, 5)
    with pytest.raises(ConfigError, match="open-4"):
        other.reset(saved.state_dict())


@pytest.mark.parametrize("open_runs", [4, 8])
def test_open_runs_keep_the_resume_contract(open_runs):
    assert_resumes_exactly(
        lambda: _sampler(list(range(6)), [40, 33, 25, 50, 12, 31], open_runs, 6),
        cuts=[0, 1, 7, 60, 133, 190, 191],
        consume=lambda item: (item.episode, item.frame),
    )


def test_open_runs_bring_same_episode_near_pairs_close_to_a_shuffle():
    """GOP 30 runs, 12 episodes of 300 frames, pool 12, batches of 32: near pairs fall from about
    1 in 13 pairs (one open run, 28x a shuffle) to 2.1x a uniform shuffle with 8 open runs."""
    lengths = [300] * 12
    base = uniform_mixing(lengths, 32)
    shares = {}
    for open_runs in (1, 8):
        tally = MixingTally()
        items = list(_sampler(list(range(12)), lengths, open_runs, 30, pool_size=12))
        for start in range(0, len(items) - 31, 32):
            batch = items[start : start + 32]
            tally.observe([i.episode for i in batch], [i.frame for i in batch])
        shares[open_runs] = tally.figures(lengths).near_pairs
    assert shares[1] > 10 * base.near_pairs
    assert (
        shares[8] <= 2.5 * base.near_pairs
    )  # 2.1x measured: the last runs of an episode run with fewer open
