"""Byte-budget prefetcher: one admission frontier fetches episodes ahead of the schedule.

For every schedule item it returns at once a :class:`SampleTask` (the item plus a handle on
its episode's payload). Behind it, fetches run on up to ``max_concurrent_fetches`` threads in
the order episodes are admitted to the pool: first the resident episodes, then up to
``prefetch_episodes`` upcoming ones. A fetch starts only once :class:`EpisodeByteCache`
reserves its exact byte cost, strictly in frontier order, so a full budget stops speculative
prefetch and a replacement waits until the last decode of an earlier episode frees its bytes.

The schedule never waits for I/O here: ``next()`` only pulls the (pure) pool sampler, so
which item comes next cannot depend on which fetch finished first.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from torchdata.nodes import BaseNode

from ..errors import FetchCancelled
from ..fetch.byte_cache import EpisodeByteCache
from ..fetch.episode_fetch import EpisodePayload
from ..metrics import MetricsSink, NullMetrics
from .pool_sampler import EpisodePoolSampler, ScheduleItem

FetchFn = Callable[[int], EpisodePayload]


class SampleTask:
    """One scheduled sample and the payload it will read.

    ``wait_payload`` blocks until the episode is fetched (raising its fetch error, or
    :class:`FetchCancelled` after a reset); ``done`` must be called once the sample is
    decoded or abandoned so the episode's bytes can be released.
    """

    __slots__ = ("item", "_cache", "_generation", "_done")

    def __init__(self, item: ScheduleItem, cache: EpisodeByteCache) -> None:
        self.item = item
        self._cache = cache
        self._generation = cache.generation
        self._done = False

    @property
    def episode(self) -> int:
        return self.item.episode

    def payload_ready(self) -> bool:
        return self._cache.is_ready(self.item.episode)

    def wait_payload(self, cancelled: threading.Event) -> EpisodePayload:
        return self._cache.wait(self.item.episode, cancelled, self._generation)

    def done(self) -> None:
        if not self._done:
            self._done = True
            self._cache.release(self.item.episode, self._generation)

    def __repr__(self) -> str:
        return f"SampleTask(episode={self.item.episode}, frame={self.item.frame}, seq={self.item.seq})"


class BytePrefetcher(BaseNode[SampleTask]):
    """Turns schedule items into sample tasks and keeps the episodes they need fetched.

    ``source`` is the :class:`EpisodePoolSampler`; ``fetch`` reads one episode's payload
    (:meth:`EpisodeFetcher.fetch`). Episode costs and the budget come from the sampler: the
    same numbers and rule as its pool admission, which is what makes the frontier
    deadlock-free (every pool fits, and reservations are granted in admission order).
    ``cache`` is the worker's :class:`EpisodeByteCache` (``reserved_bytes``,
    ``resident_bytes``, ``stats()``).

    State: the sampler's state after the last returned item. Restoring it re-fetches the
    resident episodes; nothing fetched is ever part of the state. Threads start lazily and
    are joined on ``reset`` and ``close``; after ``close`` the node must be reset to be used.
    """

    SOURCE_KEY = "source"

    def __init__(
        self,
        source: EpisodePoolSampler,
        fetch: FetchFn,
        *,
        prefetch_episodes: int = 8,
        max_concurrent_fetches: int = 16,
        metrics: MetricsSink | None = None,
    ) -> None:
        super().__init__()
        if prefetch_episodes < 0 or max_concurrent_fetches < 1:
            raise ValueError(
                f"prefetch_episodes must be >= 0 and max_concurrent_fetches >= 1, got {prefetch_episodes}, "
                f"{max_concurrent_fetches}"
            )
        self.source = source
        self.fetch = fetch
        self.cache = EpisodeByteCache(source.budget, on_free=self._pump)
        self.prefetch_episodes = prefetch_episodes
        self.max_concurrent_fetches = max_concurrent_fetches
        self.metrics = metrics or NullMetrics()
        self._lock = threading.RLock()
        self._executor: ThreadPoolExecutor | None = None
        self._wanted: deque[tuple[int, int]] = deque()  # (episode, cost) not yet reserved, frontier order
        self._frontier_end = 0
        self._cancelled = threading.Event()
        self._closed = False

    # -- BaseNode -------------------------------------------------------------------------
    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._stop_fetches()
        self.source.reset(initial_state[self.SOURCE_KEY] if initial_state is not None else None)
        with self._lock:
            self._cancelled = threading.Event()
            self._closed = False
            self._wanted.clear()
            # Episodes before the sharder cursor were admitted: the resident ones still need
            # their payload, the exhausted ones never will again this epoch.
            self._frontier_end = self.source.admitted_count()
            resident = self.source.resident_episodes()
        self._want(resident)
        self._extend_frontier()

    def next(self) -> SampleTask:
        if self._closed:
            raise FetchCancelled("the prefetcher was closed; reset it to iterate again")
        item = next(self.source)
        self._extend_frontier()
        task = SampleTask(item, self.cache)
        self.cache.acquire(item.episode)
        if item.last_of_episode:
            self.cache.close(item.episode)
        self._pump()
        return task

    def get_state(self) -> dict[str, Any]:
        return {self.SOURCE_KEY: self.source.state_dict()}

    def close(self) -> None:
        """Cancel waits, join the fetch threads and drop every payload."""
        self._stop_fetches()

    # -- frontier ---------------------------------------------------------------------------
    def _extend_frontier(self) -> None:
        """Add newly admitted and newly visible upcoming episodes, in admission order."""
        order = self.source.admission_order()
        end = min(len(order), self.source.admitted_count() + self.prefetch_episodes)
        if end > self._frontier_end:
            fresh = list(order[self._frontier_end : end])
            self._frontier_end = end
            self._want(fresh)

    def _want(self, episodes: list[int]) -> None:
        # Costs are computed here, on the consumer thread, by the sampler (which also checks
        # each against the rank budget before anything of the episode is fetched).
        priced = [(episode, self.source.cost(episode)) for episode in episodes]
        with self._lock:
            for episode, cost in priced:
                if self.cache.want(episode):  # a held entry (an earlier visit) needs no second fetch
                    self._wanted.append((episode, cost))

    def _pump(self) -> None:
        """Start every fetch the budget admits now, strictly in frontier order."""
        with self._lock:
            if self._closed:
                return
            while self._wanted:
                episode, cost = self._wanted[0]
                if not self.cache.try_reserve(episode, cost):
                    break
                self._wanted.popleft()
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(
                        max_workers=self.max_concurrent_fetches, thread_name_prefix="lerobot-nodes-fetch"
                    )
                self._executor.submit(self._run_fetch, episode, self._cancelled)
            self.metrics.set("reserved_bytes", self.cache.reserved_bytes)
            self.metrics.set("resident_bytes", self.cache.resident_bytes)

    def _run_fetch(self, episode: int, cancelled: threading.Event) -> None:
        if cancelled.is_set():
            self.cache.fail(episode, FetchCancelled(f"the fetch of episode {episode} was cancelled"))
            return
        try:
            payload = self.fetch(episode)
        except BaseException as exc:  # every failure must reach the waiting decode, never hang it
            self.cache.fail(episode, exc)
            return
        self.cache.fulfil(episode, payload, payload.fetched_bytes)
        self.metrics.add("bytes_planned", payload.planned_bytes)
        self.metrics.add("bytes_fetched", payload.fetched_bytes)
        self.metrics.add("episodes_fetched", 1)
        self.metrics.set("resident_bytes", self.cache.resident_bytes)
        self.metrics.set("reserved_bytes", self.cache.reserved_bytes)

    def _stop_fetches(self) -> None:
        with self._lock:
            self._closed = True
            self._cancelled.set()
            executor, self._executor = self._executor, None
        if executor is not None:
            # Joined without a timeout: a fetch thread must never outlive the reset that
            # replaced its generation (torchdata's reset race, see the reference notes).
            executor.shutdown(wait=True, cancel_futures=True)
        self.cache.clear()
