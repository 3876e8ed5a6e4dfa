"""Whole batches assembled in the reader (``streaming_dataloader``): the same batches as a per-sample
DataLoader, sample-exact against the map-style reader, one shared storage per batch."""

from __future__ import annotations

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from lerobot_nodes import MapStyleLeRobotDataset, loader_batch_size
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import (
    StreamingLeRobotDataset,
    shutdown_dataloader,
    streaming_dataloader,
    worker_context,
)

WINDOW = {"action": [0.0, 1 / 30, 2 / 30], "observation.images.top": [-1 / 30, 0.0]}
CONFIG = StreamingConfig(streaming_episode_pool_size=2, streaming_prefetch_episodes=2, streaming_decode_threads=2)


def _dataset(root):
    return StreamingLeRobotDataset(root=root, delta_timestamps=WINDOW, return_uint8=True, seed=9, config=CONFIG)


def _assert_batches_equal(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_epoch_of_batches_equals_the_per_sample_loader_and_map_style(small_dataset, num_workers):
    ours_dataset, theirs_dataset = _dataset(small_dataset), _dataset(small_dataset)
    batched = streaming_dataloader(ours_dataset, batch_size=6, num_workers=num_workers)
    assert batched.batch_size is None and loader_batch_size(batched) == 6
    options = {"multiprocessing_context": worker_context()} if num_workers else {}
    per_sample = StatefulDataLoader(theirs_dataset, batch_size=6, num_workers=num_workers, **options)
    reference = MapStyleLeRobotDataset(root=small_dataset, delta_timestamps=WINDOW, return_uint8=True)
    starts = {e: reference.meta.episode_bounds(e)[0] for e in reference.episodes}
    try:
        ours, theirs = list(batched), list(per_sample)
        assert len(ours) == len(theirs)
        delivered = 0
        for got, expected in zip(ours, theirs, strict=True):
            _assert_batches_equal(got, expected)
            for position, (episode, frame) in enumerate(
                zip(got["episode_index"].tolist(), got["frame_index"].tolist(), strict=True)
            ):
                sample = reference[starts[episode] + frame]
                for key, value in sample.items():
                    if isinstance(value, torch.Tensor):
                        assert torch.equal(got[key][position], value), (key, episode, frame)
                    else:
                        assert got[key][position] == value, (key, episode, frame)
                delivered += 1
        assert delivered == reference.num_frames
    finally:
        shutdown_dataloader(batched)
        shutdown_dataloader(per_sample)
        ours_dataset.close()  # the graph threads of num_workers=0
        theirs_dataset.close()


def test_a_batch_crosses_from_a_worker_as_two_shared_segments(small_dataset):
    # The cameras, decoded straight into their batch, and the other keys, collated into one storage.
    loader = streaming_dataloader(_dataset(small_dataset), batch_size=4, num_workers=2)
    try:
        batch = next(iter(loader))
        cameras = [key for key in batch if key.startswith("observation.images.") and not key.endswith("_is_pad")]
        tensors = [value for value in batch.values() if isinstance(value, torch.Tensor)]
        camera_storages = {batch[key].untyped_storage().data_ptr() for key in cameras}
        other_storages = {t.untyped_storage().data_ptr() for key, t in batch.items() if key not in cameras and isinstance(t, torch.Tensor)}
        assert len(camera_storages) == 1 and len(other_storages) == 1 and camera_storages != other_storages
        assert all(t.untyped_storage().is_shared() for t in tensors)
        assert batch["observation.images.top"].shape[:2] == (4, 2)
    finally:
        shutdown_dataloader(loader)


def test_a_custom_collate_keeps_batching_in_the_dataloader(small_dataset):
    def collate(samples):
        return [int(s["index"]) for s in samples]

    dataset = _dataset(small_dataset)
    loader = streaming_dataloader(dataset, batch_size=3, num_workers=0, collate_fn=collate)
    assert dataset.batch_size is None and loader_batch_size(loader) == 3
    try:
        assert len(next(iter(loader))) == 3
    finally:
        dataset.close()
