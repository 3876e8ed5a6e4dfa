"""Rank/worker sharding: whole episodes, frame-balanced, deterministic, clear errors; workers get
contiguous runs of a rank's episodes, and the scattered split of older checkpoints is kept exactly."""

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
from lerobot_nodes.nodes.sharder import (
    CONTIGUOUS_SPLIT,
    SCATTERED_SPLIT,
    contiguous_balanced_split,
    contiguous_cuts,
    rank_episodes,
    rank_worker_split,
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


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(1, 500), min_size=0, max_size=60), parts=st.integers(1, 9))
def test_contiguous_split_is_a_partition_into_balanced_runs(lengths, parts):
    split = contiguous_balanced_split(lengths, parts)
    assert len(split) == parts
    assert [i for part in split for i in part] == list(range(len(lengths)))  # each once, runs in order
    assert all(part == list(range(part[0], part[0] + len(part))) for part in split if part)
    if len(lengths) >= parts:
        assert all(split)
        totals = [sum(lengths[i] for i in part) for part in split]
        assert max(totals) - min(totals) <= max(lengths)
    else:
        assert split == [[i] for i in range(len(lengths))] + [[]] * (parts - len(lengths))
    assert split == contiguous_balanced_split(lengths, parts)


@pytest.mark.parametrize(
    "lengths,parts,totals",
    [
        ([1] * 5, 3, [2, 1, 2]),  # a threshold walk alone gives 1, 1, 3; cuts nearest 5/3 and 10/3
        ([100, 1, 1], 3, [100, 1, 1]),  # one long episode: the others still get one each
        ([1, 10, 1], 2, [1, 11]),
        ([7] * 12, 4, [21] * 4),
    ],
)
def test_contiguous_split_examples(lengths, parts, totals):
    cuts = contiguous_cuts(lengths, parts)
    assert [sum(lengths[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)] == totals


def test_contiguous_split_rejects_what_it_cannot_split():
    with pytest.raises(ValueError, match="num_parts must be >= 1"):
        contiguous_cuts([3], 0)
    with pytest.raises(ValueError, match="every episode length must be > 0"):
        contiguous_cuts([3, 0, 2], 2)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), lengths=lengths_strategy, world=st.integers(1, 3), workers=st.integers(1, 4), seed=st.integers(0, 2**32))
def test_each_worker_reads_a_run_of_its_ranks_episodes_sorted_by_index(data, lengths, world, workers, seed):
    chosen = data.draw(st.sets(st.integers(0, 10_000), min_size=len(lengths), max_size=len(lengths)))
    episodes = data.draw(st.permutations(sorted(chosen)))  # a selection in any order
    if len(episodes) < world:
        return
    length_of = dict(zip(episodes, lengths, strict=True))
    for rank in range(world):
        owned = sorted(rank_episodes(episodes, lengths, rank, world, seed))
        usable = min(workers, len(owned))
        split = rank_worker_split(episodes, lengths, rank, world, usable, seed)
        assert [e for part in split for e in part] == owned  # contiguous runs of the sorted owned episodes
        assert all(split)
        totals = [sum(length_of[e] for e in part) for part in split]
        assert max(totals) - min(totals) <= max(length_of[e] for e in owned)
        assert split == [worker_episodes(episodes, lengths, rank, world, w, usable, seed) for w in range(usable)]


# The worker split of the version before the contiguous one, printed by that version for these inputs.
OLD_LENGTHS = [170, 82, 207, 29, 42, 279, 53, 192, 34, 264, 114, 24, 49, 227, 219, 40, 128, 51, 287, 222, 35,
               294, 68, 119, 36, 300, 208, 30, 118, 28, 290, 73, 153, 219, 78, 281, 65, 297, 162, 291]
OLD_EPISODES = [61, 64, 83, 99, 105, 184, 185, 192, 210, 249, 254, 306, 307, 321, 370, 381, 437, 464, 476, 506, 508,
                537, 544, 560, 577, 584, 588, 595, 599, 633, 654, 696, 698, 715, 729, 795, 798, 813, 835, 945]
OLD_SPLIT = [
    [[83, 99, 307, 437, 464, 506, 584], [321, 560, 577, 633, 715, 798, 945], [61, 184, 210, 254, 654, 696]],
    [[185, 370, 508, 588, 698, 813], [64, 105, 192, 249, 537, 595, 729], [306, 381, 476, 544, 599, 795, 835]],
]


def test_the_scattered_split_is_exactly_the_previous_versions_split():
    old = [rank_worker_split(OLD_EPISODES, OLD_LENGTHS, rank, 2, 3, 11, SCATTERED_SPLIT) for rank in range(2)]
    assert old == OLD_SPLIT
    new = [rank_worker_split(OLD_EPISODES, OLD_LENGTHS, rank, 2, 3, 11, CONTIGUOUS_SPLIT) for rank in range(2)]
    assert new != old and [sorted(sum(p, [])) for p in new] == [sorted(sum(p, [])) for p in old]  # same ranks
    sharder = RankWorkerSharder(OLD_EPISODES, OLD_LENGTHS, rank=1, world_size=2, worker_id=2, num_workers=3, seed=11,
                                worker_split=SCATTERED_SPLIT)
    assert sharder.episodes == OLD_SPLIT[1][2]


def test_an_unknown_worker_split_is_one_clear_line():
    with pytest.raises(ConfigError, match=r"worker split 'zigzag'.*knows contiguous, scattered"):
        rank_worker_split([0, 1], [5, 5], 0, 1, 2, 1, "zigzag")
