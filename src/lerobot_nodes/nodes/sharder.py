"""Whole episodes of a dataset split over distributed ranks, then over a rank's DataLoader workers.

:func:`frame_balanced_assignment` splits the episodes over the ranks: deterministic in
(lengths, parts, seed), never splits an episode, and keeps every part's frame total within one
episode length of every other part. :func:`contiguous_balanced_split` splits a rank's episodes
over its workers (the :data:`CONTIGUOUS_SPLIT`): runs of consecutive episode indices with the same
balance bound, so a data Parquet row group is shared by two workers of a rank only at the
``num_workers - 1`` cuts. Checkpoints of versions before it resume with the worker split they
were taken with, :data:`SCATTERED_SPLIT` (:func:`scattered_worker_parts`). :func:`worker_episodes`
applies both (ranks, then the workers of one rank). :class:`RankWorkerSharder` is the source node
of the streaming graph: it yields the episodes of one worker, in an order shuffled per epoch from
(seed, epoch, rank, worker).
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from ..config import resolve_seed
from ..errors import ConfigError

# Distinct SeedSequence streams, so the rank split, the worker split and the per-epoch
# admission order never share random draws.
_RANK_SPLIT_STREAM = 0x52414E4B
_WORKER_SPLIT_STREAM = 0x574F524B
_EPOCH_ORDER_STREAM = 0x4F524452

CONTIGUOUS_SPLIT = "contiguous"
"""A rank's episodes, sorted by index, cut into ``num_workers`` runs (:func:`contiguous_balanced_split`)."""
SCATTERED_SPLIT = "scattered"
"""Longest episode first to the lightest worker (:func:`scattered_worker_parts`): the worker split of
the versions before the contiguous one, kept so that their checkpoints resume exactly."""
WORKER_SPLITS = (CONTIGUOUS_SPLIT, SCATTERED_SPLIT)
"""Every worker split a resume state may record; new runs use the first."""


def seed_entropy(seed: int) -> int:
    """A non-negative integer for ``np.random.SeedSequence`` from any integer seed."""
    return int(seed) % (1 << 64)


def frame_balanced_assignment(lengths: Sequence[int], num_parts: int, seed: int) -> list[list[int]]:
    """Positions ``0..len(lengths)-1`` split into ``num_parts`` parts of whole items.

    Longest first, each item goes to the part with the fewest frames so far (ties between
    equal lengths are broken by a permutation drawn from ``seed``; ties between parts by part
    number). Guarantees: every position is in exactly one part; each part is sorted; when
    there are at least ``num_parts`` items every part is non-empty; the largest and the
    smallest frame totals differ by at most ``max(lengths)``.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if any(int(length) <= 0 for length in lengths):
        raise ValueError("every episode length must be > 0")
    rng = np.random.default_rng(np.random.SeedSequence([seed_entropy(seed), _RANK_SPLIT_STREAM]))
    tie_break = rng.permutation(len(lengths))
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), int(tie_break[i])))
    totals = [(0, part) for part in range(num_parts)]
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    for position in order:
        total, part = heapq.heappop(totals)
        parts[part].append(position)
        heapq.heappush(totals, (total + int(lengths[position]), part))
    return [sorted(part) for part in parts]


def contiguous_cuts(lengths: Sequence[int] | np.ndarray, num_parts: int) -> list[int]:
    """Cut positions ``0 = c[0] <= c[1] <= ... <= c[num_parts] = len(lengths)``: part ``k`` is the
    run ``c[k]:c[k+1]`` of the items in their given order. A pure function of (lengths, num_parts).

    Guarantees, with ``m`` items of positive lengths, ``M`` the largest and ``n`` parts:

    - every item is in exactly one part and the parts are contiguous, in order;
    - when ``m >= n`` every part is non-empty and every part's frame total lies in
      ``[a, a + M]`` for one ``a >= 1``, so the largest and smallest totals differ by at most ``M``;
    - when ``m < n`` the first ``m`` parts hold one item each and the others none.

    Why the bound holds (``P`` the prefix sums, ``P[0] = 0``, ``P[m] = T``; every gap
    ``P[j+1] - P[j]`` is at most ``M``). For totals in ``[a, b]`` with ``b = a + M``, the cut
    positions reachable after ``k`` parts form the index interval ``[lo_k, hi_k]`` where ``lo_k``
    is the first position with ``P >= P[lo_{k-1}] + a`` and ``hi_k`` the last with
    ``P <= P[hi_{k-1}] + b`` (a position ``j`` in it has a reachable predecessor: the last prefix
    at or below ``P[j] - a`` is at least ``P[j] - b``, as gaps are at most ``M``; it lies in the
    previous interval, or that interval's last position is in ``[P[j] - b, P[j] - a]``). ``a*`` is the largest ``a`` for which the ``lo`` walk stays inside the
    items for all ``n`` parts (``a = 1`` does: one item per part; found by bisection, the walk is
    monotone in ``a``). Then ``P[lo_k(a*+1)] <= P[lo_{k-1}(a*+1)] + a* + M <= P[hi_k(a*)]`` by
    induction (the first prefix at or above a target exceeds it by less than one gap), and as the
    walk of ``a* + 1`` leaves the items, ``hi_n(a*)`` reaches ``m``: the last position is
    reachable, and cuts are read back from it. Among the valid cuts of each step the one nearest
    ``k * T / n`` is taken. Cost: one cumulative sum and ``O(n log T)`` binary searches.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    sizes = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if sizes.size and int(sizes.min()) <= 0:
        raise ValueError("every episode length must be > 0")
    m, n = int(sizes.size), int(num_parts)
    if m <= n:
        return list(range(m + 1)) + [m] * (n - m)
    prefix = np.concatenate(([0], np.cumsum(sizes)))
    total, longest = int(prefix[-1]), int(sizes.max())

    def lower_walk(low: int) -> list[int] | None:
        """``lo_0..lo_n`` for part totals of at least ``low``, or None when it runs past the items."""
        walk = [0]
        for _ in range(n):
            position = int(np.searchsorted(prefix, prefix[walk[-1]] + low, side="left"))
            if position > m:
                return None
            walk.append(position)
        return walk

    low, high = 1, total // n  # lower_walk(1) fits (m > n); no a above T / n can fit n parts
    while low < high:
        middle = (low + high + 1) // 2
        if lower_walk(middle) is None:
            high = middle - 1
        else:
            low = middle
    floor, ceiling = low, low + longest
    lows = lower_walk(floor)
    assert lows is not None
    highs = [0]
    for _ in range(n):
        highs.append(min(m, int(np.searchsorted(prefix, prefix[highs[-1]] + ceiling, side="right")) - 1))
    if highs[-1] != m or any(lo > hi for lo, hi in zip(lows, highs, strict=True)):
        raise AssertionError(f"contiguous split found no cut for {m} items in {n} parts")  # the proof above says never
    cuts = [m]
    for k in range(n - 1, 0, -1):
        after = int(prefix[cuts[-1]])
        first = max(lows[k], int(np.searchsorted(prefix, after - ceiling, side="left")))
        last = min(highs[k], int(np.searchsorted(prefix, after - floor, side="right")) - 1)
        cuts.append(_nearest_cut(prefix, first, last, k * total, n))
    cuts.append(0)
    return cuts[::-1]


def _nearest_cut(prefix: np.ndarray, first: int, last: int, scaled_target: int, parts: int) -> int:
    """The position in ``[first, last]`` whose prefix is nearest ``scaled_target / parts`` (the lower one on a tie)."""
    at_or_above = -(-scaled_target // parts)  # an integer target: a float one would convert all of ``prefix``
    position = min(max(int(np.searchsorted(prefix, at_or_above, side="left")), first), last)
    candidates = {position, max(first, position - 1)}
    return min(candidates, key=lambda j: (abs(int(prefix[j]) * parts - scaled_target), j))


def contiguous_balanced_split(lengths: Sequence[int] | np.ndarray, num_parts: int) -> list[list[int]]:
    """Positions ``0..len(lengths)-1`` cut into ``num_parts`` contiguous runs (see :func:`contiguous_cuts`)."""
    cuts = contiguous_cuts(lengths, num_parts)
    return [list(range(start, stop)) for start, stop in zip(cuts[:-1], cuts[1:], strict=True)]


def _rank_positions(episodes: Sequence[int], lengths: Sequence[int], rank: int, world_size: int, seed: int) -> list[int]:
    """Positions in ``episodes`` of the episodes rank ``rank`` owns (sorted); raises when a rank would own none."""
    _check_topology("rank", rank, "world_size", world_size)
    if len(episodes) < world_size:
        raise ConfigError(
            f"no rank has data: {len(episodes)} selected episode(s) for {world_size} ranks leaves "
            f"{world_size - len(episodes)} rank(s) without an episode (episodes are never split across ranks); "
            f"use at most {len(episodes)} rank(s) or select more episodes"
        )
    return frame_balanced_assignment(lengths, world_size, seed)[rank]


def rank_episodes(episodes: Sequence[int], lengths: Sequence[int], rank: int, world_size: int, seed: int) -> list[int]:
    """The episodes distributed rank ``rank`` owns; raises when a rank would own none."""
    return [int(episodes[i]) for i in _rank_positions(episodes, lengths, rank, world_size, seed)]


def scattered_worker_parts(owned_lengths: Sequence[int], num_workers: int, rank: int, seed: int) -> list[list[int]]:
    """The :data:`SCATTERED_SPLIT` of rank ``rank``: positions in its owned episodes (in the rank
    split's order) per worker, longest first to the lightest worker. Exactly the worker split of
    the versions before the contiguous one; their checkpoints replay it."""
    worker_seed = seed_entropy(seed) ^ (rank * 0x9E3779B1) ^ _WORKER_SPLIT_STREAM
    return frame_balanced_assignment(owned_lengths, num_workers, worker_seed)


def check_worker_split(worker_split: str) -> str:
    """``worker_split`` when it is one of :data:`WORKER_SPLITS`, else a :class:`ConfigError` naming them."""
    if worker_split not in WORKER_SPLITS:
        raise ConfigError(
            f"cannot resume: the checkpoint records the worker split {worker_split!r}, which this version does not "
            f"know (it knows {', '.join(WORKER_SPLITS)}); resume it with the version that wrote it"
        )
    return worker_split


def worker_episodes(
    episodes: Sequence[int],
    lengths: Sequence[int],
    rank: int,
    world_size: int,
    worker_id: int,
    num_workers: int,
    seed: int | None,
    worker_split: str = CONTIGUOUS_SPLIT,
    excluded: Collection[int] = (),
) -> list[int]:
    """The episodes DataLoader worker ``worker_id`` of rank ``rank`` reads, sorted.

    ``episodes`` are the selected episode indices and ``lengths`` their frame counts
    (aligned). ``num_workers=0`` means the training process reads alone (one part).
    ``excluded``: episodes of this rank left out after the rank split (see :func:`rank_worker_split`).
    """
    _check_topology("worker_id", worker_id, "num_workers", max(1, num_workers))
    return rank_worker_split(episodes, lengths, rank, world_size, num_workers, seed, worker_split, excluded)[worker_id]


def rank_worker_split(
    episodes: Sequence[int],
    lengths: Sequence[int],
    rank: int,
    world_size: int,
    num_workers: int,
    seed: int | None,
    worker_split: str = CONTIGUOUS_SPLIT,
    excluded: Collection[int] = (),
) -> list[list[int]]:
    """The episodes of every DataLoader worker of rank ``rank`` (``worker_episodes`` of each, in one split).

    :data:`CONTIGUOUS_SPLIT`: the rank's episodes sorted by index and cut into runs of consecutive
    episodes whose frame totals differ by at most one episode length (:func:`contiguous_cuts`),
    so two workers of a rank share a data row group only at a cut. :data:`SCATTERED_SPLIT`: the
    split of the versions before it (:func:`scattered_worker_parts`), for their checkpoints.
    Either way every owned episode is in exactly one worker's list and each list is sorted.

    ``excluded`` (the rank's bad episodes, ``streaming_bad_episodes=skip``) are removed after the
    rank split and before the worker split: the other ranks' episodes never change, and the
    workers split what remains.
    """
    seed = resolve_seed(seed)
    check_worker_split(worker_split)
    if len(episodes) != len(lengths):
        raise ValueError(f"{len(episodes)} episodes but {len(lengths)} lengths")
    num_workers = max(1, num_workers)
    positions = np.asarray(_rank_positions(episodes, lengths, rank, world_size, seed), dtype=np.int64)
    owned = np.asarray(episodes, dtype=np.int64)[positions]
    owned_lengths = np.asarray(lengths, dtype=np.int64)[positions]
    if len(excluded):
        kept = ~np.isin(owned, np.fromiter((int(e) for e in excluded), dtype=np.int64))
        owned, owned_lengths = owned[kept], owned_lengths[kept]
    if len(owned) < num_workers:
        raise ConfigError(
            f"rank {rank} owns {len(owned)} episode(s) but has {num_workers} DataLoader workers; a worker needs at "
            f"least one whole episode: use --num_workers={len(owned)} or fewer (or fewer ranks)"
        )
    if worker_split == SCATTERED_SPLIT:
        parts = scattered_worker_parts(owned_lengths.tolist(), num_workers, rank, seed)
        return [sorted(int(owned[i]) for i in part) for part in parts]
    by_index = np.argsort(owned, kind="stable")
    cuts = contiguous_cuts(owned_lengths[by_index], num_workers)
    ordered = owned[by_index].tolist()
    return [ordered[start:stop] for start, stop in zip(cuts[:-1], cuts[1:], strict=True)]


def max_workers_for_rank(
    episodes: Sequence[int],
    lengths: Sequence[int],
    rank: int,
    world_size: int,
    seed: int | None,
    excluded: Collection[int] = (),
) -> int:
    """How many DataLoader workers rank ``rank`` can feed (one whole episode each at least), without
    its ``excluded`` episodes."""
    owned = rank_episodes(episodes, lengths, rank, world_size, resolve_seed(seed))
    if not len(excluded):
        return len(owned)
    return int((~np.isin(np.asarray(owned, dtype=np.int64), np.fromiter(excluded, dtype=np.int64))).sum())


def _check_topology(index_name: str, index: int, count_name: str, count: int) -> None:
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"{index_name}={index} is not in [0, {count_name}={count})")


class RankWorkerSharder(BaseNode[int]):
    """Source node: the episodes of one (rank, worker), in a seeded order per epoch.

    Guarantees: over one epoch it yields each of the worker's episodes exactly once; the
    order is a permutation drawn from (seed, epoch, rank, worker) only; the workers of all
    ranks together yield every selected episode exactly once per epoch. ``reset(None)`` after
    an iteration that started (a ``next()`` or :meth:`mark_started`, also before a saved
    state) moves to the next epoch, like ``SamplerWrapper``. The state is ``{epoch, cursor,
    started}`` plus the topology, which is validated on restore. ``assigned`` replaces the
    worker's own split by an explicit episode list (the remnant of an elastic resume);
    ``worker_split`` names the split otherwise (:data:`WORKER_SPLITS`, see :func:`rank_worker_split`),
    ``excluded`` the rank's episodes left out of it (``streaming_bad_episodes=skip``).
    """

    EPOCH_KEY = "epoch"
    CURSOR_KEY = "cursor"
    STARTED_KEY = "started"
    TOPOLOGY_KEY = "topology"

    def __init__(
        self,
        episodes: Sequence[int],
        lengths: Sequence[int],
        *,
        rank: int = 0,
        world_size: int = 1,
        worker_id: int = 0,
        num_workers: int = 1,
        seed: int | None = None,
        initial_epoch: int = 0,
        shuffle: bool = True,
        assigned: Sequence[int] | None = None,
        worker_split: str = CONTIGUOUS_SPLIT,
        excluded: Collection[int] = (),
    ) -> None:
        super().__init__()
        self.seed = resolve_seed(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.worker_id = int(worker_id)
        self.num_workers = max(1, int(num_workers))
        self.shuffle = shuffle
        if assigned is None:
            self.episodes = worker_episodes(
                episodes, lengths, self.rank, self.world_size, self.worker_id, self.num_workers, self.seed, worker_split,
                excluded,
            )
        else:
            # An elastic resume's remnant: episodes split by ``resume.assign_remnant`` (may be none).
            self.episodes = sorted(int(e) for e in assigned)
        length_of = dict(zip((int(e) for e in episodes), (int(n) for n in lengths), strict=True))
        self._lengths = {e: length_of[e] for e in self.episodes}
        self.epoch = int(initial_epoch)
        self._cursor = 0
        self._started = False
        self._order: list[int] = []

    def clone(self, initial_epoch: int | None = None) -> RankWorkerSharder:
        """A fresh sharder of the same episodes, topology and seed (not yet reset)."""
        twin = copy.copy(self)  # shares the episode list and lengths, which never change
        BaseNode.__init__(twin)
        twin.epoch = self.epoch if initial_epoch is None else int(initial_epoch)
        twin._cursor, twin._started, twin._order = 0, False, []
        return twin

    # -- what the pool sampler reads ------------------------------------------------------
    @property
    def num_frames(self) -> int:
        """Frames of this worker's episodes: the length of one coverage epoch."""
        return sum(self._lengths.values())

    def episode_length(self, episode: int) -> int:
        return self._lengths[episode]

    @property
    def order(self) -> list[int]:
        """This epoch's episodes in the order they are yielded."""
        return self._order

    @property
    def cursor(self) -> int:
        """How many episodes of :attr:`order` were yielded."""
        return self._cursor

    def peek(self, count: int) -> list[int]:
        """The next ``count`` episodes this epoch will yield, without consuming them."""
        return self._order[self._cursor : self._cursor + max(0, count)]

    def frame_epoch(self, episode: int) -> int:
        """The epoch whose frame order ``episode`` follows: this epoch (every episode is read once per epoch)."""
        return self.epoch

    def epoch_order(self, epoch: int) -> list[int]:
        """The admission order of ``epoch``: a pure function of (seed, epoch, rank, worker)."""
        if not self.shuffle:
            return list(self.episodes)
        sequence = np.random.SeedSequence(
            [seed_entropy(self.seed), int(epoch), self.rank, self.worker_id, _EPOCH_ORDER_STREAM]
        )
        permutation = np.random.default_rng(sequence).permutation(len(self.episodes))
        return [self.episodes[int(i)] for i in permutation]

    # -- BaseNode -------------------------------------------------------------------------
    def _topology(self) -> list[int]:
        return [self.rank, self.world_size, self.worker_id, self.num_workers, len(self.episodes)]

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is not None:
            saved = list(initial_state[self.TOPOLOGY_KEY])
            if saved != self._topology():
                raise ConfigError(
                    "cannot resume: the checkpoint was taken with rank/world_size/worker/num_workers/episodes "
                    f"{saved}, this reader has {self._topology()}; resume with the same world size, "
                    "--num_workers and episode selection"
                )
            self.epoch = int(initial_state[self.EPOCH_KEY])
            self._cursor = int(initial_state[self.CURSOR_KEY])
            self._started = bool(initial_state[self.STARTED_KEY])
        else:
            if self._started:
                self.epoch += 1
            self._cursor = 0
            self._started = False
        self._order = self.epoch_order(self.epoch)

    def mark_started(self) -> None:
        """Record that this epoch's iteration began (a consumer pulled from the pool)."""
        self._started = True

    def next(self) -> int:
        self._started = True
        if self._cursor >= len(self._order):
            raise StopIteration
        episode = self._order[self._cursor]
        self._cursor += 1
        return episode

    def get_state(self) -> dict[str, Any]:
        return {
            self.EPOCH_KEY: self.epoch,
            self.CURSOR_KEY: self._cursor,
            self.STARTED_KEY: self._started,
            self.TOPOLOGY_KEY: self._topology(),
        }
