"""Recycled batch storages: a worker writes a storage again only after the receiving process let go.

The batches cross real process boundaries through torch's multiprocessing queue (shared-memory
file descriptors passed over a socket), as DataLoader workers send them.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import default_convert

from lerobot_nodes.batch_memory.recycled_storage import (
    IN_USE,
    RELEASED,
    TRAILER_BYTES,
    RecycledBatch,
    RecycledStorages,
)
from lerobot_nodes.batch_memory.storage_views import tensors_in_one_storage

SPECS = [("cam", torch.uint8, (4, 3, 8, 8)), ("state", torch.float32, (4, 2))]


def _batch(storages: RecycledStorages, value: int) -> RecycledBatch:
    views = tensors_in_one_storage(SPECS, True, storages.take)
    views["cam"].fill_(value)
    views["state"].fill_(value / 2)
    storage = storages.holding(views["cam"].untyped_storage().data_ptr())
    assert storage is not None
    items = {"cam": views["cam"], "task": f"batch {value}", "index": torch.arange(4) + value, "state": views["state"]}
    return RecycledBatch(items, storage)


def _worker(commands, results) -> None:  # type: ignore[no-untyped-def]
    storages = RecycledStorages(keep=2)
    while (value := commands.get()) is not None:
        results.put((_batch(storages, value), storages.reused, storages.created))


@pytest.fixture
def worker():
    context = mp.get_context("spawn")
    commands, results = context.Queue(), context.Queue()
    process = context.Process(target=_worker, args=(commands, results), daemon=True)
    process.start()

    def ask(value: int):  # type: ignore[no-untyped-def]
        commands.put(value)
        return results.get(timeout=60)

    yield ask
    commands.put(None)
    process.join(30)
    assert process.exitcode == 0


def _is(batch: dict, value: int) -> bool:
    return bool(batch["cam"].eq(value).all()) and bool(batch["state"].eq(value / 2).all())


def test_a_storage_is_written_again_only_after_every_view_is_gone(worker) -> None:
    first, reused, created = worker(1)
    assert type(first) is dict and list(first) == ["cam", "task", "index", "state"]
    assert _is(first, 1) and first["task"] == "batch 1" and first["index"].tolist() == [1, 2, 3, 4]
    assert first["cam"].untyped_storage().data_ptr() == first["state"].untyped_storage().data_ptr()
    assert (reused, created) == (0, 1)

    second, reused, created = worker(2)
    assert (reused, created) == (0, 2)  # the first batch is held: a new storage
    derived = second["cam"][1].numpy()  # anything made from a view holds the storage too
    del second
    third, reused, created = worker(3)
    assert (reused, created) == (0, 3)

    del derived, third  # both released: the next batch reuses one of them
    fourth, reused, created = worker(4)
    assert (reused, created) == (1, 3)
    assert _is(fourth, 4) and _is(first, 1)  # the held batch kept its values throughout

    del fourth
    fifth, reused, created = worker(5)
    assert (reused, created) == (2, 3) and _is(fifth, 5) and _is(first, 1)


def test_the_trailer_marks_release_in_the_same_process_too() -> None:
    storages = RecycledStorages(keep=1)
    batch = _batch(storages, 7)
    flag = batch.storage.nbytes() - TRAILER_BYTES
    assert batch.storage[flag] == IN_USE
    # What the training process does on receipt, without a process boundary: pickle round trip.
    received = copy.copy(batch).__reduce__()[0](*batch.__reduce__()[1])
    assert type(received) is dict and _is(received, 7)
    del received
    assert batch.storage[flag] == RELEASED
    again = storages.take(batch.storage.nbytes() - TRAILER_BYTES)
    assert again.data_ptr() == batch.storage.data_ptr() and again[flag] == IN_USE
    assert (storages.reused, storages.created) == (1, 1)


def test_default_convert_and_deepcopy_in_the_worker() -> None:
    storages = RecycledStorages()
    batch = _batch(storages, 3)
    converted = default_convert(batch)  # what the DataLoader worker applies with batch_size=None
    assert type(converted) is RecycledBatch and converted.storage is batch.storage and _is(converted, 3)
    owned = copy.deepcopy(batch)
    assert type(owned) is dict and _is(owned, 3)
    assert owned["cam"].untyped_storage().data_ptr() != batch["cam"].untyped_storage().data_ptr()


def test_keep_bounds_the_storages_a_worker_holds() -> None:
    storages = RecycledStorages(keep=2)
    taken = [storages.take(1000) for _ in range(5)]  # none released
    assert storages.created == 5 and storages.reused == 0
    assert [storages.holding(s.data_ptr()) is not None for s in taken] == [False, False, False, True, True]
    with pytest.raises(ValueError, match="keep"):
        RecycledStorages(keep=0)


def test_released_storages_beyond_one_spare_are_dropped() -> None:
    storages = RecycledStorages(keep=8, shared=False)
    delivered = [_batch(storages, value).delivered() for value in range(3)]
    kept = [storages.holding(batch["cam"].untyped_storage().data_ptr()) for batch in delivered]
    assert all(storage is not None for storage in kept) and (storages.reused, storages.created) == (0, 3)
    del delivered  # all three released at once: a consumer that fell behind caught up
    again = storages.take(kept[0].nbytes() - TRAILER_BYTES)  # type: ignore[union-attr]
    assert again.data_ptr() == kept[0].data_ptr()  # type: ignore[union-attr]
    held = [storages.holding(storage.data_ptr()) is not None for storage in kept]  # type: ignore[union-attr]
    assert held == [True, False, False]  # the reused one; released ones beyond SPARE (0) dropped
    assert (storages.reused, storages.created) == (1, 3)

