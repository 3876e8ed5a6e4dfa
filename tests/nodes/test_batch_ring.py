"""The batch ring (batch_memory.batch_ring): workers write their parts into their rows of a shared
batch, the training process joins them without copying frames, and a region is written again only
once the batch that used it is gone.

The "workers" here are the ring pickled and unpickled (attached to the same shared memory, as a
DataLoader worker is), their parts pickled to the owner as they cross the DataLoader's queue.
"""

from __future__ import annotations

import gc
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_nodes.batch_memory.batch_ring import CLAIMED, BatchRing
from lerobot_nodes.batch_memory.storage_views import tensors_in_one_storage
from lerobot_nodes.batch_memory.worker_parts import JoinedParts, ReceivedRingPart, RingPart

CAMERAS = [("observation.images.top", torch.uint8, (3, 4, 5)), ("observation.images.wrist", torch.uint8, (2, 3, 4, 5))]
BATCH = 5  # worker 0 writes rows 0-2, worker 1 rows 3-4


def _worker_side(ring: BatchRing) -> BatchRing:
    return pickle.loads(pickle.dumps(ring))


def _write_part(worker_ring: BatchRing, part: int, worker: int, first_sample: int) -> RingPart | dict:
    """What a worker's batcher hands the DataLoader for its ``part``-th part: the frames of samples
    ``first_sample``.. written into its rows of the slot when free (a RingPart), else a plain part."""
    rows = 3 if worker == 0 else 2
    views = worker_ring.claim(part, worker, CAMERAS, rows)
    values = torch.arange(first_sample, first_sample + rows, dtype=torch.uint8)
    if views is None:  # a part's cameras in one storage of its own, as BatchSlots writes them
        views = tensors_in_one_storage([(key, dtype, (rows, *shape)) for key, dtype, shape in CAMERAS], shared=False)
    for view in views.values():
        view.copy_(values.view(-1, *([1] * (view.dim() - 1))).expand_as(view))
    items = {**views, "index": torch.arange(first_sample, first_sample + rows), "task": [f"t{first_sample}"] * rows}
    slot = worker_ring.holding(next(iter(views.values())).untyped_storage().data_ptr())
    return RingPart(items, worker_ring, slot, worker) if slot is not None else items


def _crossed(part):
    return pickle.loads(pickle.dumps(part))


def _check(batch: dict, first_sample: int, rows: int = BATCH) -> None:
    expected = list(range(first_sample, first_sample + rows))
    assert batch["index"].tolist() == expected
    for key, _, _ in CAMERAS:
        assert batch[key].shape[0] == rows
        assert batch[key].reshape(rows, -1).amin(1).tolist() == expected
        assert batch[key].reshape(rows, -1).amax(1).tolist() == expected
    assert len(batch["task"]) == rows


def test_a_region_is_handed_out_only_while_free_and_only_for_the_declared_layout():
    ring = BatchRing(2, 2, BATCH, CAMERAS)
    worker = _worker_side(ring)
    assert worker.region_free(0, 0) and worker.region_free(0, 1)
    assert worker.claim(0, 0, CAMERAS, 2) is None  # worker 0's share of 5 is 3 rows
    assert worker.claim(0, 0, CAMERAS[:1], 3) is None  # another layout
    assert worker.claim(0, 2, CAMERAS, 3) is None  # no such worker
    views = worker.claim(0, 0, CAMERAS, 3)
    assert views is not None and views["observation.images.top"].shape == (3, 3, 4, 5)
    assert not worker.region_free(0, 0) and worker.claim(2, 0, CAMERAS, 3) is None  # part 2: slot 0 again
    assert worker.region_free(0, 1) and worker.region_free(1, 0)
    ring.free(0, [0])
    assert worker.claim(2, 0, CAMERAS, 3) is not None


def test_a_slot_not_made_is_never_handed_out():
    ring = BatchRing(2, 2, BATCH)  # sizes not known: slots are made from the first parts
    worker = _worker_side(ring)
    assert not worker.region_free(0, 0) and worker.claim(0, 0, CAMERAS, 3) is None


def test_parts_in_their_rows_are_joined_without_a_copy_and_freed_when_the_batch_goes():
    ring = BatchRing(2, 2, BATCH, CAMERAS)
    workers = [_worker_side(ring), _worker_side(ring)]
    parts = [_crossed(_write_part(workers[w], 0, w, 3 * w)) for w in range(2)]
    assert all(isinstance(part, ReceivedRingPart) for part in parts)
    joined = JoinedParts(iter(parts), 2, ring=ring, first_slot=0)
    batch = next(joined)
    _check(batch, 0)
    assert joined.in_ring == 1 and joined.copied == 0
    slot_start = ring.slot_base(0)
    assert batch["observation.images.top"].data_ptr() == slot_start  # a view of the slot, not a copy
    assert ring._table["free"][0].tolist() == [CLAIMED, CLAIMED]
    camera = batch["observation.images.wrist"][1:]  # a view outlives the dict: the slot stays held
    del batch
    gc.collect()
    assert not workers[0].region_free(0, 0)
    del camera
    gc.collect()
    assert workers[0].region_free(0, 0) and workers[1].region_free(0, 1)


def test_parts_out_of_order_are_copied_and_their_regions_freed_at_once():
    ring = BatchRing(2, 2, BATCH, CAMERAS)
    workers = [_worker_side(ring), _worker_side(ring)]
    # Worker 1's part arrives first (a loader resumed at worker 1): its rows are not the batch's first.
    parts = [_crossed(_write_part(workers[1], 0, 1, 0)), _crossed(_write_part(workers[0], 0, 0, 2))]
    joined = JoinedParts(iter(parts), 2, ring=ring, first_slot=0)
    batch = next(joined)
    _check(batch, 0)
    assert joined.copied == 1 and joined.in_ring == 0
    assert batch["observation.images.top"].untyped_storage().data_ptr() != ring.slot_base(0)
    assert workers[0].region_free(0, 0) and workers[1].region_free(0, 1)  # copied out: free again


def test_a_short_part_leaves_a_gap_that_the_next_part_moves_into():
    # An epoch's last batch: worker 0's part holds 2 of its 3 rows, so worker 1's rows (3-4) move to 2-3.
    ring = BatchRing(2, 2, BATCH, CAMERAS)
    workers = [_worker_side(ring), _worker_side(ring)]
    short = workers[0].claim(1, 0, CAMERAS, 3)
    assert short is not None
    for view in short.values():
        view[:2] = torch.tensor([7, 8], dtype=torch.uint8).view(-1, *([1] * (view.dim() - 1)))
        view[2:] = 99  # the row the short part leaves unused
    first = RingPart({**{k: v[:2] for k, v in short.items()}, "index": torch.tensor([7, 8]), "task": ["a", "b"]}, workers[0], 1, 0)
    second = _write_part(workers[1], 1, 1, 9)
    joined = JoinedParts(iter([_crossed(first), _crossed(second)]), 2, ring=ring, first_slot=0)
    joined._number = 1
    batch = next(joined)
    assert joined.in_ring == 1 and joined.copied == 0 and joined.rows_moved == 2
    assert batch["index"].tolist() == [7, 8, 9, 10]
    for key, _, _ in CAMERAS:
        assert batch[key].reshape(4, -1).amin(1).tolist() == [7, 8, 9, 10]
        assert batch[key].reshape(4, -1).amax(1).tolist() == [7, 8, 9, 10]
    assert batch["observation.images.top"].data_ptr() == ring.slot_base(1)
    assert not workers[0].region_free(1, 0) and not workers[1].region_free(1, 1)
    del batch
    gc.collect()
    assert workers[0].region_free(1, 0) and workers[1].region_free(1, 1)


def test_a_ring_without_sizes_makes_its_slots_from_the_first_parts():
    ring = BatchRing(2, 2, BATCH)
    workers = [_worker_side(ring), _worker_side(ring)]
    plain = [_write_part(workers[w], 0, w, 3 * w) for w in range(2)]
    assert not any(isinstance(part, RingPart) for part in plain)
    joined = JoinedParts(iter(plain), 2, ring=ring, first_slot=0)
    batch = next(joined)
    _check(batch, 0)
    assert joined.slots_made == 1 and ring.made(0) and not ring.made(1)
    assert batch["observation.images.top"].data_ptr() == ring.slot_base(0)
    del batch
    gc.collect()
    # Made from the parts, the slot has the layout the workers derive: their next parts go in it.
    assert isinstance(_write_part(workers[0], 2, 0, 10), RingPart)


@settings(max_examples=15, deadline=None)
@given(holds=st.lists(st.integers(0, 3), min_size=4, max_size=16), slots=st.integers(1, 4))
def test_a_batch_held_is_never_written_again(holds, slots):
    # Batch n is held for holds[n] more batches. Workers write each part into the ring when its rows
    # are free, apart otherwise; every batch still holds its own samples when it is let go.
    ring = BatchRing(slots, 2, BATCH, CAMERAS)
    workers = [_worker_side(ring), _worker_side(ring)]
    held: list[tuple[int, dict]] = []
    for number, hold in enumerate(holds):
        parts = [_crossed(_write_part(workers[w], number, w, BATCH * number + 3 * w)) for w in range(2)]
        joined = JoinedParts(iter(parts), 2, ring=ring, first_slot=0)
        joined._number = number  # the batch's number in the epoch, as the iterator counts it
        batch = next(joined)
        _check(batch, BATCH * number)
        held.append((number + hold, batch))
        del batch
        held = [(until, batch) for until, batch in held if until > number]  # the step lets go of these
        gc.collect()
        for _, batch in held:
            _check(batch, int(batch["index"][0]))  # the frames still those of the batch's own samples


def test_the_owner_unlinks_its_segments_when_closed():
    ring = BatchRing(2, 2, BATCH, CAMERAS)
    names = [ring._segments[slot].name for slot in range(2)] + [ring.name]
    ring.close()
    from multiprocessing import shared_memory

    for name in names:
        with pytest.raises(FileNotFoundError):
            shared_memory.SharedMemory(name=name)


def test_every_claim_is_given_back_whatever_happens_to_its_part():
    ring = BatchRing(2, 2, BATCH, CAMERAS)
    worker = _worker_side(ring)
    # Received but never joined (the DataLoader drops the parts in flight when a new iterator starts).
    dropped = _crossed(_write_part(worker, 0, 0, 0))
    assert isinstance(dropped, ReceivedRingPart) and not worker.region_free(0, 0)
    del dropped
    gc.collect()
    assert worker.region_free(0, 0)
    # Claimed, then the worker's iterator is reset before the part was assembled.
    assert worker.claim(1, 0, CAMERAS, 3) is not None and not worker.region_free(1, 0)
    worker.abandon_unsent(0)
    assert worker.region_free(1, 0)
    # Assembled with its frames elsewhere (a dropped sample moved the batch to a storage of its own).
    assert worker.claim(2, 0, CAMERAS, 3) is not None
    worker.part_done(2, 0, sent=False)
    assert worker.region_free(2, 0)
    # Sent: the claim travels with the part, a reset does not give it back.
    assert worker.claim(3, 0, CAMERAS, 3) is not None
    worker.part_done(3, 0, sent=True)
    worker.abandon_unsent(0)
    assert not worker.region_free(3, 0)


def test_an_iterator_starts_in_the_slot_after_the_last_batch_joined():
    # The training loop still holds the epoch's last batch when it asks for the next epoch: the next
    # epoch's first parts go in the slot after it, not in it.
    ring = BatchRing(3, 2, BATCH, CAMERAS)
    workers = [_worker_side(ring), _worker_side(ring)]
    first = JoinedParts(iter([_crossed(_write_part(workers[w], 0, w, 3 * w)) for w in range(2)]), 2, ring=ring)
    assert first.first_slot == 0
    last_of_epoch = next(first)
    assert last_of_epoch["observation.images.top"].data_ptr() == ring.slot_base(0)
    assert ring.begin() == 1 and workers[0].slot_of(0) == 1
    parts = [_crossed(_write_part(workers[w], 0, w, 10 + 3 * w)) for w in range(2)]
    second = JoinedParts(iter(parts), 2, ring=ring, first_slot=1)
    batch = next(second)
    assert second.in_ring == 1 and batch["observation.images.top"].data_ptr() == ring.slot_base(1)
    _check(batch, 10)
    _check(last_of_epoch, 0)


def test_names_are_unlinked_once_every_worker_attached_to_every_slot_and_the_ring_goes_on():
    # Unlinked, the memory goes with the last process mapping it, however the processes end (a
    # process group killed with its resource tracker included), instead of staying in /dev/shm.
    from multiprocessing import shared_memory

    ring = BatchRing(2, 2, BATCH, CAMERAS)
    names = [ring._segments[slot].name for slot in range(2)] + [ring.name]
    workers = [_worker_side(ring), _worker_side(ring)]
    assert not ring.unlink_once_attached()
    for number in range(5):  # the workers keep writing, the owner keeps joining
        parts = [_crossed(_write_part(workers[w], number, w, BATCH * number + 3 * w)) for w in range(2)]
        joined = JoinedParts(iter(parts), 2, ring=ring, first_slot=0)
        joined._number = number
        batch = next(joined)  # each worker has attached to both slots at its first claim: unlinked now
        assert joined.in_ring == 1 and ring.unlinked
        _check(batch, BATCH * number)
        del batch
        gc.collect()
        for name in names:
            with pytest.raises(FileNotFoundError):
                shared_memory.SharedMemory(name=name)
