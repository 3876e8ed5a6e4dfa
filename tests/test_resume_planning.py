"""Resume planning on its own: old schedules replayed by arithmetic, remnants split over new topologies.

An independent simulation of the DataLoader's round robin over plain schedules says what the
interrupted run delivered; the plan must deliver exactly the rest of each rank's epoch.
"""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_nodes.nodes import EpisodePoolSampler, RankWorkerSharder, max_workers_for_rank
from lerobot_nodes.nodes.sharder import CONTIGUOUS_SPLIT, SCATTERED_SPLIT
from lerobot_nodes.resume.planning import (
    Remnant,
    RemnantEpisode,
    StepCheckpoint,
    Topology,
    WorkerStart,
    assign_remnant,
    exact_start,
    rank_offsets,
    remnant_of,
    replay_checkpoint,
)

STRATEGIES = ("remaining", "round_robin")


def factory(episodes, lengths, world_size, *, pool_size, strategy, seed):
    def make(rank, worker_id, num_workers, *, epoch=0, start=None):
        sharder = RankWorkerSharder(
            episodes, lengths, rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers,
            seed=seed, initial_epoch=epoch, assigned=None if start is None else start.assigned,
        )
        carried = None if start is None else start.carried_map()
        return EpisodePoolSampler(sharder, pool_size=pool_size, strategy=strategy, seed=seed, carried=carried)

    return make


def drain(sampler, state=None):
    """Every remaining item of the sampler's epoch, from its start or from ``state``."""
    sampler.reset(state)
    out = []
    while True:
        try:
            item = sampler.next()
        except StopIteration:
            return out
        out.append((item.episode, item.frame))


def delivered_by_rank(make, rank, num_workers, batch_size, step):
    """What a DataLoader over the rank's workers delivered in the epoch it is in after ``step`` batches."""
    epoch, steps = 0, 0
    while True:
        schedules = [drain(make(rank, w, num_workers, epoch=epoch)) for w in range(max(1, num_workers))]
        taken = [0] * len(schedules)
        delivered: list[tuple[int, int]] = []
        worker = 0
        while any(t < len(s) for t, s in zip(taken, schedules, strict=True)):
            if steps == step:
                return epoch, delivered
            while taken[worker] >= len(schedules[worker]):
                worker = (worker + 1) % len(schedules)
            batch = schedules[worker][taken[worker] : taken[worker] + batch_size]
            delivered += batch
            taken[worker] += len(batch)
            steps += 1
            worker = (worker + 1) % len(schedules)
        epoch += 1


@st.composite
def scenarios(draw):
    lengths = draw(st.lists(st.integers(1, 18), min_size=2, max_size=14))
    episodes = sorted(draw(st.sets(st.integers(0, 200), min_size=len(lengths), max_size=len(lengths))))
    old_world = draw(st.integers(1, min(3, len(episodes))))
    new_world = draw(st.integers(1, 4))
    return {
        "episodes": episodes,
        "lengths": lengths,
        "old": Topology(old_world, draw(st.integers(0, 3))),
        "new": Topology(new_world, draw(st.integers(0, 3))),
        "batch_size": draw(st.integers(1, 9)),
        "step": draw(st.integers(0, 40)),
        "strategy": draw(st.sampled_from(STRATEGIES)),
        "pool_size": draw(st.integers(1, 4)),
        "seed": draw(st.integers(0, 2**31)),
    }


@settings(max_examples=150, deadline=None)
@given(s=scenarios())
def test_the_remnant_is_exactly_what_no_old_rank_delivered_and_each_new_worker_gets_a_disjoint_part(s):
    episodes, lengths, old, new = s["episodes"], s["lengths"], s["old"], s["new"]
    options = {"pool_size": s["pool_size"], "strategy": s["strategy"], "seed": s["seed"]}
    old_make = factory(episodes, lengths, old.world_size, **options)

    def workers_of(rank):  # what streaming_dataloader ran: num_workers clamped to the rank's episodes
        return min(old.num_workers, max_workers_for_rank(episodes, lengths, rank, old.world_size, s["seed"]))

    delivered = []
    epochs = set()
    for rank in range(old.world_size):
        epoch, items = delivered_by_rank(old_make, rank, workers_of(rank), s["batch_size"], s["step"])
        epochs.add(epoch)
        delivered += items
    checkpoint = StepCheckpoint(s["step"], s["batch_size"], old)
    positions = replay_checkpoint(checkpoint, old_make, workers_of)
    remnant = remnant_of(positions, dict(zip(episodes, lengths, strict=True)))
    assert remnant.epoch == max(epochs)
    new_make = factory(episodes, lengths, new.world_size, **options)
    rest = []
    for rank in range(new.world_size):
        for worker in range(new.parts):
            start = assign_remnant(remnant, new, rank, worker, s["seed"])
            assert start == assign_remnant(remnant, new, rank, worker, s["seed"])  # deterministic
            assert WorkerStart.from_state(start.to_state()) == start
            rest += drain(new_make(rank, worker, new.num_workers, epoch=start.epoch, start=start))
    everything = collections.Counter((e, f) for e, n in zip(episodes, lengths, strict=True) for f in range(n))
    assert collections.Counter(delivered + rest) == everything
    assert remnant.num_frames == len(rest)
    partly.append(any(item.taken for item in remnant.episodes))


partly: list[bool] = []  # whether examples carried partly delivered episodes (checked below)


def test_the_examples_above_carried_partly_delivered_episodes():
    if not partly:  # run alone (e.g. -k): draw the examples here
        test_the_remnant_is_exactly_what_no_old_rank_delivered_and_each_new_worker_gets_a_disjoint_part()
    assert partly and sum(partly) >= len(partly) // 4


@settings(max_examples=80, deadline=None)
@given(s=scenarios())
def test_same_split_continues_each_workers_own_schedule_exactly(s):
    episodes, lengths, old = s["episodes"], s["lengths"], s["old"]
    options = {"pool_size": s["pool_size"], "strategy": s["strategy"], "seed": s["seed"]}
    make = factory(episodes, lengths, old.world_size, **options)
    workers = min(old.num_workers, max_workers_for_rank(episodes, lengths, 0, old.world_size, s["seed"]))
    old = Topology(old.world_size, workers)
    checkpoint = StepCheckpoint(s["step"], s["batch_size"], old)
    offsets = rank_offsets(checkpoint, 0, make)
    for worker in range(old.parts):
        schedule_worker, offset = exact_start(offsets, worker, old.num_workers)
        sampler = make(0, schedule_worker, old.num_workers, epoch=offset.epoch)
        continued = drain(sampler, sampler.state_after(offset.samples, offset.epoch))
        full = drain(make(0, schedule_worker, old.num_workers, epoch=offset.epoch))
        assert continued == full[offset.samples :]


def test_assignment_balances_remaining_frames_not_lengths():
    remnant = Remnant(
        epoch=3,
        episodes=(RemnantEpisode(0, 100, 90, 3), RemnantEpisode(1, 10), RemnantEpisode(2, 10), RemnantEpisode(3, 12)),
    )
    parts = [assign_remnant(remnant, Topology(2, 0), rank, 0, seed=1) for rank in range(2)]
    assert sorted(e for p in parts for e in p.assigned) == [0, 1, 2, 3]
    totals = [sum(item.remaining for item in remnant.episodes if item.episode in p.assigned) for p in parts]
    assert max(totals) - min(totals) <= 12
    carried = [c for p in parts for c in p.carried]
    assert carried == [(0, 90, 3)]
    assert all(p.epoch == 3 and p.next_epoch == 4 and p.elastic for p in parts)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 90), min_size=1, max_size=30),
    taken=st.data(),
    world=st.integers(1, 3),
    workers=st.integers(1, 4),
)
def test_a_ranks_remnant_goes_to_its_workers_as_contiguous_runs(lengths, taken, world, workers):
    items = tuple(
        RemnantEpisode(e, n, taken.draw(st.integers(0, n - 1)), 0) for e, n in enumerate(lengths)
    )
    remnant = Remnant(epoch=0, episodes=items)
    topology = Topology(world, workers)
    delivered = []
    for rank in range(world):
        parts = [assign_remnant(remnant, topology, rank, w, seed=9).assigned for w in range(topology.parts)]
        mine = [e for part in parts for e in part]
        assert mine == sorted(mine)  # worker 0 holds the first run of the rank's remnant episodes, and so on
        remaining = {item.episode: item.remaining for item in items}
        totals = [sum(remaining[e] for e in part) for part in parts]
        if len(mine) >= topology.parts:
            assert all(parts) and max(totals) - min(totals) <= max(remaining[e] for e in mine)
        old = [
            assign_remnant(remnant, topology, rank, w, 9, SCATTERED_SPLIT).assigned for w in range(topology.parts)
        ]
        assert sorted(e for part in old for e in part) == sorted(mine)
        delivered += mine
    assert sorted(delivered) == list(range(len(lengths)))


def test_the_scattered_remnant_split_is_the_previous_versions():
    remnant = Remnant(epoch=1, episodes=tuple(RemnantEpisode(e, n) for e, n in enumerate([9, 40, 3, 22, 17, 31, 8])))

    def split(topology, worker_split):
        return [
            [list(assign_remnant(remnant, topology, r, w, 5, worker_split).assigned) for w in range(topology.parts)]
            for r in range(topology.world_size)
        ]

    # printed by the version before the contiguous worker split
    assert split(Topology(2, 2), SCATTERED_SPLIT) == [[[1], [4, 6]], [[2, 5], [0, 3]]]
    assert split(Topology(1, 3), SCATTERED_SPLIT) == [[[1, 2], [0, 5], [3, 4, 6]]]
    assert split(Topology(1, 3), CONTIGUOUS_SPLIT) == [[[0, 1], [2, 3, 4], [5, 6]]]


def test_more_parts_than_episodes_leaves_some_workers_empty():
    remnant = Remnant(epoch=0, episodes=(RemnantEpisode(5, 4, 1, 0),))
    starts = [assign_remnant(remnant, Topology(1, 3), 0, w, seed=0) for w in range(3)]
    assert sorted(len(s.assigned) for s in starts) == [0, 0, 1]


def test_a_rank_outside_the_topology_is_refused():
    with pytest.raises(ValueError, match="not in"):
        assign_remnant(Remnant(epoch=0, episodes=()), Topology(2, 1), 2, 0, seed=0)
