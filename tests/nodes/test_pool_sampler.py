"""The logical schedule: exact coverage, determinism, resume, pool limits, both strategies."""

from __future__ import annotations

import bisect
import collections
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_nodes.errors import ByteBudgetError, ConfigError
from lerobot_nodes.fetch import ByteBudget
from lerobot_nodes.nodes import max_workers_for_rank
from lerobot_nodes.testing.resume_contract import assert_resumes_exactly

from .helpers import make_sampler, pairs

STRATEGIES = ("remaining", "round_robin")


@st.composite
def datasets(draw, max_episodes=20, max_length=25):
    lengths = draw(st.lists(st.integers(1, max_length), min_size=1, max_size=max_episodes))
    episodes = sorted(draw(st.sets(st.integers(0, 500), min_size=len(lengths), max_size=len(lengths))))
    return episodes, lengths


@settings(max_examples=120, deadline=None)
@given(
    dataset=datasets(),
    world=st.integers(1, 3),
    workers=st.integers(1, 3),
    pool_size=st.integers(1, 6),
    strategy=st.sampled_from(STRATEGIES),
    seed=st.integers(0, 2**31),
    budgeted=st.booleans(),
    data=st.data(),
)
def test_every_selected_frame_exactly_once_per_epoch(dataset, world, workers, pool_size, strategy, seed, budgeted, data):
    """Schedules of all (rank, worker) pairs are disjoint and together cover each frame once."""
    episodes, lengths = dataset
    if len(episodes) < world:
        return
    length_of = dict(zip(episodes, lengths, strict=True))
    costs = {e: data.draw(st.integers(0, 100)) for e in episodes} if budgeted else None
    budget = ByteBudget(worker_bytes=150, rank_bytes=10_000) if budgeted else None
    seen: list[tuple[int, int]] = []
    for rank in range(world):
        usable = min(workers, max_workers_for_rank(episodes, lengths, rank, world, seed))
        for worker in range(usable):
            sampler = make_sampler(
                episodes, lengths, rank=rank, world_size=world, worker_id=worker, num_workers=usable,
                pool_size=pool_size, strategy=strategy, seed=seed, costs=costs, budget=budget,
            )
            sampler.reset()
            while True:
                try:
                    item = next(sampler)
                except StopIteration:
                    break
                resident = sampler.resident_episodes()
                assert len(resident) <= pool_size
                if budget is not None and costs is not None and len(resident) > 1:
                    assert sum(costs[e] for e in resident) <= budget.worker_bytes
                seen.append((item.episode, item.frame))
    expected = sorted((e, f) for e in episodes for f in range(length_of[e]))
    assert sorted(seen) == expected


@settings(max_examples=60, deadline=None)
@given(dataset=datasets(), pool_size=st.integers(1, 5), strategy=st.sampled_from(STRATEGIES), seed=st.integers(0, 2**31), data=st.data())
def test_resume_from_any_saved_point_reproduces_the_rest(dataset, pool_size, strategy, seed, data):
    episodes, lengths = dataset
    reference = make_sampler(episodes, lengths, pool_size=pool_size, strategy=strategy, seed=seed)
    epoch0 = list(reference)
    reference.reset()  # the next epoch: a different schedule, resumable as well
    epoch1 = list(reference)
    total = sum(lengths)
    assert len(epoch0) == len(epoch1) == total
    for expected in (epoch0, epoch1):
        cut = data.draw(st.integers(0, total))
        run = make_sampler(episodes, lengths, pool_size=pool_size, strategy=strategy, seed=seed)
        if expected is epoch1:
            list(run)
            run.reset()
        head = [next(run) for _ in range(cut)]
        state = run.state_dict()
        resumed = make_sampler(episodes, lengths, pool_size=pool_size, strategy=strategy, seed=seed)
        resumed.reset(state)
        assert head + list(resumed) == expected


def test_same_seed_same_schedule_different_seed_different_schedule():
    episodes, lengths = list(range(10)), [20] * 10
    for strategy in STRATEGIES:
        runs = {seed: pairs(list(make_sampler(episodes, lengths, strategy=strategy, seed=seed))) for seed in (1, 1, 2)}
        assert runs[1] == pairs(list(make_sampler(episodes, lengths, strategy=strategy, seed=1)))
        assert runs[1] != runs[2]
        assert pairs(list(make_sampler(episodes, lengths, strategy=strategy, seed=None))) == pairs(
            list(make_sampler(episodes, lengths, strategy=strategy, seed=42))
        )


def test_epochs_differ_and_the_state_is_small_plain_data():
    sampler = make_sampler(list(range(8)), [5] * 8, pool_size=3, seed=3)
    first = pairs(list(sampler))
    sampler.reset()
    assert sorted(pairs(list(sampler))) == sorted(first) and pairs(list(sampler)) == []
    sampler.reset()
    next(sampler)
    state = sampler.state_dict()
    assert state["source"]["epoch"] == 2

    def plain(value):
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, list):
            return all(plain(v) for v in value)
        return isinstance(value, (int, str, bool))

    assert plain(state), state


def test_round_robin_takes_one_frame_of_each_resident_episode_per_round():
    # Admission order is fixed (no shuffle): 0 and 1 are resident, 2 waits for a free slot.
    sampler = make_sampler([0, 1, 2], [1, 4, 4], pool_size=2, strategy="round_robin", shuffle=False, seed=0)
    items = list(sampler)
    episodes = [item.episode for item in items]
    assert set(episodes[:2]) == {0, 1}, "the first round holds exactly the two resident episodes"
    # Episode 2 is admitted when 0 is exhausted, during round one: it joins round two.
    assert episodes[2:4] in ([1, 2], [2, 1])
    for start in range(2, 8, 2):
        assert sorted(episodes[start : start + 2]) == [1, 2]
    assert sorted(pairs(items)) == [(0, 0)] + [(e, f) for e in (1, 2) for f in range(4)]


def test_remaining_weights_episodes_by_their_unvisited_frames():
    short_first = 0
    for seed in range(300):
        sampler = make_sampler([0, 1], [1, 99], pool_size=2, seed=seed)
        short_first += next(sampler).episode == 0
    assert short_first <= 12  # expected 3 of 300


def test_pool_and_budget_bound_the_resident_episodes():
    costs = {e: 40 for e in range(10)}
    sampler = make_sampler(list(range(10)), [6] * 10, pool_size=8, costs=costs, budget=ByteBudget(100, 1000), seed=2)
    peak = 0
    for _ in sampler:
        peak = max(peak, len(sampler.resident_episodes()))
    assert peak == 2  # 3 x 40 bytes would exceed the 100-byte worker budget


def test_an_episode_larger_than_the_worker_share_runs_alone():
    costs = {0: 10, 1: 300, 2: 10}
    sampler = make_sampler([0, 1, 2], [3, 3, 3], pool_size=3, costs=costs, budget=ByteBudget(100, 400), shuffle=False)
    while True:
        try:
            item = next(sampler)
        except StopIteration:
            break
        if 1 in sampler.resident_episodes() or item.episode == 1:
            assert sampler.resident_episodes() in ([1], [])


def test_an_episode_larger_than_the_rank_budget_fails_before_admission():
    sampler = make_sampler([0, 1], [3, 3], costs={0: 10, 1: 5_000_000_000}, budget=ByteBudget(10**9, 2 * 10**9), shuffle=False)
    with pytest.raises(ByteBudgetError) as error:
        list(sampler)
    message = str(error.value)
    assert "episode 1 needs 5000000000 bytes" in message and "2000000000 bytes" in message
    assert "--dataset.streaming_byte_budget_gb" in message and "smaller episode spans" in message


def test_resuming_with_other_settings_is_refused():
    state = make_sampler([0, 1], [3, 3], pool_size=2, seed=1).state_dict()
    with pytest.raises(ConfigError, match="keep --dataset.streaming_sampling_strategy"):
        make_sampler([0, 1], [3, 3], pool_size=2, seed=2).reset(state)


def test_random_cut_points_on_a_larger_schedule():
    rng = random.Random(0)
    lengths = [rng.randint(50, 400) for _ in range(60)]
    episodes = list(range(60))
    for strategy in STRATEGIES:
        full = pairs(list(make_sampler(episodes, lengths, pool_size=16, strategy=strategy, seed=9)))
        assert sorted(full) == sorted((e, f) for e in episodes for f in range(lengths[e]))
        for cut in rng.sample(range(len(full)), 3):
            run = make_sampler(episodes, lengths, pool_size=16, strategy=strategy, seed=9)
            for _ in range(cut):
                next(run)
            state = run.state_dict()
            # The same state, computed on the schedule alone (step-offset resume).
            assert run.state_after(cut, epoch=0) == state
            resumed = make_sampler(episodes, lengths, pool_size=16, strategy=strategy, seed=9)
            resumed.reset(state)
            assert pairs(list(resumed)) == full[cut:]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_pool_sampler_keeps_the_resume_contract(strategy):
    episodes, lengths = list(range(6)), [4, 7, 3, 9, 5, 6]
    assert_resumes_exactly(
        lambda: make_sampler(episodes, lengths, pool_size=3, strategy=strategy, seed=8),
        cuts=[0, 1, 5, 17, 33, 34],
        consume=lambda item: (item.episode, item.frame),
    )


@settings(max_examples=150, deadline=None)
@given(dataset=datasets(max_episodes=30, max_length=12), pool_size=st.integers(2, 8), seed=st.integers(0, 2**31), data=st.data())
def test_round_robin_bounds_one_episodes_share_of_any_batch(dataset, pool_size, seed, data):
    """The correlation bound of the default strategy: a window of B consecutive samples (B <= pool) takes at
    most 2 of one episode while B or more episodes still have frames after it (a round is a permutation of the
    resident episodes, at least B of them then, so the window spans at most two rounds); fewer than B episodes
    left, at most ceil(B / left) + 1 of one."""
    episodes, lengths = dataset
    batch = data.draw(st.integers(2, pool_size))
    picks = [item.episode for item in make_sampler(episodes, lengths, pool_size=pool_size, strategy="round_robin", seed=seed)]
    assert sorted(collections.Counter(picks).items()) == sorted(zip(episodes, lengths, strict=True))
    last_pick = {episode: position for position, episode in enumerate(picks)}
    ends = sorted(last_pick.values())
    for start in range(len(picks) - batch + 1):
        end = start + batch - 1
        left = len(ends) - bisect.bisect_right(ends, end)  # episodes with frames after the window
        most = max(collections.Counter(picks[start : end + 1]).values())
        bound = 2 if left >= batch else -(-batch // max(1, left)) + 1
        assert most <= bound, (start, picks[start : end + 1], left)
