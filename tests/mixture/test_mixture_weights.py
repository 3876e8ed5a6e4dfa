"""A mixture with explicit weights: each dataset in its own epochs, its share of the frames as weighed.

The three datasets of ``helpers.py`` (the loopback Hub's generated one, LeRobot's AV1 and
H.264 writes: 58, 380 and 414 frames) with weights [0.6, 0.3, 0.1]. The long checks (10 epochs of
the lightest dataset, about 41,000 anchors) run on the logical schedule the graph builds (sharder
and pool sampler, real byte costs and GOP runs from the MP4 indexes); samples, topology and resume
run through the real DataLoader.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.format.mixture import MixtureMeta
from lerobot_nodes.loader import streaming_dataloader
from lerobot_nodes.nodes.weighted_sharder import WeightedMixtureSharder, next_dataset, normalized_weights
from lerobot_nodes.testing.compare import assert_samples_equal

from .helpers import AV1, FEW, H264, expected_sample, keys_of, mixture, references, sequence, unbatched

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


def test_step_resume_is_exact_in_the_same_topology_and_refused_in_another(hub):
    reference = sequence(streaming_dataloader(weighted(episodes=FEW), 4, 2), 16)
    same = weighted(episodes=FEW)
    same.resume_from_step(9, batch_size=4, num_workers=2, world_size=1, seed=5)
    assert sequence(streaming_dataloader(same, 4, 2), 7) == reference[9:]
    elastic = weighted(episodes=FEW)
    elastic.resume_from_step(9, batch_size=4, num_workers=2, world_size=1, seed=5)
    with pytest.raises(ConfigError, match=r"weighted mixture .*--dataset.streaming_weights.* resumes only"):
        sequence(streaming_dataloader(elastic, 4, 0), 1)


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
