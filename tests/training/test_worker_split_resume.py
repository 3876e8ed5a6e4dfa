"""The worker split is part of what a checkpoint resumes: a new run splits each rank's episodes into
contiguous runs and records it; a checkpoint of the previous version (its identity has no worker
split) resumes exactly with the scattered split that version used, from a loader state or a step,
with real DataLoader worker processes."""

from __future__ import annotations

import collections

import pytest

from lerobot_nodes import MapStyleLeRobotDataset
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import IDENTITY_KEY, StreamingLeRobotDataset
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.loader import shutdown_dataloader, streaming_dataloader
from lerobot_nodes.nodes.sharder import CONTIGUOUS_SPLIT, SCATTERED_SPLIT, scattered_worker_parts
from lerobot_nodes.resume.identity import WORKER_SPLIT, worker_split_of
from lerobot_nodes.testing import write_dataset

LENGTHS = [30, 12, 25, 18, 40, 9, 22, 15]
SEED, BATCH, WORKERS, STOP = 3, 4, 2, 7
# What the previous version's worker split gives here (printed by that version): the same episode
# counts per worker as the contiguous [[0, 1, 2, 3], [4, 5, 6, 7]], so only the samples tell them apart.
PREVIOUS_SPLIT = [[4, 5, 6, 7], [0, 1, 2, 3]]
CONFIG = StreamingConfig(
    streaming_episode_pool_size=2, streaming_prefetch_episodes=2, streaming_decode_threads=1
)


@pytest.fixture(scope="module")
def dataset_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("worker-split") / "dataset"
    return write_dataset(root, episode_lengths=LENGTHS, video_files_size_in_mb=0.03, seed=4)


@pytest.fixture(scope="module")
def every_frame(dataset_root):
    reference = MapStyleLeRobotDataset(root=dataset_root)
    return collections.Counter(reference.locate(i) for i in range(len(reference)))


def _dataset(root):
    return StreamingLeRobotDataset(
        root=root, seed=SEED, return_uint8=True, config=CONFIG, rank=0, world_size=1
    )


def _previous_version(root):
    """A dataset as the previous version built it: an identity that records no worker split."""
    dataset = _dataset(root)
    del dataset.identity[WORKER_SPLIT]
    return dataset


def _pairs(batch):
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))


def _rest(loader, iterator, epochs=2):
    """The rest of the current epoch, then ``epochs - 1`` more."""
    out = [_pairs(b) for b in iterator]
    for _ in range(epochs - 1):
        out += [_pairs(b) for b in loader]
    return out


def test_the_previous_split_is_the_scattered_one(dataset_root):
    parts = scattered_worker_parts(LENGTHS, WORKERS, 0, SEED)
    assert parts == PREVIOUS_SPLIT  # positions are episodes here (every episode selected, one rank)
    old, new = _previous_version(dataset_root), _dataset(dataset_root)
    assert (old.worker_split, new.worker_split) == (SCATTERED_SPLIT, CONTIGUOUS_SPLIT)
    assert new.identity[WORKER_SPLIT] == CONTIGUOUS_SPLIT
    assert old.worker_samples(WORKERS) == [sum(LENGTHS[e] for e in part) for part in PREVIOUS_SPLIT]
    assert new.worker_samples(WORKERS) == [sum(LENGTHS[:4]), sum(LENGTHS[4:])]


def test_a_loader_state_of_the_previous_version_resumes_exactly(dataset_root, every_frame):
    old = _previous_version(dataset_root)
    loader = streaming_dataloader(old, BATCH, WORKERS, snapshot_every_n_steps=1)
    iterator = iter(loader)
    head = [_pairs(next(iterator)) for _ in range(STOP)]
    state = loader.state_dict()
    rest_of_epoch = [_pairs(b) for b in iterator]
    expected = rest_of_epoch + [_pairs(b) for b in loader]
    shutdown_dataloader(loader)
    assert collections.Counter(pair for batch in head + rest_of_epoch for pair in batch) == every_frame

    resumed_dataset = _dataset(dataset_root)
    resumed = streaming_dataloader(resumed_dataset, BATCH, WORKERS, snapshot_every_n_steps=1)
    resumed.load_state_dict(state)
    assert _rest(resumed, iter(resumed)) == expected
    shutdown_dataloader(resumed)

    # A new run splits otherwise, so resuming with the new split would not have matched.
    fresh = streaming_dataloader(_dataset(dataset_root), BATCH, WORKERS)
    assert [_pairs(b) for b in fresh] != head + rest_of_epoch
    shutdown_dataloader(fresh)


def test_a_step_checkpoint_of_the_previous_version_resumes_exactly_and_elastically(dataset_root, every_frame):
    old = _previous_version(dataset_root)
    loader = streaming_dataloader(old, BATCH, WORKERS)
    iterator = iter(loader)
    delivered = [_pairs(next(iterator)) for _ in range(STOP)]
    expected = [_pairs(b) for b in iterator]
    shutdown_dataloader(loader)
    identity = dict(old.identity)  # what the previous version's checkpoint recorded

    same = _dataset(dataset_root)
    same.resume_from_step(STOP, BATCH, WORKERS, world_size=1, seed=SEED, identity=identity)
    assert same.worker_split == SCATTERED_SPLIT and same.identity[WORKER_SPLIT] == SCATTERED_SPLIT
    loader = streaming_dataloader(same, BATCH, WORKERS)
    assert [_pairs(b) for b in loader] == expected  # same topology: sample-exact
    shutdown_dataloader(loader)

    elastic = _dataset(dataset_root)
    elastic.resume_from_step(STOP, BATCH, WORKERS, world_size=1, seed=SEED, identity=identity)
    loader = streaming_dataloader(elastic, BATCH, 3)
    rest = [pair for batch in loader for pair in _pairs(batch)]
    shutdown_dataloader(loader)
    assert collections.Counter([pair for batch in delivered for pair in batch] + rest) == every_frame


def test_a_new_runs_state_records_the_contiguous_split_and_resumes_exactly(dataset_root):
    dataset = _dataset(dataset_root)
    loader = streaming_dataloader(dataset, BATCH, 0, snapshot_every_n_steps=1)
    iterator = iter(loader)
    for _ in range(STOP):
        next(iterator)
    state = dataset.state_dict()
    assert state[IDENTITY_KEY][WORKER_SPLIT] == CONTIGUOUS_SPLIT
    expected = [_pairs(next(iterator)) for _ in range(3)]
    dataset.close()
    restored = _dataset(dataset_root)
    restored.load_state_dict(state)
    assert restored.worker_split == CONTIGUOUS_SPLIT
    assert [
        _pairs(b) for _, b in zip(range(3), streaming_dataloader(restored, BATCH, 0), strict=False)
    ] == expected
    restored.close()


def test_an_unknown_worker_split_in_a_checkpoint_is_one_clear_line(dataset_root):
    dataset = _dataset(dataset_root)
    state = dataset.state_dict()
    state[IDENTITY_KEY] = {**state[IDENTITY_KEY], WORKER_SPLIT: "zigzag"}
    with pytest.raises(
        ConfigError, match=r"^cannot resume: the checkpoint records the worker split 'zigzag'"
    ):
        _dataset(dataset_root).load_state_dict(state)
    assert worker_split_of(None) == SCATTERED_SPLIT  # no identity at all: older still
