"""EpisodeByteCache: reservations, residency, release after the last decode, waits."""

from __future__ import annotations

import threading

import pytest

from lerobot_nodes.errors import ByteBudgetError, FetchCancelled
from lerobot_nodes.fetch import ByteBudget, EpisodeByteCache


def test_reservations_follow_the_budget_rule():
    cache = EpisodeByteCache(ByteBudget(worker_bytes=100, rank_bytes=400))
    assert cache.try_reserve(0, 60)
    assert not cache.try_reserve(1, 50)  # 110 > 100
    assert cache.try_reserve(2, 40)
    assert cache.reserved_bytes == 100 and cache.resident_bytes == 0
    with pytest.raises(ByteBudgetError, match="episode 3 needs 500 bytes"):
        cache.try_reserve(3, 500)


def test_bytes_are_released_after_the_last_decode_of_a_closed_episode():
    freed = []
    cache = EpisodeByteCache(ByteBudget(100, 100), on_free=lambda: freed.append(True))
    cache.want(0)
    cache.acquire(0)
    cache.acquire(0)
    assert cache.try_reserve(0, 70)
    cache.fulfil(0, "payload", fetched_bytes=70)
    assert cache.resident_bytes == 70 and cache.stats().episodes_resident == 1
    cache.release(0)
    cache.close(0)
    assert cache.reserved_bytes == 70 and not freed  # one sample still decoding
    cache.release(0)
    assert cache.reserved_bytes == 0 and cache.resident_bytes == 0 and freed == [True]
    assert cache.max_reserved_bytes == 70 and cache.stats().fetched_bytes == 70


def test_a_pending_fetch_keeps_its_bytes_until_it_finishes():
    cache = EpisodeByteCache(ByteBudget(100, 100))
    cache.acquire(0)
    cache.try_reserve(0, 50)
    cache.close(0)
    cache.release(0)
    assert cache.reserved_bytes == 50
    cache.fail(0, RuntimeError("late"))
    assert cache.reserved_bytes == 0


def test_an_oversized_episode_is_reserved_only_when_alone():
    cache = EpisodeByteCache(ByteBudget(worker_bytes=100, rank_bytes=300))
    cache.acquire(0)
    assert cache.try_reserve(0, 10)
    assert not cache.try_reserve(1, 250)
    cache.fulfil(0, "p")
    cache.close(0)
    cache.release(0)
    assert cache.try_reserve(1, 250)
    assert not cache.try_reserve(2, 1)


@pytest.mark.timeout(10)
def test_waits_return_payloads_raise_fetch_errors_and_end_on_cancel():
    cache = EpisodeByteCache(ByteBudget(100, 100))
    cancelled = threading.Event()
    cache.try_reserve(0, 1)
    threading.Timer(0.05, cache.fulfil, args=(0, "ready")).start()
    assert cache.wait(0, cancelled) == "ready"
    cache.try_reserve(1, 1)
    cache.fail(1, OSError("disk on fire"))
    with pytest.raises(OSError, match="disk on fire"):
        cache.wait(1, cancelled)
    cache.try_reserve(2, 1)
    threading.Timer(0.05, cancelled.set).start()
    with pytest.raises(FetchCancelled):
        cache.wait(2, cancelled)
    cache.clear()
    with pytest.raises(FetchCancelled):
        cache.wait(0, threading.Event())
    assert cache.reserved_bytes == 0


def test_an_episode_wanted_again_before_its_visit_closes_stays_held_for_the_next_visit():
    """A weighted mixture's dataset epochs bring an episode back: the prefetcher may want it again while the
    previous visit's samples are still scheduled; one close per visit, and the payload serves both."""
    cache = EpisodeByteCache(ByteBudget(100, 100))
    assert cache.want(0)  # the first visit: a new entry, to fetch
    assert cache.try_reserve(0, 40)
    cache.fulfil(0, "payload", fetched_bytes=40)
    assert not cache.want(0)  # the next visit, planned ahead: held already, no second fetch
    cache.close(0)  # the first visit's last sample is scheduled
    assert cache.is_ready(0) and cache.reserved_bytes == 40
    cache.acquire(0)
    assert cache.wait(0, threading.Event()) == "payload"
    cache.release(0)
    assert cache.reserved_bytes == 40  # the second visit is not closed yet
    cache.close(0)
    assert cache.reserved_bytes == 0 and not cache.is_ready(0)
    assert cache.want(0)  # after both visits, a third one fetches again
