"""SampleBatcher: default_collate's batches, one storage per batch, transparent state at batch boundaries."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import default_collate
from torchdata.nodes import BaseNode, IterableWrapper

from lerobot_nodes.batch_memory.batch_slots import BatchPlace, BatchSlots, TemporaryPlace
from lerobot_nodes.batch_memory.recycled_storage import (
    IN_PROCESS_KEEP,
    RELEASED,
    TRAILER_BYTES,
    RecycledStorages,
)
from lerobot_nodes.nodes.batcher import SampleBatcher, collate_into_one_storage, settle_temporary_places


def _sample(i: int) -> dict:
    return {
        "observation.images.top": torch.full((3, 4, 5), i, dtype=torch.uint8),
        "observation.state": torch.arange(6, dtype=torch.float32) + i,
        "action_is_pad": torch.tensor([i % 2 == 0, False]),
        "index": torch.tensor(i),
        "task": f"task {i % 3}",
    }


def _samples(n: int) -> list[dict]:
    return [_sample(i) for i in range(n)]


def _equal(a: dict, b: dict) -> bool:
    if list(a) != list(b):
        return False
    for key in a:
        if isinstance(a[key], torch.Tensor):
            if not (a[key].dtype == b[key].dtype and torch.equal(a[key], b[key])):
                return False
        elif a[key] != b[key]:
            return False
    return True


@pytest.mark.parametrize("shared", [False, True])
def test_collate_equals_default_collate_in_one_storage(shared: bool) -> None:
    samples = _samples(7)
    batch = collate_into_one_storage(samples, shared)
    assert _equal(batch, default_collate(samples))
    tensors = [v for v in batch.values() if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    assert len(storages) == 1
    assert all(t.is_contiguous() for t in tensors)
    assert tensors[0].untyped_storage().is_shared() is shared


def test_collate_names_the_key_whose_shapes_differ() -> None:
    samples = _samples(3)
    samples[2]["observation.state"] = torch.zeros(5)
    with pytest.raises(RuntimeError, match="observation.state"):
        collate_into_one_storage(samples, False)


def _batches(node: BaseNode, limit: int = 100) -> list[dict]:
    out = []
    for _ in range(limit):
        try:
            out.append(next(node))
        except StopIteration:
            break
    return out


def test_batches_keep_order_and_the_last_one_is_short() -> None:
    samples = _samples(11)
    node = SampleBatcher(IterableWrapper(samples), 4)
    node.reset()
    batches = _batches(node)
    assert [len(b["task"]) for b in batches] == [4, 4, 3]
    for number, batch in enumerate(batches):
        assert _equal(batch, default_collate(samples[4 * number : 4 * number + 4]))


def test_state_is_the_source_state_at_a_batch_boundary_and_resumes_there() -> None:
    samples = _samples(11)
    node = SampleBatcher(IterableWrapper(samples), 4)
    node.reset()
    next(node)
    state = node.state_dict()
    source = IterableWrapper(samples)
    source.reset()
    for _ in range(4):
        next(source)
    assert state == source.state_dict()  # the source's own layout: interchangeable with unbatched states
    expected = _batches(node)
    resumed = SampleBatcher(IterableWrapper(samples), 4)
    resumed.reset(state)
    assert [b["index"].tolist() for b in _batches(resumed)] == [b["index"].tolist() for b in expected]


class _FailsAt(BaseNode[dict]):
    def __init__(self, samples: list[dict], fail_at: int) -> None:
        super().__init__()
        self.samples, self.fail_at = samples, fail_at

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.position = 0 if initial_state is None else initial_state["position"]

    def next(self) -> dict:
        if self.position == self.fail_at:
            raise ValueError("corrupt sample")
        if self.position >= len(self.samples):
            raise StopIteration
        self.position += 1
        return self.samples[self.position - 1]

    def get_state(self) -> dict:
        return {"position": self.position}


def test_an_error_mid_batch_leaves_the_state_at_the_batch_start() -> None:
    node = SampleBatcher(_FailsAt(_samples(12), fail_at=6), 4)
    node.reset()
    next(node)
    with pytest.raises(ValueError, match="corrupt sample"):
        next(node)
    assert node.state_dict() == {"position": 4}


def test_batch_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        SampleBatcher(IterableWrapper([]), 0)


@pytest.mark.parametrize("shared", [True, False])
def test_a_batch_starts_ahead_in_a_worker_only_in_a_released_segment(shared: bool) -> None:
    from lerobot_nodes.batch_memory.batch_slots import BatchSlots
    from lerobot_nodes.batch_memory.recycled_storage import RecycledBatch, RecycledStorages

    storages = RecycledStorages(keep=4, shared=shared)
    slots = BatchSlots(
        2, {"top": 1}, lambda key, episode: (4, 5), return_uint8=True, shared_memory=shared, storages=storages
    )
    # No segment released yet: a worker's first batch starts when it is asked for.
    assert slots.may_start_ahead() is not shared
    first = [slots.next_slot(episode=0) for _ in range(2)]
    # Mid-batch a sample is always submitted ahead; at the boundary only into a released segment
    # (a worker's shared memory); the training process's own batches (process memory) start ahead as before.
    assert slots.may_start_ahead() is not shared
    whole = first[0]["top"].batch
    sent = RecycledBatch({"top": whole}, storages.holding(whole.untyped_storage().data_ptr())).delivered()
    assert slots.may_start_ahead() is not shared  # the receiver still holds the batch
    del sent, whole, first
    assert slots.may_start_ahead()  # released: the next batch reuses its segment
    second = slots.next_slot(episode=0)
    assert slots.may_start_ahead()  # mid-batch
    assert (storages.created, storages.reused) == (1, 1) and second["top"].position == 0


def test_batch_slots_hand_out_places_the_batcher_takes_without_copying() -> None:
    from lerobot_nodes.batch_memory.batch_slots import BatchSlots
    from lerobot_nodes.nodes.batcher import assembled_in_place, batch_of_places

    slots = BatchSlots(3, {"top": 1, "wrist": 2}, lambda key, episode: (4, 5), return_uint8=True, shared_memory=False)
    places = [slots.next_slot(episode=0) for _ in range(4)]
    assert places[0]["top"].frames.shape == (1, 3, 4, 5) and places[0]["wrist"].frames.shape == (2, 3, 4, 5)
    for value, place in enumerate(places[:3]):
        place["top"].frames[...] = value  # what a decode thread does
        place["wrist"].frames[...] = 10 + value
    whole = batch_of_places([place["top"] for place in places[:3]])
    assert whole is not None and whole.shape == (3, 3, 4, 5)  # one frame: no window axis, as LeRobot collates
    assert [int(whole[i].max()) for i in range(3)] == [0, 1, 2]
    wrist = batch_of_places([place["wrist"] for place in places[:3]])
    assert wrist is not None and wrist.shape == (3, 2, 3, 4, 5) and int(wrist[2].min()) == 12
    # A short last batch is the head of its batch; places out of order or of two batches are not one view.
    head = batch_of_places([place["top"] for place in places[:2]])
    assert head is not None and head.shape == (2, 3, 4, 5) and head.data_ptr() == whole.data_ptr()
    assert batch_of_places([places[1]["top"], places[0]["top"]]) is None
    assert batch_of_places([places[0]["top"], places[3]["top"]]) is None
    # The per-sample views of one batch lie back to back: the per-sample collate takes them too.
    assert torch.equal(assembled_in_place([place["top"].tensor() for place in places[:3]]), whole)
    # The fourth sample starts a new batch: a new storage.
    assert places[3]["top"].batch.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr()
    # Separate tensors, or places out of order, are copied as usual.
    assert assembled_in_place([torch.zeros(3, 4, 5) for _ in range(3)]) is None
    assert assembled_in_place([places[1]["top"].tensor(), places[0]["top"].tensor()]) is None
    slots.reset()
    fresh = slots.next_slot(episode=0)["top"]
    assert fresh.position == 0 and fresh.batch.untyped_storage().data_ptr() != places[3]["top"].batch.untyped_storage().data_ptr()


def test_a_dropped_place_is_given_back_so_later_batches_are_whole_views_again() -> None:
    """``streaming_bad_episodes=skip`` drops samples that already hold places: the batch in flight at
    the drop is copied, the next ones are one view each, and no place is handed out twice."""
    from lerobot_nodes.batch_memory.batch_slots import BatchSlots
    from lerobot_nodes.nodes.batcher import batch_of_places

    slots = BatchSlots(4, {"top": 1}, lambda key, episode: (2, 2), return_uint8=True, shared_memory=False)
    handed = [slots.next_slot(episode=0)["top"] for _ in range(6)]  # two batches' worth in flight
    slots.forget_place()  # sample 1 was dropped when it was delivered
    later = [slots.next_slot(episode=0)["top"] for _ in range(7)]
    delivered = [handed[0], *handed[2:], *later]  # what the batcher receives, in order
    batches = [delivered[i : i + 4] for i in range(0, len(delivered), 4)]
    assert batch_of_places(batches[0]) is None  # the batch of the drop: copied
    assert batch_of_places(batches[1]) is None  # places handed out before the drop was known: copied
    assert all(batch_of_places(batch) is not None for batch in batches[2:])  # whole views again
    storages = {(place.batch.untyped_storage().data_ptr(), place.position) for place in [*handed, *later]}
    assert len(storages) == len(handed) + len(later)  # every place its own


def _places(batch: torch.Tensor, temporary: set[int]) -> list[BatchPlace]:
    """A column of places of ``batch``, those at ``temporary`` positions in storages of their own holding
    what the batch would hold there (the batch itself holds zeros at those positions)."""
    column: list[BatchPlace] = []
    for position in range(len(batch)):
        if position in temporary:
            own = batch[position : position + 1].clone()
            batch[position] = 0
            column.append(TemporaryPlace(own, position, own.numpy()[0]))
        else:
            column.append(BatchPlace(batch, position, batch.numpy()[position]))
    return column


def test_temporary_places_are_copied_into_their_batch():
    frames = torch.arange(6 * 2 * 3 * 4 * 5, dtype=torch.int64).reshape(6, 2, 3, 4, 5).to(torch.uint8)
    batch = frames.clone()
    settled = settle_temporary_places(_places(batch, {0, 1, 3}))
    assert settled is not None and settled.data_ptr() == batch.data_ptr()  # the batch's own storage, no new one
    assert torch.equal(settled, frames)
    # A short last batch: the view of its first rows.
    short = frames.clone()
    settled = settle_temporary_places(_places(short, {0})[:4])
    assert settled is not None and torch.equal(settled, frames[:4]) and settled.data_ptr() == short.data_ptr()


def test_columns_that_are_not_one_batch_with_temporaries_are_left_to_the_copy():
    frames = torch.zeros(4, 3, 2, 2, dtype=torch.uint8)
    every = _places(frames.clone(), {0, 1, 2, 3})
    assert settle_temporary_places(every) is None  # no batch storage to copy into
    other = frames.clone()
    mixed = _places(frames.clone(), {0})[:2] + _places(other, set())[2:]
    assert settle_temporary_places(mixed) is None  # two batch storages
    swapped = _places(frames.clone(), {0})
    swapped[1], swapped[2] = swapped[2], swapped[1]
    assert settle_temporary_places(swapped) is None  # out of order
    assert settle_temporary_places([frames[0], frames[1]]) is None  # tensors, not places


def _release(place: BatchPlace) -> None:
    """What the training step does when it lets go of the batch of ``place``: marks its storage released."""
    storage = place.batch.untyped_storage()
    storage[storage.nbytes() - TRAILER_BYTES] = RELEASED


def test_samples_run_ahead_of_two_held_batches_wait_in_temporaries_that_are_written_again():
    storages = RecycledStorages(IN_PROCESS_KEEP, shared=False)
    slots = BatchSlots(8, {"cam": 1}, lambda key, episode: (2, 3), return_uint8=True, shared_memory=False,
                       storages=storages, ahead_limit=2)

    def submit(count: int, ahead: bool) -> list[BatchPlace]:
        places = []
        for _ in range(count):
            if ahead:
                assert slots.may_start_ahead()
            places.append(slots.next_slot(0)["cam"])
        return places

    first = submit(8, ahead=False)  # the batch the step will hold
    second = submit(8, ahead=True)  # the batch being filled: a second storage, nothing held apart yet
    assert storages.created == 2 and first[0].batch.data_ptr() != second[0].batch.data_ptr()
    third = submit(2, ahead=True)  # run ahead while both are in use: temporaries, not a third storage
    assert all(type(place) is TemporaryPlace for place in third) and storages.created == 2
    assert [place.position for place in third] == [0, 1]
    _release(first[0])  # the step let go of the first batch
    third += submit(6, ahead=True)  # the rest of the third batch: in the first one's storage, at their positions
    assert all(type(place) is BatchPlace for place in third[2:]) and storages.created == 2 and storages.reused == 1
    assert third[2].batch.data_ptr() == first[0].batch.data_ptr() and [p.position for p in third[2:]] == list(range(2, 8))
    _release(second[0])
    fourth = submit(2, ahead=True)  # the fourth batch runs ahead while the third is held and... only one in use
    assert all(type(place) is BatchPlace for place in fourth)
    _release(third[2])
    fifth = submit(6, ahead=False) + submit(8, ahead=False)  # the fourth batch, then the fifth held with it
    fifth_storage = fifth[-1].batch
    sixth = submit(2, ahead=True)  # fourth and fifth in use: temporaries again, those of the third batch written again
    assert all(type(place) is TemporaryPlace for place in sixth)
    assert {p.batch.data_ptr() for p in sixth} == {p.batch.data_ptr() for p in third[:2]}
    assert fifth_storage.data_ptr() != sixth[0].batch.data_ptr()
    slots.reset()  # a reset never hands out a temporary a cancelled decode may still write
    _release(fourth[0])
    _release(fifth[-1])
    assert all(type(place) is BatchPlace for place in submit(2, ahead=True))


def test_no_temporaries_where_a_batch_is_not_much_larger_than_what_runs_ahead():
    storages = RecycledStorages(IN_PROCESS_KEEP, shared=False)
    slots = BatchSlots(7, {"cam": 1}, lambda key, episode: (2, 3), return_uint8=True, shared_memory=False,
                       storages=storages, ahead_limit=2)
    for _ in range(7 * 4):
        assert slots.may_start_ahead()
        assert type(slots.next_slot(0)["cam"]) is BatchPlace  # temporaries would hold about a batch here
