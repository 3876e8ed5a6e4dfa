"""BytePrefetcher: one frontier in admission order, the byte budget, errors, thread lifetime."""

from __future__ import annotations

import random
import threading
import time
from collections import deque

import pytest

from lerobot_nodes.errors import ByteBudgetError, FetchCancelled
from lerobot_nodes.fetch import ByteBudget, EpisodePayload
from lerobot_nodes.nodes import BytePrefetcher
from lerobot_nodes.testing.resume_contract import assert_resumes_exactly

from .helpers import lerobot_threads, make_sampler, wait_until


class FakeFetch:
    """Returns an empty payload per episode, recording the order of fetches."""

    def __init__(self, delay_s: float = 0.0, fail: set[int] | None = None) -> None:
        self.delay_s = delay_s
        self.fail = fail or set()
        self.fetched: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, episode: int) -> EpisodePayload:
        with self._lock:
            self.fetched.append(episode)
        if self.delay_s:
            time.sleep(self.delay_s)
        if episode in self.fail:
            raise OSError(f"injected failure for episode {episode}")
        return EpisodePayload(episode=episode, data=None, fetched_bytes=1)  # type: ignore[arg-type]


def drive(prefetcher: BytePrefetcher, window: int, on_step=None) -> list:
    """A consumer with ``window`` samples in flight: waits for the oldest, then releases it."""
    cancelled = threading.Event()
    in_flight: deque = deque()
    items = []
    exhausted = False
    while not exhausted or in_flight:
        while not exhausted and len(in_flight) < window:
            try:
                in_flight.append(next(prefetcher))
            except StopIteration:
                exhausted = True
        if in_flight:
            task = in_flight.popleft()
            task.wait_payload(cancelled)
            task.done()
            items.append(task.item)
        if on_step is not None:
            on_step()
    return items


@pytest.mark.timeout(60)
def test_fetches_follow_admission_order_and_reserved_bytes_stay_within_budget():
    rng = random.Random(4)
    episodes = list(range(30))
    lengths = [rng.randint(1, 12) for _ in episodes]
    costs = {e: rng.randint(10, 100) for e in episodes}
    budget = ByteBudget(worker_bytes=250, rank_bytes=1000)
    sampler = make_sampler(episodes, lengths, pool_size=3, costs=costs, budget=budget, seed=11)
    fetch = FakeFetch()
    prefetcher = BytePrefetcher(sampler, fetch, prefetch_episodes=4, max_concurrent_fetches=1)
    prefetcher.reset()
    admission = list(sampler.admission_order())
    ratios = []
    items = drive(prefetcher, window=6, on_step=lambda: ratios.append(prefetcher.cache.reserved_bytes / 250))
    assert len(items) == sum(lengths)
    assert fetch.fetched == admission  # one frontier, strictly in admission order, each episode once
    assert max(ratios) <= 1.0 and prefetcher.cache.max_reserved_bytes <= 250
    print(f"\nfake-fetch max reserved/budget = {prefetcher.cache.max_reserved_bytes / 250:.3f}")
    assert wait_until(lambda: prefetcher.cache.reserved_bytes == 0)
    prefetcher.close()


@pytest.mark.timeout(30)
def test_speculative_prefetch_stops_when_the_budget_is_full():
    costs = {e: 100 for e in range(10)}
    sampler = make_sampler(list(range(10)), [5] * 10, pool_size=1, costs=costs, budget=ByteBudget(200, 1000), seed=1)
    fetch = FakeFetch()
    prefetcher = BytePrefetcher(sampler, fetch, prefetch_episodes=8, max_concurrent_fetches=4)
    task = next(prefetcher)
    assert wait_until(lambda: len(fetch.fetched) == 2)
    time.sleep(0.05)
    assert len(fetch.fetched) == 2 and prefetcher.cache.reserved_bytes == 200
    # The replacement of the first episode waits until its last decode releases the bytes.
    for _ in range(4):
        task.wait_payload(threading.Event())
        task.done()
        task = next(prefetcher)
    assert len(fetch.fetched) == 2
    task.wait_payload(threading.Event())
    task.done()  # the last sample of the first episode: its bytes are freed, the next fetch starts
    assert wait_until(lambda: len(fetch.fetched) == 3)
    prefetcher.close()


@pytest.mark.timeout(30)
def test_an_episode_over_the_rank_budget_fails_before_its_payload_is_fetched():
    costs = {0: 10, 1: 10, 2: 10_000}
    sampler = make_sampler([0, 1, 2], [3, 3, 3], pool_size=1, costs=costs, budget=ByteBudget(100, 1000), shuffle=False)
    fetch = FakeFetch()
    prefetcher = BytePrefetcher(sampler, fetch, prefetch_episodes=1, max_concurrent_fetches=2)
    with pytest.raises(ByteBudgetError, match="episode 2 needs 10000 bytes"):
        drive(prefetcher, window=2)
    assert 2 not in fetch.fetched
    prefetcher.close()


@pytest.mark.timeout(30)
def test_a_failed_fetch_reaches_every_waiting_sample():
    sampler = make_sampler([0, 1, 2], [2, 2, 2], pool_size=3, shuffle=False)
    prefetcher = BytePrefetcher(sampler, FakeFetch(fail={1}), prefetch_episodes=0)
    tasks = [next(prefetcher) for _ in range(6)]
    failing = [t for t in tasks if t.episode == 1]
    for task in failing:
        with pytest.raises(OSError, match="injected failure for episode 1"):
            task.wait_payload(threading.Event())
    prefetcher.close()


@pytest.mark.timeout(30)
def test_reset_and_close_join_fetch_threads_and_cancel_waits():
    sampler = make_sampler(list(range(6)), [4] * 6, pool_size=3, seed=2)
    fetch = FakeFetch(delay_s=0.3)
    prefetcher = BytePrefetcher(sampler, fetch, prefetch_episodes=2, max_concurrent_fetches=1)
    tasks = [next(prefetcher) for _ in range(12)]
    assert wait_until(lambda: len(fetch.fetched) == 1)
    # A sample whose episode is still queued behind the one slow fetch running now.
    task = next(t for t in tasks if t.episode != fetch.fetched[0])
    assert lerobot_threads()
    cancelled = threading.Event()
    waiter_error: list[BaseException] = []

    def wait() -> None:
        try:
            task.wait_payload(cancelled)
        except BaseException as exc:
            waiter_error.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    prefetcher.reset()
    assert not any(name.startswith("lerobot-nodes-fetch") for name in lerobot_threads())
    waiter.join(5)
    assert not waiter.is_alive() and isinstance(waiter_error[0], FetchCancelled)
    assert prefetcher.cache.reserved_bytes == 0
    state_items = drive(prefetcher, window=3)
    assert len(state_items) == 24
    prefetcher.close()
    assert not any(name.startswith("lerobot-nodes-fetch") for name in lerobot_threads())


@pytest.mark.timeout(60)
def test_prefetcher_keeps_the_resume_contract():
    """Its state is the sampler's: payloads fetched ahead are fetched again after a restore."""
    def consume(task):
        task.wait_payload(threading.Event())
        task.done()
        return (task.item.episode, task.item.frame)

    assert_resumes_exactly(
        lambda: BytePrefetcher(make_sampler(list(range(8)), [3] * 8, pool_size=2, seed=5), FakeFetch(), prefetch_episodes=2),
        cuts=[0, 5, 13, 24],
        consume=consume,
        close=lambda node: node.close(),
    )
