"""Byte accounting of the episodes one worker holds: the budget rule and the payload cache.

:class:`ByteBudget` is the one admission rule, shared by the logical pool (which episodes may
be resident together) and by the cache (which fetches may start): an episode is admitted when
it fits in the worker's share of the rank budget, or when nothing else is held (an episode
larger than the worker share but within the rank budget then runs alone). An episode larger
than the whole rank budget is an error raised before any of its payload is fetched.

:class:`EpisodeByteCache` holds one entry per episode the prefetcher wants. Bytes are
*reserved* from the moment a fetch is admitted until the last decode of the episode has
released it, so ``reserved_bytes`` covers pending fetches, finished prefetches and episodes
still decoding; ``resident_bytes`` counts finished payloads, even before their first sample.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ByteBudgetError, FetchCancelled

_GB = 1_000_000_000


def _gb(nbytes: int) -> str:
    return f"{nbytes / _GB:.3f} GB"


@dataclass(frozen=True)
class ByteBudget:
    """The budget of one worker: its share and the whole rank budget, in bytes."""

    worker_bytes: int
    rank_bytes: int

    def __post_init__(self) -> None:
        if self.worker_bytes <= 0 or self.rank_bytes < self.worker_bytes:
            raise ValueError(f"invalid byte budget: worker {self.worker_bytes} B, rank {self.rank_bytes} B")

    @classmethod
    def unlimited(cls) -> ByteBudget:
        return cls(worker_bytes=1 << 62, rank_bytes=1 << 62)

    def admits(self, held_bytes: int, held_episodes: int, nbytes: int) -> bool:
        """May an episode of ``nbytes`` join ``held_episodes`` episodes holding ``held_bytes``?"""
        return held_episodes == 0 or held_bytes + nbytes <= self.worker_bytes

    def check_episode(self, episode: int, nbytes: int, detail: str = "") -> None:
        """Raise :class:`ByteBudgetError` when ``episode`` alone exceeds the rank budget."""
        if nbytes > self.rank_bytes:
            what = f" ({detail})" if detail else ""
            raise ByteBudgetError(
                f"byte budget exceeded: episode {episode} needs {nbytes} bytes ({_gb(nbytes)}) of MP4 clips{what}, "
                f"more than the whole per-rank budget of {self.rank_bytes} bytes ({_gb(self.rank_bytes)}); "
                "nothing of it was fetched. Raise --dataset.streaming_byte_budget_gb, or use a payload layout "
                "with smaller episode spans (a smaller pool does not help an episode that alone is too large)"
            )


@dataclass
class _Entry:
    nbytes: int = 0
    reserved: bool = False
    done: bool = False
    payload: Any = None
    error: BaseException | None = None
    users: int = 0
    closed: bool = False
    visits: int = 0
    """``want`` calls not yet matched by a ``close``: an episode may be wanted again (a weighted mixture's
    next dataset epoch) before its current visit closes, and then stays held for that visit."""


@dataclass(frozen=True)
class ByteCacheStats:
    reserved_bytes: int
    resident_bytes: int
    max_reserved_bytes: int
    budget_bytes: int
    episodes_reserved: int
    episodes_resident: int
    fetched_bytes: int
    episodes_fetched: int


class EpisodeByteCache:
    """Thread-safe reservations and payloads of the episodes one worker prefetches.

    Life of an entry: ``want`` (known, no bytes) -> ``try_reserve`` (bytes counted, fetch may
    start) -> ``fulfil`` or ``fail`` -> freed once ``close`` was called (no more samples of it
    will be scheduled) and every ``acquire`` has been matched by a ``release``. Freeing calls
    ``on_free`` so the prefetcher can admit the next fetch. Guarantee: ``reserved_bytes`` never
    exceeds ``budget.worker_bytes`` except while one episode larger than that share (but within
    the rank budget) is held alone.
    """

    def __init__(self, budget: ByteBudget, on_free: Callable[[], None] | None = None) -> None:
        self.budget = budget
        self._on_free = on_free
        self._entries: dict[int, _Entry] = {}
        self._cond = threading.Condition()
        self._reserved = 0
        self._reserved_episodes = 0
        self._resident = 0
        self._max_reserved = 0
        self._fetched_bytes = 0
        self._episodes_fetched = 0
        self._generation = 0

    # -- accounting ---------------------------------------------------------------------
    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    @property
    def resident_bytes(self) -> int:
        return self._resident

    @property
    def max_reserved_bytes(self) -> int:
        return self._max_reserved

    def stats(self) -> ByteCacheStats:
        with self._cond:
            return ByteCacheStats(
                reserved_bytes=self._reserved,
                resident_bytes=self._resident,
                max_reserved_bytes=self._max_reserved,
                budget_bytes=self.budget.worker_bytes,
                episodes_reserved=self._reserved_episodes,
                episodes_resident=sum(1 for e in self._entries.values() if e.done and e.error is None),
                fetched_bytes=self._fetched_bytes,
                episodes_fetched=self._episodes_fetched,
            )

    # -- life of an entry -----------------------------------------------------------------
    def want(self, episode: int) -> bool:
        """Make sure ``episode`` has an entry (no bytes counted yet) for one more visit; True when the
        entry is new (a held one serves the visit with the payload it has or is fetching)."""
        with self._cond:
            entry = self._entries.get(episode)
            fresh = entry is None
            if entry is None:
                entry = self._entries[episode] = _Entry()
            entry.visits += 1
            entry.closed = False
            return fresh

    def try_reserve(self, episode: int, nbytes: int) -> bool:
        """Count ``nbytes`` for ``episode`` if the budget admits it now; True when reserved."""
        self.budget.check_episode(episode, nbytes)
        with self._cond:
            entry = self._entries.setdefault(episode, _Entry())
            if entry.reserved:
                return True
            if not self.budget.admits(self._reserved, self._reserved_episodes, nbytes):
                return False
            entry.reserved, entry.nbytes = True, nbytes
            self._reserved += nbytes
            self._reserved_episodes += 1
            self._max_reserved = max(self._max_reserved, self._reserved)
            return True

    def fulfil(self, episode: int, payload: Any, fetched_bytes: int = 0) -> None:
        """The fetch of ``episode`` finished: its payload becomes resident."""
        with self._cond:
            entry = self._entries.get(episode)
            if entry is None or entry.done:
                return
            entry.payload, entry.done = payload, True
            self._resident += entry.nbytes
            self._fetched_bytes += fetched_bytes
            self._episodes_fetched += 1
            self._cond.notify_all()
            freed = self._maybe_free(episode, entry)
        self._notify_freed(freed)

    def fail(self, episode: int, error: BaseException) -> None:
        """The fetch of ``episode`` failed: every wait on it raises ``error``."""
        with self._cond:
            entry = self._entries.get(episode)
            if entry is None or entry.done:
                return
            entry.error, entry.done = error, True
            self._cond.notify_all()
            freed = self._maybe_free(episode, entry)
        self._notify_freed(freed)

    def acquire(self, episode: int) -> None:
        """One more scheduled sample will read ``episode``."""
        with self._cond:
            self._entries.setdefault(episode, _Entry()).users += 1

    @property
    def generation(self) -> int:
        """Increases at every :meth:`clear`; holds taken before it no longer count."""
        return self._generation

    def release(self, episode: int, generation: int | None = None) -> None:
        """A sample of ``episode`` is done (decoded, failed or cancelled).

        With ``generation`` (taken when the sample was scheduled) a release from before the
        last :meth:`clear` is ignored, so a late thread cannot free a newer entry.
        """
        with self._cond:
            entry = self._entries.get(episode)
            if entry is None or (generation is not None and generation != self._generation):
                return
            entry.users -= 1
            freed = self._maybe_free(episode, entry)
        self._notify_freed(freed)

    def close(self, episode: int) -> None:
        """No more samples of ``episode`` will be scheduled this epoch."""
        with self._cond:
            entry = self._entries.get(episode)
            if entry is None:
                return
            entry.visits -= 1
            entry.closed = entry.visits <= 0
            freed = self._maybe_free(episode, entry)
        self._notify_freed(freed)

    def wait(
        self, episode: int, cancelled: threading.Event, generation: int | None = None, poll_s: float = 0.05
    ) -> Any:
        """The payload of ``episode``, waiting for its fetch; raises its fetch error.

        Raises :class:`FetchCancelled` once ``cancelled`` is set or the cache was cleared since
        ``generation`` (a reset or close), so a wait never outlives the graph that started it.
        """
        with self._cond:
            while True:
                entry = self._entries.get(episode)
                if entry is None or (generation is not None and generation != self._generation):
                    raise FetchCancelled(f"episode {episode} is not held by the byte cache (the graph was reset)")
                if entry.done:
                    if entry.error is not None:
                        raise entry.error
                    return entry.payload
                if cancelled.is_set():
                    raise FetchCancelled(f"the wait for episode {episode} was cancelled by a reset or close")
                self._cond.wait(poll_s)

    def is_ready(self, episode: int) -> bool:
        with self._cond:
            entry = self._entries.get(episode)
            return entry is not None and entry.done

    def clear(self) -> None:
        """Drop every entry (on reset): waits raise, late fetch results are ignored."""
        with self._cond:
            self._entries.clear()
            self._reserved = self._reserved_episodes = self._resident = 0
            self._generation += 1
            self._cond.notify_all()

    # -- internals --------------------------------------------------------------------------
    def _maybe_free(self, episode: int, entry: _Entry) -> bool:
        # Called with the lock held. A pending fetch keeps its bytes until it finishes, so the
        # count never drops below what fetch threads actually hold.
        if not entry.closed or entry.users > 0 or (entry.reserved and not entry.done):
            return False
        del self._entries[episode]
        if entry.reserved:
            self._reserved -= entry.nbytes
            self._reserved_episodes -= 1
        if entry.done and entry.error is None:
            self._resident -= entry.nbytes
        self._cond.notify_all()
        return True

    def _notify_freed(self, freed: bool) -> None:
        # Outside the lock: the callback takes the prefetcher's own lock.
        if freed and self._on_free is not None:
            self._on_free()
