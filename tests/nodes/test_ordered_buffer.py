"""OrderedBuffer: schedule order whatever the finish order, bounded look-ahead, exact state, errors."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from torchdata.nodes import BaseNode

from lerobot_nodes.errors import GraphFailedError
from lerobot_nodes.nodes import OrderedBuffer, PendingSample, ScheduleItem
from lerobot_nodes.testing.resume_contract import assert_resumes_exactly


class ShuffledFinish(BaseNode[PendingSample]):
    """Pending samples ``0..n-1`` that finish in a random order; optional failures."""

    def __init__(self, n: int, fail_map: int | None = None, fail_pull: int | None = None, seed: int = 0) -> None:
        super().__init__()
        self.n, self.fail_map, self.fail_pull = n, fail_map, fail_pull
        self.rng = random.Random(seed)
        self.pool = ThreadPoolExecutor(4)
        self.pulled = 0
        self.i = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.i = initial_state["i"] if initial_state else 0

    def next(self) -> PendingSample:
        if self.i >= self.n:
            raise StopIteration
        if self.i == self.fail_pull:
            raise ValueError(f"source failed at {self.i}")
        i, delay = self.i, self.rng.random() * 0.01
        self.i += 1
        self.pulled += 1

        def work() -> dict[str, Any]:
            time.sleep(delay)
            if i == self.fail_map:
                raise KeyError(f"decode failed at {i}")
            return {"i": i}

        item = ScheduleItem(episode=0, frame=i, seq=i, epoch=0, last_of_episode=False)
        return PendingSample(item, self.pool.submit(work))

    def get_state(self) -> dict[str, Any]:
        return {"i": self.i}


@pytest.mark.timeout(30)
def test_samples_come_out_in_schedule_order_with_bounded_lookahead():
    source = ShuffledFinish(60)
    buffer = OrderedBuffer(source, max_ahead=5)
    out = []
    for sample in buffer:
        out.append(sample["i"])
        assert source.pulled - len(out) <= 5
    assert out == list(range(60))


@pytest.mark.timeout(30)
def test_state_excludes_samples_decoded_ahead_and_resumes_exactly():
    for cut in (0, 1, 17, 39, 40):
        buffer = OrderedBuffer(ShuffledFinish(40, seed=cut), max_ahead=6)
        head = [next(buffer)["i"] for _ in range(cut)]
        state = buffer.state_dict()
        assert state["source"] == {"i": cut} and state["num_yielded"] == cut
        resumed = OrderedBuffer(ShuffledFinish(40, seed=99), max_ahead=3)
        resumed.reset(state)
        assert head + [s["i"] for s in resumed] == list(range(40))


@pytest.mark.timeout(30)
def test_a_decode_error_is_raised_in_order_then_the_graph_stays_failed():
    buffer = OrderedBuffer(ShuffledFinish(20, fail_map=7), max_ahead=8)
    got = [next(buffer)["i"] for _ in range(7)]
    assert got == list(range(7))
    with pytest.raises(KeyError, match="decode failed at 7"):
        next(buffer)
    assert buffer.state_dict()["source"] == {"i": 7}  # a resume retries the failed sample
    with pytest.raises(GraphFailedError, match="decode failed at 7"):
        next(buffer)
    buffer.reset()
    assert next(buffer)["i"] == 0


@pytest.mark.timeout(30)
def test_a_source_error_comes_after_the_samples_pulled_before_it():
    buffer = OrderedBuffer(ShuffledFinish(20, fail_pull=4), max_ahead=8)
    assert [next(buffer)["i"] for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="source failed at 4"):
        next(buffer)
    with pytest.raises(GraphFailedError):
        next(buffer)


@pytest.mark.timeout(60)
def test_ordered_buffer_keeps_the_resume_contract():
    assert_resumes_exactly(
        lambda: OrderedBuffer(ShuffledFinish(30, seed=3), max_ahead=5),
        cuts=[0, 1, 11, 29, 30],
        consume=lambda sample: sample["i"],
        close=lambda node: node.close(),
    )


class Episodic(ShuffledFinish):
    """ShuffledFinish with episodes of 7 samples (the last one of each marked, as the pool sampler does)."""

    def next(self) -> PendingSample:
        pending = super().next()
        i = pending.item.frame
        last = i % 7 == 6 or i == self.n - 1
        pending.item = ScheduleItem(episode=i // 7, frame=i, seq=i, epoch=0, last_of_episode=last)
        return pending


@pytest.mark.timeout(30)
def test_sparse_snapshots_at_batch_boundaries_and_episode_ends_equal_per_sample_ones():
    n, every = 30, 4
    dense = OrderedBuffer(Episodic(n), max_ahead=6)
    sparse = OrderedBuffer(Episodic(n), max_ahead=6, snapshot_every=every)
    dense.reset()
    sparse.reset()
    states = {0: sparse.state_dict()}
    for position in range(1, n + 1):
        assert next(dense)["i"] == next(sparse)["i"] == position - 1
        if position % every == 0 or position % 7 == 0 or position == n:
            states[position] = sparse.state_dict()
            assert states[position] == dense.state_dict()
        else:
            with pytest.raises(RuntimeError, match="snapshots every 4 samples"):
                sparse.state_dict()
    with pytest.raises(StopIteration):
        next(sparse)
    assert sparse.state_dict() == states[n]
    # A restore at a boundary counts the next boundaries from there.
    resumed = OrderedBuffer(Episodic(n), max_ahead=6, snapshot_every=every)
    resumed.reset(states[7])
    assert [next(resumed)["i"] for _ in range(4)] == [7, 8, 9, 10]
    assert resumed.state_dict() == {"source": {"i": 11}, "num_yielded": 11}  # 7 + 4: a boundary again
    assert [sample["i"] for sample in resumed] == list(range(11, n))


class HeldBack(ShuffledFinish):
    """``ShuffledFinish`` whose samples may be pulled ahead only while ``ahead_allowed`` says so
    (the ``may_run_ahead`` of a decode mapper whose next sample would start a batch in a new segment)."""

    def __init__(self, n: int, ahead_allowed: Any) -> None:
        super().__init__(n)
        self.ahead_allowed = ahead_allowed

    def may_run_ahead(self) -> bool:
        return bool(self.ahead_allowed(self.i))


@pytest.mark.timeout(30)
def test_a_source_that_holds_back_is_pulled_only_when_the_consumer_waits():
    # Pulls ahead are refused at every 4th sample (a batch of 4 starting), so each such sample
    # is pulled only when the buffer is empty: the order and the states are the same as without.
    source = HeldBack(24, lambda i: i % 4 != 0)
    buffer = OrderedBuffer(source, max_ahead=6, snapshot_every=4)
    out, states = [], []
    for _ in range(24):
        out.append(next(buffer)["i"])
        assert source.i <= 4 * -(-len(out) // 4)  # nothing of the next batch pulled ahead
        if len(out) % 4 == 0:
            states.append(buffer.state_dict())
    assert out == list(range(24))
    reference = OrderedBuffer(ShuffledFinish(24), max_ahead=6, snapshot_every=4)
    expected = []
    for position in range(24):
        next(reference)
        if (position + 1) % 4 == 0:
            expected.append(reference.state_dict())
    assert states == expected
