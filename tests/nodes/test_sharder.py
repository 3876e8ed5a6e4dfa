"""Rank/worker sharding: whole episodes, frame-balanced, deterministic, clear errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_nodes.errors import ConfigError
from lerobot_nodes.nodes import (
    RankWorkerSharder,
    frame_balanced_assignment,
    max_workers_for_rank,
    worker_episodes,
)
from lerobot_nodes.testing.resume_contract import assert_resumes_exactly

lengths_strategy = st.lists(st.integers(1, 500), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_strategy, parts=st.integers(1, 9), seed=st.integers(-(2**40), 2**40))
def test_assignment_is_a_frame_balanced_partition(lengths, parts, seed):
    assignment = frame_balanced_assignment(lengths, parts, seed)
    assert len(assignment) == parts
    flat = sorted(i for part in assignment for i in part)
    assert flat == list(range(len(lengths)))
    assert all(part == sorted(part) for part in assignment)
    totals = [sum(lengths[i] for i in part) for part in assignment]
    assert max(totals) - min(totals) <= max(lengths)
    if len(lengths) >= parts:
        assert all(assignment)
    assert assignment == frame_balanced_assignment(lengths, parts, seed)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), lengths=lengths_strategy, world=st.integers(1, 4), workers=st.integers(1, 4), seed=st.integers(0, 2**32))
def test_ranks_and_workers_split_every_episode_once(data, lengths, world, workers, seed):
    episodes = sorted(data.draw(st.sets(st.integers(0, 10_000), min_size=len(lengths), max_size=len(lengths))))
    if len(episodes) < world:
        with pytest.raises(ConfigError, match="no rank has data"):
            worker_episodes(episodes, lengths, 0, world, 0, 1, seed)
        return
    seen: list[int] = []
    for rank in range(world):
        usable = min(workers, max_workers_for_rank(episodes, lengths, rank, world, seed))
        for worker in range(usable):
            part = worker_episodes(episodes, lengths, rank, world, worker, usable, seed)
            assert part
            seen.extend(part)
    assert sorted(seen) == episodes


def test_no_rank_has_data_names_the_counts_and_the_fix():
    with pytest.raises(ConfigError) as error:
        worker_episodes([3, 4], [10, 10], rank=0, world_size=3, worker_id=0, num_workers=1, seed=1)
    message = str(error.value)
    assert "2 selected episode(s) for 3 ranks" in message and "use at most 2 rank(s)" in message


def test_a_worker_needs_at_least_one_episode():
    with pytest.raises(ConfigError, match="a worker needs at least one whole episode: use --num_workers=2"):
        worker_episodes([0, 1], [5, 5], rank=0, world_size=1, worker_id=0, num_workers=3, seed=1)


def test_seed_changes_the_split_and_the_order_but_not_the_balance():
    lengths = [10] * 12
    episodes = list(range(12))
    split = {seed: worker_episodes(episodes, lengths, 0, 2, 0, 1, seed) for seed in range(6)}
    assert len({tuple(v) for v in split.values()}) > 1
    sharder = RankWorkerSharder(episodes, lengths, seed=5)
    assert sharder.epoch_order(0) == RankWorkerSharder(episodes, lengths, seed=5).epoch_order(0)
    assert sharder.epoch_order(0) != sharder.epoch_order(1)
    assert sorted(sharder.epoch_order(3)) == episodes
    assert RankWorkerSharder(episodes, lengths, seed=None).epoch_order(0) == RankWorkerSharder(
        episodes, lengths, seed=42
    ).epoch_order(0)


def test_sharder_node_epochs_and_state():
    sharder = RankWorkerSharder(list(range(6)), [3] * 6, seed=1)
    first = list(sharder)
    sharder.reset()
    second = list(sharder)
    assert sorted(first) == sorted(second) == list(range(6)) and first != second
    assert sharder.epoch == 1
    sharder.reset()
    next(sharder)
    next(sharder)
    state = sharder.state_dict()
    rest = list(sharder)
    restored = RankWorkerSharder(list(range(6)), [3] * 6, seed=1)
    restored.reset(state)
    assert list(restored) == rest
    # A restored epoch that had started moves on at the next reset(None).
    restored.reset(state)
    restored.reset()
    assert restored.epoch == state["epoch"] + 1


def test_restoring_with_another_topology_is_refused():
    state = RankWorkerSharder(list(range(6)), [3] * 6, num_workers=2).state_dict()
    other = RankWorkerSharder(list(range(6)), [3] * 6, num_workers=3)
    with pytest.raises(ConfigError, match="resume with the same world size, --num_workers"):
        other.reset(state)


@pytest.mark.parametrize("num_workers", [1, 3])
def test_sharder_keeps_the_resume_contract(num_workers):
    lengths = [3, 9, 4, 7, 2, 8, 5]
    assert_resumes_exactly(
        lambda: RankWorkerSharder(list(range(7)), lengths, worker_id=num_workers - 1, num_workers=num_workers, seed=4),
        cuts=range(0, 8),
    )
