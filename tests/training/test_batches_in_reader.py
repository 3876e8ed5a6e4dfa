"""Whole batches assembled in the reader (``streaming_dataloader``): the same batches as a per-sample
DataLoader, sample-exact against the map-style reader, one shared storage per batch."""

from __future__ import annotations

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from lerobot_nodes import MapStyleLeRobotDataset, loader_batch_size
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.loader import shutdown_dataloader, streaming_dataloader, worker_context
from lerobot_nodes.nodes.sharder import worker_episodes

WINDOW = {"action": [0.0, 1 / 30, 2 / 30], "observation.images.top": [-1 / 30, 0.0]}
CONFIG = StreamingConfig(streaming_episode_pool_size=2, streaming_prefetch_episodes=2, streaming_decode_threads=2)
PER_WORKER = StreamingConfig(**{**CONFIG.as_dict(), "streaming_batches_across_workers": False})


def _dataset(root, config=CONFIG):
    return StreamingLeRobotDataset(root=root, delta_timestamps=WINDOW, return_uint8=True, seed=9, config=config)


def _joined(parts: list[dict]) -> dict:
    """What the loader makes of consecutive worker parts: the parts' rows in order."""
    return {
        key: torch.cat([part[key] for part in parts]) if isinstance(value, torch.Tensor) else [v for part in parts for v in part[key]]
        for key, value in parts[0].items()
    }


def _assert_map_style_samples(batch: dict, reference: MapStyleLeRobotDataset, starts: dict[int, int]) -> int:
    """Every sample of ``batch`` is the map-style reader's for its ``(episode, frame)``; returns how many."""
    pairs = list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))
    for position, (episode, frame) in enumerate(pairs):
        for key, value in reference[starts[episode] + frame].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(batch[key][position], value), (key, episode, frame)
            else:
                assert batch[key][position] == value, (key, episode, frame)
    return len(pairs)


def _assert_batches_equal(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


@pytest.mark.parametrize(("num_workers", "across"), [(0, True), (2, False), (2, True)])
def test_an_epoch_of_batches_equals_the_per_sample_loader_and_map_style(small_dataset, num_workers, across):
    # Across workers, a batch is one part of each worker: what a per-sample DataLoader with a batch
    # size of batch_size / num_workers yields, two consecutive batches joined.
    config = CONFIG if across else PER_WORKER
    ours_dataset, theirs_dataset = _dataset(small_dataset, config), _dataset(small_dataset, config)
    batched = streaming_dataloader(ours_dataset, batch_size=6, num_workers=num_workers)
    assert batched.batch_size is None and loader_batch_size(batched) == 6
    options = {"multiprocessing_context": worker_context()} if num_workers else {}
    joined = num_workers if across and num_workers > 1 else 1
    per_sample = StatefulDataLoader(theirs_dataset, batch_size=6 // joined, num_workers=num_workers, **options)
    reference = MapStyleLeRobotDataset(root=small_dataset, delta_timestamps=WINDOW, return_uint8=True)
    starts = {e: reference.meta.episode_bounds(e)[0] for e in reference.episodes}
    try:
        ours, parts = list(batched), list(per_sample)
        theirs = [_joined(parts[i : i + joined]) for i in range(0, len(parts), joined)]
        assert len(ours) == len(theirs)
        delivered = 0
        for got, expected in zip(ours, theirs, strict=True):
            _assert_batches_equal(got, expected)
            delivered += _assert_map_style_samples(got, reference, starts)
        assert delivered == reference.num_frames
    finally:
        shutdown_dataloader(batched)
        shutdown_dataloader(per_sample)
        ours_dataset.close()  # the graph threads of num_workers=0
        theirs_dataset.close()


def test_a_batch_crosses_from_a_worker_as_two_shared_segments(small_dataset):
    # The cameras, decoded straight into their batch, and the other keys, collated into one storage.
    loader = streaming_dataloader(_dataset(small_dataset, PER_WORKER), batch_size=4, num_workers=2)
    try:
        batch = next(iter(loader))
        cameras = [key for key in batch if key.startswith("observation.images.") and not key.endswith("_is_pad")]
        tensors = [value for value in batch.values() if isinstance(value, torch.Tensor)]
        camera_storages = {batch[key].untyped_storage().data_ptr() for key in cameras}
        other_storages = {t.untyped_storage().data_ptr() for key, t in batch.items() if key not in cameras and isinstance(t, torch.Tensor)}
        assert len(camera_storages) == 1 and len(other_storages) == 1 and camera_storages != other_storages
        # The other keys arrive as torch's shared storage; the cameras as views of the worker's
        # recycled segment, held through the array that tells the worker when they are released.
        assert all(batch[key].untyped_storage().is_shared() for key in batch if key not in cameras and isinstance(batch[key], torch.Tensor))
        assert len(tensors) > len(cameras)
        assert batch["observation.images.top"].shape[:2] == (4, 2)
    finally:
        shutdown_dataloader(loader)


def test_a_batch_across_workers_holds_its_cameras_in_one_shared_batch_of_the_ring(small_dataset):
    # Each worker writes its part's frames into its rows of a shared batch (the ring's slot): the
    # loader copies no frames.
    dataset = _dataset(small_dataset)
    loader = streaming_dataloader(dataset, batch_size=4, num_workers=2, prefetch_factor=2)
    try:
        assert dataset.batches_across_workers == 2 and dataset.identity["batches_across_workers"] is True
        ring = dataset.batch_ring
        assert ring is not None and ring.slots == dataset.batches_in_flight + 1 == 4
        batches = iter(loader)
        slot_storages = set()
        for _ in range(12):
            batch = next(batches)
            cameras = [key for key in batch if key.startswith("observation.images.") and not key.endswith("_is_pad")]
            storages = {batch[key].untyped_storage().data_ptr() for key in cameras}
            assert len(storages) == 1
            assert batch["observation.images.top"].shape[:2] == (4, 2) and len(batch["task"]) == 4
            slot_storages |= storages
            del batch
        # The slots were made from info.json's frame sizes before the workers started: no batch copied.
        assert batches.slots_made == 0 and batches.copied == 0 and batches.in_ring == 12
        assert len(slot_storages) <= ring.slots
    finally:
        shutdown_dataloader(loader)


def test_an_iterator_left_mid_epoch_gives_its_ring_regions_back(small_dataset):
    # The parts in flight when a new iterator starts are dropped by the DataLoader (or abandoned by
    # their worker): their regions come back, so the next epoch's batches are again joined in the
    # ring, and every sample is the map-style reader's.
    dataset = _dataset(small_dataset)
    reference = MapStyleLeRobotDataset(root=small_dataset, delta_timestamps=WINDOW, return_uint8=True)
    starts = {e: reference.meta.episode_bounds(e)[0] for e in reference.episodes}
    loader = streaming_dataloader(dataset, batch_size=4, num_workers=2, prefetch_factor=2)
    try:
        left = iter(loader)
        for _ in range(3):
            next(left)
        whole = iter(loader)
        batches = 0
        for batch in whole:
            batches += 1
            _assert_map_style_samples(batch, reference, starts)
        # All but the epoch's last batch, which holds worker 1's last part alone (worker 0 ran out
        # first): its rows are not a batch's first, and the rows before them are worker 0's.
        assert batches > 4 and whole.copied == 1 and whole.in_ring == batches - 1
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


def _digest(batch: dict) -> list:
    return [
        (key, value.clone()) if isinstance(value, torch.Tensor) else (key, list(value)) for key, value in batch.items()
    ]


@pytest.mark.parametrize(("num_workers", "across"), [(0, True), (2, False), (2, True)])
def test_recycled_storages_never_change_a_batch_still_held(small_dataset, num_workers, across):
    # A batch's camera storage is written again once the training process released it (by a
    # worker, or by the graph in the training process itself with num_workers=0). Most
    # batches here are dropped on receipt (their storages are recycled); every third is kept to
    # the end of the epoch and must still hold what it held on receipt, and every batch must
    # equal that of a run that holds every batch (nothing released, nothing recycled).
    # Across workers, the parts are the recycled storages and the joined batch is a copy.
    config = CONFIG if across else PER_WORKER
    reference_dataset = _dataset(small_dataset, config)
    reference = streaming_dataloader(reference_dataset, batch_size=4, num_workers=num_workers)
    try:
        held = [list(reference), list(reference)]  # two epochs, each in its own order
        expected = [[_digest(batch) for batch in epoch] for epoch in held]
        report = reference_dataset.metrics.report()
        # One segment per batch; across workers one per worker part, or the part's rows of a ring slot.
        parts = report.batch_segments_created + report.batch_segments_reused + report.batch_parts_in_ring
        if num_workers == 0 or not across:
            assert report.batch_segments_reused == 0 and parts == sum(map(len, expected))
        else:
            # Every batch is held here: a slot's rows are written once, then only those freed by a copy.
            assert parts > sum(map(len, expected)) and 0 < report.batch_parts_in_ring < parts / 2
        del held
    finally:
        shutdown_dataloader(reference)
    dataset = _dataset(small_dataset, config)
    loader = streaming_dataloader(dataset, batch_size=4, num_workers=num_workers)  # workers: prefetch_factor 4, 7 kept
    try:
        for epoch in range(2):
            kept: list[tuple[int, dict, list]] = []
            count = 0
            for position, batch in enumerate(loader):
                received = _digest(batch)
                _assert_digests_equal(received, expected[epoch][position])
                if position % 3 == 0:
                    kept.append((position, batch, received))
                del batch
                count += 1
            assert count == len(expected[epoch])
            for _position, batch, received in kept:
                _assert_digests_equal(_digest(batch), received)
        report = dataset.metrics.report()
        total = parts
        assert report.batch_segments_created + report.batch_segments_reused + report.batch_parts_in_ring == total
        if num_workers == 0:
            # In one process releases and takes happen on the training thread in the same order every run (52 of 84).
            assert report.batch_segments_reused >= total // 2, report
        elif across:
            # Every third batch is kept to the end of the epoch: its slot's rows stay claimed, so the
            # parts that would go there are written apart and copied; the others go in the ring.
            assert report.batch_parts_in_ring > 0 and report.batch_segments_created > 0, report
        else:
            # A worker reuses a segment only if the training process released it before the worker
            # took one for its next batch, which is a race (38 of 84 here, 26 in a loaded CI run).
            assert report.batch_segments_reused > 0, report
    finally:
        shutdown_dataloader(loader)
        reference_dataset.close()  # the graph threads of num_workers=0
        dataset.close()


def _assert_digests_equal(got: list, expected: list) -> None:
    assert [key for key, _ in got] == [key for key, _ in expected]
    for (key, value), (_, reference) in zip(got, expected, strict=True):
        if isinstance(reference, torch.Tensor):
            assert value.dtype == reference.dtype and torch.equal(value, reference), key
        else:
            assert value == reference, key


def test_pin_memory_without_an_accelerator_joins_unpinned_batches(small_dataset):
    # As the DataLoader does without an accelerator: pin_memory is ignored, not an error.
    loader = streaming_dataloader(_dataset(small_dataset), batch_size=4, num_workers=2, pin_memory=True)
    try:
        batch = next(iter(loader))
        assert batch["observation.images.top"].shape[0] == 4 and not batch["observation.images.top"].is_pinned()
    finally:
        shutdown_dataloader(loader)


@pytest.mark.parametrize(("across", "expected"), [(True, {0, 1}), (False, None)])
def test_a_batch_across_workers_holds_samples_of_every_workers_share(small_dataset, across, expected):
    # Each worker reads its own share of the rank's episodes: across workers every full batch draws on
    # both shares, per worker every batch on one.
    dataset = _dataset(small_dataset, CONFIG if across else PER_WORKER)
    owner = {
        episode: worker
        for worker in range(2)
        for episode in worker_episodes(
            dataset.episodes, dataset._lengths(), 0, 1, worker, 2, dataset.seed, dataset.worker_split
        )
    }
    loader = streaming_dataloader(dataset, batch_size=6, num_workers=2)
    try:
        batches = [batch for batch in loader if len(batch["index"]) == 6]
        shares = [{owner[int(e)] for e in batch["episode_index"].tolist()} for batch in batches]
        if expected is None:
            assert all(len(share) == 1 for share in shares)
        else:
            assert all(share == expected for share in shares[:-1])  # the epoch's tail may hold one worker's only
    finally:
        shutdown_dataloader(loader)


AHEAD_APART = StreamingConfig(**{**CONFIG.as_dict(), "streaming_decoded_queue_size": 2})
"""Two samples run ahead of a batch of 8: the samples that run into the next batch while a step holds one go to
temporary places (a batch holds at least 4x the samples that run ahead)."""


def test_samples_run_ahead_wait_apart_instead_of_in_a_third_batch(small_dataset):
    """With 0 workers, a training loop holds one batch while the next is assembled; a sample that runs ahead into
    the batch after waits in a storage of its own and is copied into its batch once the step let go of one: two
    batch storages in use, never three, and every batch exactly the map-style reader's samples."""
    dataset = _dataset(small_dataset, AHEAD_APART)
    loader = streaming_dataloader(dataset, batch_size=8, num_workers=0)
    reference = MapStyleLeRobotDataset(root=small_dataset, delta_timestamps=WINDOW, return_uint8=True)
    starts = {e: reference.meta.episode_bounds(e)[0] for e in reference.episodes}
    try:
        for _epoch in range(2):
            delivered = 0
            for batch in loader:  # the loop holds this batch while the next one is assembled
                delivered += _assert_map_style_samples(batch, reference, starts)
            assert delivered == reference.num_frames
        report = dataset.metrics.report()
        batches = -(-reference.num_frames // 8) * 2
        # Every batch in a recycled storage (none copied whole), two of them created in all.
        assert report.batch_segments_created + report.batch_segments_reused == batches, report
        assert report.batch_segments_created == 2, report
    finally:
        shutdown_dataloader(loader)
        dataset.close()
