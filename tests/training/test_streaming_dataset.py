"""StreamingLeRobotDataset inside StatefulDataLoader: coverage, parity, seeds, exact resume."""

from __future__ import annotations

import collections
import random

import pytest
import torch

from lerobot_nodes import MapStyleLeRobotDataset
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.loader import streaming_dataloader

WINDOW = {"action": [0.0, 1 / 30, 2 / 30], "observation.images.top": [-1 / 30, 0.0]}
CONFIG = StreamingConfig(streaming_episode_pool_size=2, streaming_prefetch_episodes=2, streaming_decode_threads=2)


def _dataset(root, **kwargs):
    options = {"delta_timestamps": WINDOW, "return_uint8": True, "seed": 5, "config": CONFIG}
    options.update(kwargs)
    return StreamingLeRobotDataset(root=root, **options)


def _pairs(batch):
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))


def _sequence(loader, batches):
    out = []
    iterator = iter(loader)
    for _ in range(batches):
        try:
            out.append(_pairs(next(iterator)))
        except StopIteration:
            iterator = iter(loader)
            out.append(_pairs(next(iterator)))
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_frame_once_per_epoch_and_identical_to_map_style(small_dataset, num_workers):
    dataset = _dataset(small_dataset)
    loader = streaming_dataloader(dataset, batch_size=5, num_workers=num_workers)
    reference = MapStyleLeRobotDataset(root=small_dataset, delta_timestamps=WINDOW, return_uint8=True)
    starts = {e: reference.meta.episode_bounds(e)[0] for e in reference.episodes}
    for epoch in range(2):
        seen = collections.Counter()
        for batch in loader:
            for position, (episode, frame) in enumerate(_pairs(batch)):
                seen[(episode, frame)] += 1
                if epoch == 0 and position == 0:
                    expected = reference[starts[episode] + frame]
                    for key, value in expected.items():
                        got = batch[key][0] if isinstance(batch[key], torch.Tensor) else batch[key][0]
                        assert (torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value), key
        assert len(seen) == reference.num_frames and set(seen.values()) == {1}, epoch


def test_same_seed_same_order_and_seed_none_is_42(small_dataset):
    first = _sequence(streaming_dataloader(_dataset(small_dataset, seed=None), 4, 0), 10)
    again = _sequence(streaming_dataloader(_dataset(small_dataset, seed=42), 4, 0), 10)
    other = _sequence(streaming_dataloader(_dataset(small_dataset, seed=43), 4, 0), 10)
    assert first == again and first != other


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resume_is_exact(small_dataset, num_workers):
    total = 2 * 41  # about two epochs of batches of 4 over 165 frames
    reference = _sequence(streaming_dataloader(_dataset(small_dataset), 4, num_workers), total)
    for stop in random.Random(num_workers).sample(range(1, total - 1), 2):
        loader = streaming_dataloader(_dataset(small_dataset), 4, num_workers, snapshot_every_n_steps=1)
        head = []
        iterator = iter(loader)
        for _ in range(stop):
            try:
                head.append(_pairs(next(iterator)))
            except StopIteration:
                iterator = iter(loader)
                head.append(_pairs(next(iterator)))
        state = loader.state_dict()
        resumed = streaming_dataloader(_dataset(small_dataset), 4, num_workers, snapshot_every_n_steps=1)
        resumed.load_state_dict(state)
        tail = _sequence(resumed, total - stop)
        assert head + tail == reference, f"resume after {stop} batches"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_from_a_step_offset_is_exact(small_dataset, num_workers):
    total = 60
    reference = _sequence(streaming_dataloader(_dataset(small_dataset), 4, num_workers), total)
    for step in (7, 40, 41, 45):  # 40 and 41: an epoch's last batches, where a worker's epoch ends first
        dataset = _dataset(small_dataset)
        dataset.resume_from_step(step, batch_size=4, num_workers=num_workers, world_size=1, seed=5)
        tail = _sequence(streaming_dataloader(dataset, 4, num_workers), total - step)
        assert tail == reference[step:], f"step {step}"


def test_checkpoint_seed_is_restored(small_dataset):
    reference = _sequence(streaming_dataloader(_dataset(small_dataset, seed=42), 4, 0), 12)
    dataset = _dataset(small_dataset, seed=1000)
    dataset.resume_from_step(5, batch_size=4, num_workers=0, seed=42)
    assert _sequence(streaming_dataloader(dataset, 4, 0), 7) == reference[5:]


def test_changed_topology_is_a_clear_error(small_dataset):
    dataset = _dataset(small_dataset)
    loader = streaming_dataloader(dataset, 4, 0)
    next(iter(loader))
    state = dataset.state_dict()
    other_rank_count = _dataset(small_dataset, rank=0, world_size=2)
    with pytest.raises(ConfigError, match=r"world_size 1 -> 2.*batch.*resume_from_step\(step, batch_size, num_workers=0, world_size=1"):
        other_rank_count.load_state_dict(state)
    with pytest.raises(ConfigError, match="older multi-worker sampler"):
        _dataset(small_dataset).load_state_dict({"epoch": 1, "start_index": 3})


def test_num_workers_is_clamped_to_the_episodes_a_rank_owns(small_dataset):
    dataset = _dataset(small_dataset, episodes=[0, 1, 2])
    with pytest.warns(UserWarning, match=r"--num_workers=5 is more than rank 0 can feed: it owns 3"):
        loader = streaming_dataloader(dataset, 4, 5)
    assert loader.num_workers == 3


def test_no_rank_has_data_names_the_fix(small_dataset):
    with pytest.raises(ConfigError, match=r"no rank has data.*at most 2 rank"):
        _dataset(small_dataset, episodes=[0, 1], rank=0, world_size=3)


def test_transforms_run_on_the_training_thread_with_no_workers(small_dataset):
    calls = []

    def transform(frames):
        calls.append(torch.initial_seed())
        return frames.flip(-1)

    dataset = _dataset(small_dataset, image_transforms=transform, delta_timestamps=None)
    batch = next(iter(streaming_dataloader(dataset, 2, 0)))
    reference = MapStyleLeRobotDataset(root=small_dataset, return_uint8=True)
    episode, frame = _pairs(batch)[0]
    expected = reference[reference.meta.episode_bounds(episode)[0] + frame]["observation.images.top"].flip(-1)
    assert torch.equal(batch["observation.images.top"][0], expected)
    assert calls


def test_timed_counts_samples_delivered_to_the_training_loop(small_dataset):
    dataset = _dataset(small_dataset)
    loader = streaming_dataloader(dataset, batch_size=5, num_workers=2)
    for count, _ in enumerate(dataset.metrics.timed(loader), start=1):
        if count == 4:
            break
    report = dataset.metrics.report()
    assert report.batches == 4 and report.samples == 20  # not what the workers decoded ahead
    assert dataset.metrics.counters.totals()["samples"] >= 20
