"""Worker parts joined into one batch (batch_memory.worker_parts): sizes, order, one storage, and
the joining iterator's batch boundaries."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_nodes.batch_memory.worker_parts import JoinedParts, join_parts, part_size


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 16), extra=st.integers(0, 200))
def test_part_sizes_sum_to_the_batch_and_differ_by_at_most_one(workers, extra):
    batch_size = workers + extra
    sizes = [part_size(batch_size, workers, w) for w in range(workers)]
    assert sum(sizes) == batch_size and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_a_batch_smaller_than_the_worker_count_is_refused():
    with pytest.raises(ValueError, match="cannot take a part from each of 4 workers"):
        part_size(3, 4, 0)


def _part(first: int, rows: int) -> dict:
    index = torch.arange(first, first + rows)
    return {
        "observation.images.top": index.view(-1, 1, 1, 1).expand(rows, 2, 3, 4).to(torch.uint8).contiguous(),
        "index": index,
        "task": [f"t{i}" for i in range(first, first + rows)],
    }


def test_parts_are_joined_in_order_into_one_storage():
    batch = join_parts([_part(0, 3), _part(3, 2), _part(5, 3)])
    assert batch["index"].tolist() == list(range(8))
    assert batch["observation.images.top"][:, 0, 0, 0].tolist() == list(range(8))
    assert batch["task"] == [f"t{i}" for i in range(8)]
    assert len({t.untyped_storage().data_ptr() for t in batch.values() if isinstance(t, torch.Tensor)}) == 1


def test_a_part_that_is_not_a_tensor_or_a_list_is_a_clear_error():
    with pytest.raises(TypeError, match="cannot join batch parts holding dict under 'extra'"):
        join_parts([{**_part(0, 1), "extra": {}}, {**_part(1, 1), "extra": {}}])


def test_joined_parts_take_num_parts_each_and_the_last_batch_what_is_left():
    parts = [_part(3 * i, 3) for i in range(7)]
    batches = list(JoinedParts(iter(parts), 3))
    assert [len(b["index"]) for b in batches] == [9, 9, 3]
    assert torch.cat([b["index"] for b in batches]).tolist() == list(range(21))
