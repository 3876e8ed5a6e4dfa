"""A mixture with explicit weights: each dataset in its own epochs, its share of the frames as weighed.

The three datasets of ``helpers.py`` (the loopback Hub's generated one, LeRobot's AV1 and
H.264 writes: 58, 380 and 414 frames) with weights [0.6, 0.3, 0.1]. The long checks (10 epochs of
the lightest dataset, about 41,000 anchors) run on the logical schedule the graph builds (sharder
and pool sampler, real byte costs and GOP runs from the MP4 indexes); samples, topology and resume
run through the real DataLoader. An elastic step resume (2 ranks x 2 workers -> 1 x 3 and 3 x 1) is
checked on both: what the old run's DataLoader delivered plus what the new readers' leads deliver covers
each old worker's share of each dataset evenly, and the new DataLoader delivers what the schedules say.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_nodes.batch_memory.worker_parts import part_size
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.fetch.mixture_fetch import open_episode_fetcher
from lerobot_nodes.format.mixture import MixtureMeta
from lerobot_nodes.loader import shutdown_dataloader, streaming_dataloader
from lerobot_nodes.nodes.weighted_sharder import (
    LEAD_EPOCHS,
    WeightedMixtureSharder,
    next_dataset,
    normalized_weights,
)
from lerobot_nodes.resume.identity import open_runs_rule_of
from lerobot_nodes.resume.planning import (
    StepCheckpoint,
    Topology,
    assign_weighted_remnant,
    resume_point,
    weighted_remnant_of,
)
from lerobot_nodes.streaming_graph import (
    ReaderSlot,
    SampleRuns,
    ScheduleStart,
    schedule_sampler,
    schedule_sharder,
)
from lerobot_nodes.testing.compare import assert_samples_equal
from lerobot_nodes.testing.hub import LoopbackHub

from .helpers import (
    AV1,
    CONFIG,
    FEW,
    H264,
    HUB_REPO,
    expected_sample,
    keys_of,
    mixture,
    references,
    sequence,
    unbatched,
)

WEIGHTS = [0.6, 0.3, 0.1]


def weighted(**kwargs: Any):
    return mixture(weights=WEIGHTS, **kwargs)


def schedule(dataset, rank: int = 0, world_size: int = 1, worker: int = 0, num_workers: int = 0):
    """The logical schedule (pool sampler over the weighted sharder) of one reader, reset."""
    sampler = dataset._rank_schedule().samplers(world_size)(rank, worker, num_workers)
    sampler.reset(None)
    return sampler


def dataset_of(dataset, episode: int) -> int:
    assert isinstance(dataset.meta, MixtureMeta)
    return dataset.meta.part_of(episode)[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_proportions_over_ten_epochs_of_the_lightest_dataset_within_two_percent(hub, num_workers):
    dataset = weighted()
    counts = collections.Counter()
    for worker in range(max(1, num_workers)):
        sampler = schedule(dataset, worker=worker, num_workers=num_workers)
        sharder = sampler.source
        assert isinstance(sharder, WeightedMixtureSharder)
        while sharder.dataset_epochs[2] < 10:  # the lightest dataset's 11th epoch begins: 10 are whole
            counts[dataset_of(dataset, next(sampler).episode)] += 1
    total = sum(counts.values())
    for d, weight in enumerate(WEIGHTS):
        assert abs(counts[d] / total / weight - 1) < 0.02, (d, counts[d] / total)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_dataset_is_visited_exactly_once_per_its_own_epoch(hub, num_workers):
    dataset = weighted()
    for worker in range(max(1, num_workers)):
        sampler = schedule(dataset, worker=worker, num_workers=num_workers)
        sharder = sampler.source
        shares = [set(part.episodes) for part in sharder.datasets]
        # Admissions: each dataset's, cut into its epochs, are permutations of its share.
        node = sharder.clone(initial_epoch=0)
        node.reset(None)
        admitted: list[list[int]] = [[] for _ in shares]
        for _ in range(400):
            episode = next(node)
            admitted[dataset_of(dataset, episode)].append(episode)
        for d, share in enumerate(shares):
            whole = len(admitted[d]) // len(share)
            assert whole >= 1, d
            for k in range(whole):
                chunk = admitted[d][k * len(share) : (k + 1) * len(share)]
                assert sorted(chunk) == sorted(share), (d, k)
        # Anchors: every visit of an episode yields each of its frames once, one visit at a time.
        frames: dict[int, list[int]] = collections.defaultdict(list)
        for _ in range(6000):
            item = next(sampler)
            frames[item.episode].append(item.frame)
        for episode, seen in frames.items():
            length = sharder.episode_length(episode)
            for start in range(0, len(seen), length):
                visit = seen[start : start + length]
                assert len(set(visit)) == len(visit) and set(visit) <= set(range(length)), episode
        epochs = sharder.dataset_epochs
        assert epochs[0] > epochs[1] >= 1  # the small, heavy dataset runs through many epochs


def test_samples_are_the_datasets_own_and_the_same_seed_gives_the_same_order(hub, hub_folder):
    readers = references(hub_folder)
    batches = sequence(streaming_dataloader(weighted(episodes=FEW), 4, 0), 15)
    assert batches == sequence(streaming_dataloader(weighted(episodes=FEW), 4, 0), 15)
    assert batches != sequence(streaming_dataloader(weighted(episodes=FEW, seed=6), 4, 0), 15)
    assert batches != sequence(streaming_dataloader(mixture(episodes=FEW), 4, 0), 15)
    loader = streaming_dataloader(weighted(episodes=FEW), 4, num_workers=2)
    iterator = iter(loader)
    for _ in range(6):
        for sample in unbatched(next(iterator)):
            d, index = int(sample["dataset_index"]), int(sample["index"])
            expected = expected_sample(readers[d], d, index, list(sample))
            assert_samples_equal(expected, sample, where=f"dataset {d} frame {index}")


def test_two_ranks_of_two_workers_read_disjoint_shares_of_every_dataset(hub):
    owned = []
    for rank in range(2):
        dataset = weighted(rank=rank, world_size=2)
        for worker in range(2):
            sharder = schedule(dataset, rank, 2, worker, 2).source
            assert all(part.episodes for part in sharder.datasets)  # every worker has every dataset
            owned.append(set(sharder.episodes))
    every = set(weighted().episodes)
    assert sum(len(share) for share in owned) == len(every) and set().union(*owned) == every
    streamed = []
    for rank in range(2):
        loader = streaming_dataloader(weighted(rank=rank, world_size=2), 4, num_workers=2)
        iterator = iter(loader)
        streamed.append({key for _ in range(5) for key in keys_of(next(iterator))})
    assert not streamed[0] & streamed[1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resume_is_identical(hub, num_workers):
    total = 24
    reference = sequence(streaming_dataloader(weighted(episodes=FEW), 4, num_workers), total)
    for stop in (7, 13):
        loader = streaming_dataloader(weighted(episodes=FEW), 4, num_workers, snapshot_every_n_steps=1)
        iterator = iter(loader)
        head = [keys_of(next(iterator)) for _ in range(stop)]
        state = loader.state_dict()
        resumed = streaming_dataloader(weighted(episodes=FEW), 4, num_workers, snapshot_every_n_steps=1)
        resumed.load_state_dict(state)
        assert head + sequence(resumed, total - stop) == reference, f"resume after {stop} batches"


def test_step_resume_is_exact_in_the_same_topology(hub):
    reference = sequence(streaming_dataloader(weighted(episodes=FEW), 4, 2), 16)
    same = weighted(episodes=FEW)
    same.resume_from_step(9, batch_size=4, num_workers=2, world_size=1, seed=5)
    assert sequence(streaming_dataloader(same, 4, 2), 7) == reference[9:]


# -- elastic step resume: a 2 ranks x 2 workers run resumed in another topology -------------------
OLD_WORLD, OLD_WORKERS, BATCH = 2, 2, 4


@dataclasses.dataclass(frozen=True)
class Interruption:
    """A weighted run stopped after ``stop`` batches. ``open_visits``: some old worker is then still reading a
    dataset's previous epoch while its next one has begun (a large round-robin pool keeps visits open long)."""

    weights: tuple[float, ...]
    config: StreamingConfig
    stop: int
    open_visits: bool

    def dataset(self, **kwargs: Any):
        return mixture(weights=list(self.weights), config=self.config, **kwargs)


INTERRUPTIONS = {
    "mid-epoch": Interruption(tuple(WEIGHTS), CONFIG, 24, open_visits=False),
    "open-visits": Interruption(
        (0.2, 0.6, 0.2),
        dataclasses.replace(CONFIG, streaming_episode_pool_size=4, streaming_sampling_strategy="round_robin"),
        64,
        open_visits=True,
    ),
}


def frame_key(meta: MixtureMeta, episode: int, frame: int) -> tuple[int, int]:
    """``(dataset_index, index)`` of frame ``frame`` of mixture episode ``episode``, as samples carry it."""
    part, local = meta.part_of(episode)
    return part, meta.parts[part].episode_bounds(local)[0] + frame


def resumed_schedule(dataset, worker: int, num_workers: int):
    """The logical schedule of one new reader of ``dataset`` after its planned elastic step resume, built as
    the graph builds it (its weighted sharder with the assigned lead, real MP4 costs and runs), reset."""
    planned = dataset._resume.stage
    start = assign_weighted_remnant(
        planned.remnant, Topology(dataset.world_size, num_workers), dataset.rank, worker, dataset.seed,
        dataset.worker_split,
    )
    reader = ReaderSlot(dataset.rank, dataset.world_size, worker, num_workers)
    first = ScheduleStart(
        seed=dataset.seed, assigned=start.assigned, carried=start.carried_map(), tails=start.tails_map(),
        worker_split=dataset.worker_split, weights=dataset.config.streaming_weights,
    )
    sharder = schedule_sharder(dataset.meta, dataset.episodes, reader, first, dataset.config.streaming_prefetch_episodes)
    fetcher = open_episode_fetcher(dataset.source, dataset.meta, episodes=sharder.episodes, opened_indexes=dataset._indexes)
    rules = ScheduleStart(seed=dataset.seed, rank_pool=dataset.rank_pool, open_runs_rule=open_runs_rule_of(dataset.identity))
    spec = dataset._sample_options().spec(dataset.meta)
    runs = SampleRuns.of(dataset.config, dataset.meta, spec, fetcher, rules, len(dataset.episodes))
    sampler = schedule_sampler(sharder, reader, dataset.config, rules, runs)
    sampler.reset(None)
    return sampler


@pytest.fixture(scope="module", params=sorted(INTERRUPTIONS))
def interrupted_weighted(request, hub_folder, tmp_path_factory):
    """An interruption, what its 2 x 2 run delivered in its first batches on both ranks through the real
    DataLoader, and every old worker's share of every dataset (its own epochs are over those)."""
    run = INTERRUPTIONS[request.param]
    with pytest.MonkeyPatch.context() as patch, LoopbackHub() as server:
        patch.setenv("HF_LEROBOT_HOME", str(tmp_path_factory.mktemp("home")))
        patch.setenv("HF_HUB_DISABLE_XET", "1")
        server.add_dataset(HUB_REPO, hub_folder)
        patch.setenv("HF_ENDPOINT", server.endpoint)
        delivered: list[tuple[int, int]] = []
        shares: list[list[int]] = []
        for rank in range(OLD_WORLD):
            dataset = run.dataset(rank=rank, world_size=OLD_WORLD)
            loader = streaming_dataloader(dataset, BATCH, OLD_WORKERS)
            iterator = iter(loader)
            for _ in range(run.stop):
                delivered += keys_of(next(iterator))
            shutdown_dataloader(loader)
            for worker in range(OLD_WORKERS):
                shares += [part.episodes for part in schedule(dataset, rank, OLD_WORLD, worker, OLD_WORKERS).source.datasets]
        return run, delivered, shares


@pytest.mark.parametrize("world_size,num_workers", [(1, 3), (3, 1)])
def test_an_elastic_step_resume_delivers_each_datasets_interrupted_epoch_once(
    hub, interrupted_weighted, world_size, num_workers, caplog
):
    run, delivered, shares = interrupted_weighted
    weights = run.weights
    longest = max(int(n) for n in run.dataset().meta.episodes.length)
    lead: collections.Counter[tuple[int, int]] = collections.Counter()
    plans = []
    for rank in range(world_size):
        dataset = run.dataset(rank=rank, world_size=world_size)
        dataset.resume_from_step(run.stop, BATCH, OLD_WORKERS, world_size=OLD_WORLD, seed=5, identity=run.dataset().identity)
        with caplog.at_level(logging.INFO, logger="lerobot_nodes.dataset"):
            loader = streaming_dataloader(dataset, BATCH, num_workers)
        plans.append(dataset._resume.stage.remnant)
        meta = dataset.meta
        readers = [resumed_schedule(dataset, worker, num_workers) for worker in range(num_workers)]
        predicted: list[list[tuple[int, int]]] = [[] for _ in readers]
        parts = [part_size(BATCH, num_workers, w) if num_workers > 1 else BATCH for w in range(num_workers)]
        for worker, sampler in enumerate(readers):
            sharder = sampler.source
            counts = [0] * len(weights)
            for n in range(1, 2501):
                item = next(sampler)
                key = frame_key(meta, item.episode, item.frame)
                predicted[worker].append(key)
                if sharder.visit_epoch(item.episode) < LEAD_EPOCHS:  # its dataset's lead: the old run's undelivered frames
                    lead[key] += 1
                counts[key[0]] += 1
                # Weighed from the resume on: within (datasets - 1 + pool) episodes of each share at every point.
                bound = (len(weights) - 1 + run.config.streaming_episode_pool_size) * longest
                assert all(abs(c - w * n) <= bound for c, w in zip(counts, weights, strict=True)), (worker, n, counts)
            assert all(sharder.dataset_cursor(d)[0] >= LEAD_EPOCHS for d in range(len(weights)))  # every lead is read
        # The real DataLoader delivers what the schedules say: each batch a part of every worker in turn.
        batches = sequence(loader, 40)
        shutdown_dataloader(loader)
        cursors = [0] * num_workers
        for batch in batches:
            expected = []
            for worker, size in enumerate(parts):
                expected += predicted[worker][cursors[worker] : cursors[worker] + size]
                cursors[worker] += size
            assert batch == expected
    assert all(plan == plans[0] for plan in plans)  # every new rank computed the same plan, without talking
    assert plans[0].num_frames == sum(lead.values())
    assert bool(plans[0].tails) == run.open_visits
    total = collections.Counter(delivered) + lead
    meta = run.dataset().meta
    for share in shares:  # each old worker's share of each dataset: its interrupted epoch completed, nothing twice
        frames = [frame_key(meta, e, f) for e in share for f in range(int(meta.episodes.length[e]))]
        before = max(collections.Counter(delivered)[key] for key in frames)
        assert {total[key] for key in frames} in ({before}, {before + 1}), share
    lines = [r.message for r in caplog.records if r.message.startswith(f"resuming step {run.stop} (batch size {BATCH})")]
    assert len(lines) == world_size and "the topology changed" in lines[0] and "exactly once" in lines[0]
    assert "weighed as before" in lines[0]


@pytest.mark.parametrize("num_workers", [0, 3])
def test_a_loader_state_taken_after_an_elastic_weighted_resume_resumes_exactly(hub, num_workers):
    run = INTERRUPTIONS["open-visits"]  # the readers' leads hold old visits to finish

    def resumed_loader():
        dataset = run.dataset()
        dataset.resume_from_step(run.stop, BATCH, OLD_WORKERS, world_size=OLD_WORLD, seed=5)
        return streaming_dataloader(dataset, BATCH, num_workers, snapshot_every_n_steps=1)

    reference = sequence(resumed_loader(), 30)
    loader = resumed_loader()
    iterator = iter(loader)
    head = [keys_of(next(iterator)) for _ in range(11)]
    state = loader.state_dict()
    shutdown_dataloader(loader)
    restored = streaming_dataloader(run.dataset(), BATCH, num_workers, snapshot_every_n_steps=1)
    restored.load_state_dict(state)
    assert head + sequence(restored, 19) == reference
    shutdown_dataloader(restored)


def test_an_elastic_weighted_resume_checks_the_identity_and_the_weights(hub):
    for other in (mixture(weights=[0.5, 0.3, 0.2]), mixture()):
        with pytest.raises(ConfigError, match="streaming_weights"):
            weighted().resume_from_step(24, BATCH, OLD_WORKERS, world_size=OLD_WORLD, seed=5, identity=other.identity)


@pytest.mark.parametrize("strategy", ["remaining", "round_robin"])
def test_the_weighted_remnant_finishes_old_visits_of_a_previous_epoch_once(strategy):
    """Small shares and a pool of 4: at many checkpoints an old worker still reads a dataset's previous
    epoch while its next has begun. For every step, after the resume in 1 x 3 and 3 x 1, every frame of
    each old share has been delivered as often as every other (each begun epoch once), nothing twice."""
    from lerobot_nodes.nodes.pool_sampler import EpisodePoolSampler
    from lerobot_nodes.nodes.weighted_sharder import ElasticLead

    parts = [list(range(0, 8)), list(range(8, 20)), list(range(20, 26))]
    lengths = {e: 3 + (e * 7) % 9 for e in range(26)}

    def sampler(rank, worker, num_workers, world_size=OLD_WORLD, lead=None):
        sharder = WeightedMixtureSharder(
            parts, lengths, [0.5, 0.3, 0.2], rank=rank, world_size=world_size, worker_id=worker,
            num_workers=num_workers, seed=7, lookahead=4, lead=lead,
        )
        return EpisodePoolSampler(sharder, pool_size=4, strategy=strategy, seed=7)

    with_tails = 0
    for step in range(1, 150, 3):
        checkpoint = StepCheckpoint(step, BATCH, Topology(OLD_WORLD, OLD_WORKERS))
        remnant = weighted_remnant_of(checkpoint, sampler)
        with_tails += bool(remnant.tails)
        before: collections.Counter[tuple[int, int]] = collections.Counter()
        shares = []
        for rank in range(OLD_WORLD):
            old = [sampler(rank, worker, OLD_WORKERS) for worker in range(OLD_WORKERS)]
            offsets, _ = resume_point(step, BATCH, [s.source.num_frames for s in old])
            for node, offset in zip(old, offsets, strict=True):
                node.reset(None)
                before.update((item.episode, item.frame) for item in (next(node) for _ in range(offset.samples)))
                shares += [part.episodes for part in node.source.datasets]
        for world_size, num_workers in ((1, 3), (3, 1)):
            lead: collections.Counter[tuple[int, int]] = collections.Counter()
            for rank in range(world_size):
                for worker in range(num_workers):
                    start = assign_weighted_remnant(remnant, Topology(world_size, num_workers), rank, worker, 7)
                    node = sampler(rank, worker, num_workers, world_size, ElasticLead(
                        start.tails_map(), start.assigned, start.carried_map()
                    ))
                    node.reset(None)
                    for item in (next(node) for _ in range(500)):
                        if node.source.visit_epoch(item.episode) < LEAD_EPOCHS:
                            lead[(item.episode, item.frame)] += 1
                    assert all(node.source.dataset_cursor(d)[0] >= LEAD_EPOCHS for d in range(3))
            assert sum(lead.values()) == remnant.num_frames
            total = before + lead
            for share in shares:
                counts = {total[(e, f)] for e in share for f in range(lengths[e])}
                assert len(counts) == 1, (step, world_size, num_workers, share, counts)
    assert with_tails >= 5  # the case this test is about happened


def test_weights_are_part_of_the_resume_identity(hub):
    state = weighted(episodes=FEW).state_dict()
    weighted(episodes=FEW).load_state_dict(state)
    mixture(episodes=FEW, weights=[6, 3, 1]).load_state_dict(state)  # normalised: the same weights
    with pytest.raises(ConfigError, match="streaming_weights"):
        mixture(episodes=FEW, weights=[0.5, 0.3, 0.2]).load_state_dict(state)
    with pytest.raises(ConfigError, match="streaming_weights"):
        mixture(episodes=FEW).load_state_dict(state)
    with pytest.raises(ConfigError, match="streaming_weights"):
        weighted(episodes=FEW).load_state_dict(mixture(episodes=FEW).state_dict())
    assert "weights" not in mixture(episodes=FEW).identity  # unweighted identities are unchanged


def test_bad_weights_are_one_line_naming_the_flag():
    for bad in ([0.5], [1, -1], [1, float("nan")], "0.5,0.5", [1, True]):
        with pytest.raises(ConfigError, match="--dataset.streaming_weights") as error:
            StreamingConfig(streaming_weights=bad)  # type: ignore[arg-type]
        assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=r"has 3 weight\(s\) but the mixture has 2"):
        mixture(repo_id=None, root=[AV1, H264], rename_map=None, delta_timestamps=None, weights=[1, 1, 1])
    with pytest.raises(ConfigError, match="one dataset is streamed"):
        mixture(repo_id=None, root=AV1, rename_map=None, delta_timestamps=None, weights=[1, 1])
    assert StreamingConfig(streaming_weights=[7, 3]).streaming_weights == [0.7, 0.3]
    # Every dataset is split over the ranks and workers on its own: the H.264 one has 6 episodes for 7 ranks.
    with pytest.raises(ConfigError, match=r"^dataset 1 \(.*tiny-h264\) of the weighted mixture .*6 selected episode"):
        mixture(repo_id=None, root=[AV1, H264], rename_map=None, delta_timestamps=None, weights=[1, 1], world_size=7, rank=0)
    with pytest.warns(UserWarning, match="every worker reads every dataset, and it owns 3 episode"):
        mixture(repo_id=None, root=[AV1, H264], rename_map=None, delta_timestamps=None, weights=[1, 1], world_size=2,
                rank=0).clamp_num_workers(8)


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.floats(min_value=0.01, max_value=100), min_size=2, max_size=6),
    lengths=st.data(),
)
def test_the_deficit_rule_keeps_every_dataset_within_its_bound(weights, lengths):
    shares = normalized_weights(weights, len(weights))
    longest = 50
    draw = lengths.draw(st.lists(st.integers(1, longest), min_size=1, max_size=30), label="episode lengths")
    admitted, total = [0] * len(shares), 0
    for step in range(300):
        d = next_dataset(shares, admitted, total)
        length = draw[(step * 7 + d) % len(draw)]
        admitted[d] += length
        total += length
        for j, share in enumerate(shares):
            surplus = admitted[j] - share * total
            assert -(len(shares) - 1) * longest - 1e-6 <= surplus <= longest + 1e-6, (j, surplus)


@pytest.mark.parametrize("strategy", ["remaining", "round_robin"])
def test_an_episode_back_in_its_datasets_next_epoch_waits_for_its_visit_to_end(strategy):
    """Dataset 0 is one 5-frame episode with 80 % of the weight: it comes back long before a pool of 4
    would drain, and is admitted again only once its current visit is over; the state resumes exactly."""
    from lerobot_nodes.nodes.pool_sampler import EpisodePoolSampler

    lengths = {0: 5, 1: 3, 2: 4, 3: 6}

    def sampler() -> EpisodePoolSampler:
        sharder = WeightedMixtureSharder([[0], [1, 2, 3]], lengths, [0.8, 0.2], seed=3, lookahead=4)
        node = EpisodePoolSampler(sharder, pool_size=4, strategy=strategy, seed=3)
        node.reset(None)
        return node

    node = sampler()
    items, states = [], []
    for _ in range(300):
        states.append(node.state_dict())
        items.append(next(node))
        resident = node.resident_episodes()
        assert len(resident) == len(set(resident)), resident
    frames: dict[int, list[int]] = collections.defaultdict(list)
    for item in items:
        frames[item.episode].append(item.frame)
    for episode, seen in frames.items():
        for start in range(0, len(seen), lengths[episode]):
            visit = seen[start : start + lengths[episode]]
            assert len(set(visit)) == len(visit), episode
    zero = sum(1 for item in items if item.episode == 0)
    assert abs(zero / len(items) - 0.8) < 0.05
    for cut in (17, 150):
        resumed = sampler()
        resumed.reset(states[cut])
        assert [next(resumed) for _ in range(len(items) - cut)] == items[cut:], cut


def test_the_admission_window_keeps_what_the_prefetcher_reads_behind_the_cursor():
    sharder = WeightedMixtureSharder([[0, 1], [2, 3, 4]], {e: 3 for e in range(5)}, [0.5, 0.5], lookahead=2)
    sharder.reset(None)
    admitted = [next(sharder) for _ in range(20000)]
    order = sharder.order
    assert len(order) == 20002 and list(order[20000 - 4096 : 20000]) == admitted[-4096:]
    assert list(order[20000:20002]) == sharder.peek(2)
    with pytest.raises(IndexError, match="no longer held"):
        order[0:5]
    for dataset in range(2):  # each dataset's admissions: its share once per its epoch
        share = sharder.datasets[dataset].episodes
        own = [e for e in admitted if e in share]
        assert all(sorted(own[k : k + len(share)]) == sorted(share) for k in range(0, len(own) - len(share), len(share)))


def test_an_elastic_lead_naming_an_episode_outside_the_selection_is_one_line():
    from lerobot_nodes.nodes.weighted_sharder import ElasticLead

    with pytest.raises(ConfigError, match=r"names episode\(s\) \[9\] that are not selected") as error:
        WeightedMixtureSharder([[0, 1], [2, 3]], {e: 3 for e in range(4)}, [0.5, 0.5], lead=ElasticLead(rest=[2, 9]))
    assert "\n" not in str(error.value)
