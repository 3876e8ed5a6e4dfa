"""A resume state is checked against the dataset it is loaded on: what differs is named, copies resume."""

from __future__ import annotations

import shutil

import pytest

from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import IDENTITY_KEY, StreamingLeRobotDataset
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.loader import streaming_dataloader
from lerobot_nodes.resume.identity import check_identity, without_credentials
from lerobot_nodes.testing import write_dataset

CONFIG = StreamingConfig(streaming_episode_pool_size=2, streaming_prefetch_episodes=2)
STOP, TOTAL = 9, 20


def _dataset(root, config=CONFIG, **kwargs):
    return StreamingLeRobotDataset(root=root, seed=5, config=config, **kwargs)


def _pairs(batch):
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))


def _take(iterator, count):
    return [_pairs(next(iterator)) for _ in range(count)]


def _state_after(root, batches=STOP, **kwargs):
    """The loader state after ``batches`` batches, and the batches that followed in the same run."""
    loader = streaming_dataloader(_dataset(root, **kwargs), batch_size=4, num_workers=0, snapshot_every_n_steps=1)
    iterator = iter(loader)
    _take(iterator, batches)
    state = loader.state_dict()
    return state, _take(iterator, TOTAL - batches)


def _resume(root, state, **kwargs):
    loader = streaming_dataloader(_dataset(root, **kwargs), batch_size=4, num_workers=0, snapshot_every_n_steps=1)
    loader.load_state_dict(state)
    return _take(iter(loader), TOTAL - STOP)


def test_same_dataset_copied_to_another_folder_resumes_exactly(small_dataset, tmp_path):
    state, expected = _state_after(small_dataset)
    copy = shutil.copytree(small_dataset, tmp_path / "elsewhere")
    assert _resume(copy, state) == expected


def test_another_dataset_is_refused_naming_what_differs(small_dataset, tmp_path):
    state, _ = _state_after(small_dataset)
    other = write_dataset(tmp_path / "other", episode_lengths=[23, 41, 17, 35, 12, 29, 9], seed=11)
    with pytest.raises(ConfigError, match=r"total frames 165 -> 166; episode lengths .*'[0-9a-f]{12}' -> '[0-9a-f]{12}'"):
        _resume(other, state)


def test_another_episode_selection_is_refused_not_a_key_error(small_dataset):
    # Same count, other episodes: this used to be a bare KeyError from the sharder.
    state, _ = _state_after(small_dataset, episodes=[0, 1, 2, 3])
    with pytest.raises(ConfigError, match=r"episode selection '4 episodes #\w+' -> '4 episodes #\w+'"):
        _resume(small_dataset, state, episodes=[0, 1, 2, 4])


def test_another_schedule_is_refused(small_dataset):
    state, _ = _state_after(small_dataset)
    remaining = StreamingConfig(streaming_episode_pool_size=2, streaming_sampling_strategy="remaining")
    with pytest.raises(ConfigError, match=r"streaming_sampling_strategy 'round_robin' -> 'remaining'"):
        _resume(small_dataset, state, config=remaining)
    with pytest.raises(ConfigError, match=r"streaming_episode_pool_size 2 -> 3"):
        _resume(small_dataset, state, config=StreamingConfig(streaming_episode_pool_size=3))


def test_prefetch_depth_is_not_part_of_the_schedule(small_dataset):
    state, expected = _state_after(small_dataset)
    deeper = StreamingConfig(streaming_episode_pool_size=2, streaming_prefetch_episodes=5)
    assert _resume(small_dataset, state, config=deeper) == expected


def test_a_state_without_identity_still_resumes(small_dataset, caplog):
    dataset = _dataset(small_dataset)
    iterator = iter(streaming_dataloader(dataset, batch_size=4, num_workers=0))
    _take(iterator, STOP)
    state = dataset.state_dict()
    expected = _take(iterator, 3)
    del state[IDENTITY_KEY]  # as the previous version saved it
    resumed = _dataset(small_dataset)
    resumed.load_state_dict(state)
    assert _take(iter(streaming_dataloader(resumed, batch_size=4, num_workers=0)), 3) == expected


def test_a_different_revision_is_refused_and_credentials_never_recorded(small_dataset):
    identity = _dataset(small_dataset).identity
    assert identity["source"] == str(small_dataset) and identity["revision"] is None
    pinned = {**identity, "revision": "a" * 40}
    check_identity(pinned, identity)  # a local copy of a pinned commit: compared by content
    with pytest.raises(ConfigError, match=r"revision a{40} -> b{40}"):
        check_identity(pinned, {**identity, "revision": "b" * 40})
    assert without_credentials("s3://key:secret@host/bucket/data") == "s3://host/bucket/data"
