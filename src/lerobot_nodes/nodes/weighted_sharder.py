"""Source node of a mixture with explicit weights: the next episode's dataset by a deficit rule.

:class:`WeightedMixtureSharder` has the interface of :class:`~.sharder.RankWorkerSharder` (what
:class:`~.pool_sampler.EpisodePoolSampler` and the prefetcher read) over the episodes of several
datasets. Each dataset has its own :class:`~.sharder.RankWorkerSharder` (its own seed stream,
its own rank and worker split, its own epoch counter). The dataset of the next admitted episode
is :func:`next_dataset`: the one furthest below its share of the frames admitted so far
(``w_d * T - A_d`` largest, ties by index). A dataset whose epoch is over starts its next one,
in its own seed-derived order, while the others continue.

A *loader epoch* is endless: the stream never stops by itself (training consumes ``steps``
batches; LeRobot cycles its loader anyway). Each dataset's epochs are what coverage is counted
in: every frame of a dataset's share once per its own epoch. A new loader epoch (``reset(None)``
after an iteration started, a fresh ``iter()``) starts every dataset over from epoch 0 of that
loader epoch's seed stream, so the schedule is a pure function of (seed, loader epoch, topology,
weights) and a position is its small state: per dataset ``[epoch, cursor, frames admitted]``.

After an elastic resume (another world size or ``--num_workers``, ``lerobot_nodes.resume.planning``)
a reader starts with an :class:`ElasticLead`: per dataset, its first two epochs are the old run's
undelivered frames assigned to it (the previous epoch's visits still open, then the rest of the
current epoch), and its plain epochs of the new topology follow, weighed the same way.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from ..arrays import sorted_unique
from ..config import resolve_seed
from ..errors import ConfigError
from .sharder import CONTIGUOUS_SPLIT, RankWorkerSharder, rank_episodes, seed_entropy

_PART_SEED_STREAM = 0x57504152
_LEAD_ORDER_STREAM = 0x4C454144
LEAD_EPOCHS = 2
"""Dataset epochs an :class:`ElasticLead` holds (its tails, then its rest) before the plain ones."""
ENDLESS_FRAMES = 1 << 62
"""What :attr:`WeightedMixtureSharder.num_frames` reports: the loader epoch of a weighted mixture never ends."""
DATASET_EPOCH_STRIDE = 1 << 32
"""A dataset's epoch ``k`` of loader epoch ``e`` draws its episode and frame orders as epoch ``e * stride + k``."""
_HISTORY = 4096
"""Admitted episodes the window keeps behind the cursor at least: the prefetcher's frontier may be behind it
by the episodes one pick admits (at most a pool)."""


def normalized_weights(weights: Sequence[float], count: int, flag: str = "--dataset.streaming_weights") -> list[float]:
    """``weights`` divided by their sum; a :class:`ConfigError` naming ``flag`` unless they are ``count``
    positive finite numbers."""
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ConfigError(f"{flag} must be a list of numbers, one per dataset, got {weights!r}")
    values = list(weights)
    if len(values) != count:
        raise ConfigError(f"{flag} has {len(values)} weight(s) but the mixture has {count} dataset(s): give one per dataset")
    if any(isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0 for w in values):
        raise ConfigError(f"{flag} must hold positive finite numbers, got {values!r}")
    total = float(sum(values))
    return [float(w) / total for w in values]


def next_dataset(weights: Sequence[float], admitted: Sequence[int], total: int) -> int:
    """The dataset whose next episode is admitted: the largest deficit ``weights[d] * total - admitted[d]``,
    the lowest index on a tie.

    Guarantee (``weights`` normalised, episodes at most ``L`` frames long, every choice followed by
    one episode of the chosen dataset): after any number of choices, for every dataset
    ``-(D - 1) * L <= admitted[d] - weights[d] * total <= L``. The chosen deficit is the largest and
    the deficits sum to zero, so it is ``>= 0``: a dataset only grows from at or below its share,
    by one episode; and each deficit is the sum of the others' surpluses.
    """
    best, best_deficit = 0, -math.inf
    for d, (weight, frames) in enumerate(zip(weights, admitted, strict=True)):
        deficit = weight * total - frames
        if deficit > best_deficit:
            best, best_deficit = d, deficit
    return best


def part_seed(seed: int, dataset: int) -> int:
    """Dataset ``dataset``'s own seed, drawn from ``seed`` (its rank split, worker split and epoch orders)."""
    words = np.random.SeedSequence([seed_entropy(seed), int(dataset), _PART_SEED_STREAM]).generate_state(2, np.uint32)
    return (int(words[0]) << 31) | (int(words[1]) >> 1)


def weighted_rank_shares(
    parts: Sequence[Sequence[int]],
    lengths: Mapping[int, int],
    rank: int,
    world_size: int,
    seed: int,
    names: Sequence[str] | None = None,
) -> list[list[int]]:
    """Rank ``rank``'s share of each dataset of a weighted mixture (each dataset split over the ranks on its own)."""
    return [
        _dataset_share(
            _name(names, d), rank_episodes, list(episodes), [lengths[e] for e in episodes], rank, world_size,
            part_seed(seed, d),
        )
        for d, episodes in enumerate(parts)
    ]


def weighted_rank_episodes(
    parts: Sequence[Sequence[int]],
    lengths: Mapping[int, int],
    rank: int,
    world_size: int,
    seed: int,
    names: Sequence[str] | None = None,
) -> list[int]:
    """The episodes rank ``rank`` reads in a weighted mixture: its share of every dataset (sorted)."""
    return sorted(e for share in weighted_rank_shares(parts, lengths, rank, world_size, seed, names) for e in share)


def weighted_max_workers(
    parts: Sequence[Sequence[int]],
    lengths: Mapping[int, int],
    rank: int,
    world_size: int,
    seed: int,
    names: Sequence[str] | None = None,
) -> int:
    """Workers rank ``rank`` can feed in a weighted mixture: every worker needs an episode of every dataset,
    so the fewest episodes the rank owns of any dataset."""
    return min(len(share) for share in weighted_rank_shares(parts, lengths, rank, world_size, seed, names))


def _name(names: Sequence[str] | None, dataset: int) -> str:
    return f"dataset {dataset}" if names is None else f"dataset {dataset} ({names[dataset]})"


def _dataset_share(label: str, split: Any, *args: Any) -> Any:
    """``split(*args)``, a ConfigError saying which dataset it is about (each dataset is split on its own)."""
    try:
        return split(*args)
    except ConfigError as error:
        raise ConfigError(
            f"{label} of the weighted mixture (--dataset.streaming_weights splits every dataset over the ranks "
            f"and workers on its own): {error}"
        ) from None


@dataclass(frozen=True)
class ElasticLead:
    """What one reader reads first after an elastic resume of a weighted mixture, as episode ids of any dataset.

    ``tails``: visits of an old worker's previous dataset epoch still open at the checkpoint, ``episode ->
    (frames taken, frame-order epoch)``; each dataset's epoch 0. ``rest``: the undelivered episodes of the
    old workers' current dataset epochs, ``carried`` those partly delivered (same mapping); each dataset's
    epoch 1. An episode may be in both (its old visit's end, then its whole visit of the next epoch).
    """

    tails: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    rest: Sequence[int] = ()
    carried: Mapping[int, tuple[int, int]] = field(default_factory=dict)

    def summary(self) -> list[int]:
        """Sizes and frames taken, for the sharder's topology check on restore."""
        taken = sum(t for t, _ in self.tails.values()) + sum(t for t, _ in self.carried.values())
        return [len(self.tails), len(self.rest), len(self.carried), taken]


class _AdmissionWindow(Sequence[int]):
    """The admission order as the prefetcher reads it: absolute positions, only a window held.

    ``len()`` is the number of episodes admitted or planned so far; a slice may start anywhere
    from ``base`` (older entries were dropped: the prefetcher never reads that far behind).
    """

    def __init__(self) -> None:
        self.base = 0
        self.items: list[int] = []

    def __len__(self) -> int:
        return self.base + len(self.items)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if start < self.base and start < stop:
                raise IndexError(f"admission order before position {self.base} is no longer held (asked from {start})")
            return self.items[max(0, start - self.base) : max(0, stop - self.base) : step]
        position = index if index >= 0 else len(self) + index
        if position < self.base:
            raise IndexError(f"admission order before position {self.base} is no longer held (asked {position})")
        return self.items[position - self.base]

    def trim(self, cursor: int) -> None:
        """Drop entries more than :data:`_HISTORY` behind ``cursor`` (in steps of ``_HISTORY``, not per call)."""
        behind = cursor - self.base
        if behind > 2 * _HISTORY:
            drop = behind - _HISTORY
            del self.items[:drop]
            self.base += drop


class _Counters:
    """Where the schedule stands: per dataset its epoch, cursor in that epoch's order and frames admitted."""

    __slots__ = ("admitted", "cursors", "epochs", "total")

    def __init__(self, datasets: int) -> None:
        self.epochs = [0] * datasets
        self.cursors = [0] * datasets
        self.admitted = [0] * datasets
        self.total = 0

    def copy(self) -> _Counters:
        twin = _Counters(0)
        twin.epochs, twin.cursors, twin.admitted, twin.total = list(self.epochs), list(self.cursors), list(self.admitted), self.total
        return twin


class WeightedMixtureSharder(BaseNode[int]):
    """Source node: the episodes of one (rank, worker) of several datasets, mixed by ``weights``.

    Guarantees: every dataset's share of this worker is yielded exactly once per that dataset's
    own epoch, in an order drawn from (its seed, loader epoch, its epoch, rank, worker); the
    frames admitted per dataset stay within :func:`next_dataset`'s bound of ``weights`` at every
    point; the workers of all ranks together hold every selected episode of every dataset once
    (each dataset is split over ranks and workers on its own, so every worker needs at least one
    episode of every dataset). The stream never ends (:data:`ENDLESS_FRAMES`). The state is the
    loader epoch, the admission count, and per dataset ``[epoch, cursor, frames admitted]`` (named
    by the ``*_KEY`` constants), plus the topology and weights, validated on restore.

    ``lead`` (an elastic resume): in the loader epoch the sharder starts in, each dataset's epochs 0
    and 1 are the lead's tails and rest of that dataset (in an order drawn from the seed, the loader
    epoch, rank and worker), its plain epochs follow from epoch 2; a carried visit counts only its
    frames not yet delivered towards the dataset's share. Later loader epochs are plain.
    """

    REPEATS_EPISODES = True
    """An episode comes back (its dataset's next epoch): the pool admits it again only once its previous visit ended."""
    EPOCH_KEY = "epoch"
    CURSOR_KEY = "cursor"
    STARTED_KEY = "started"
    TOPOLOGY_KEY = "topology"
    WEIGHTS_KEY = "weights"
    DATASET_EPOCHS_KEY = "dataset_epochs"
    DATASET_CURSORS_KEY = "dataset_cursors"
    DATASET_FRAMES_KEY = "dataset_frames"

    def __init__(
        self,
        parts: Sequence[Sequence[int]],
        lengths: Mapping[int, int],
        weights: Sequence[float],
        *,
        rank: int = 0,
        world_size: int = 1,
        worker_id: int = 0,
        num_workers: int = 1,
        seed: int | None = None,
        initial_epoch: int = 0,
        shuffle: bool = True,
        worker_split: str = CONTIGUOUS_SPLIT,
        lookahead: int = 8,
        names: Sequence[str] | None = None,
        lead: ElasticLead | None = None,
    ) -> None:
        super().__init__()
        self.names = None if names is None else list(names)
        self.seed = resolve_seed(seed)
        self.weights = normalized_weights(weights, len(parts))
        self.rank, self.world_size, self.worker_id = int(rank), int(world_size), int(worker_id)
        self.num_workers = max(1, int(num_workers))
        self.shuffle = shuffle
        self.lookahead = max(1, int(lookahead))
        self.datasets = [
            self._part_sharder(d, [int(e) for e in episodes], lengths, worker_split) for d, episodes in enumerate(parts)
        ]
        self.lead = lead
        self._lead_epoch = int(initial_epoch)  # the loader epoch the lead belongs to
        visited = [set(part.episodes) for part in self.datasets]
        self._leads: list[tuple[np.ndarray, np.ndarray]] = []
        if lead is not None:
            tails = sorted_unique(np.fromiter((int(e) for e in lead.tails), dtype=np.int64))
            rest = sorted_unique(np.asarray([int(e) for e in lead.rest], dtype=np.int64))
            tails_placed, rest_placed = np.zeros(len(tails), dtype=bool), np.zeros(len(rest), dtype=bool)
            for d, episodes in enumerate(parts):  # vectorised per dataset: a lead may hold most of a large mixture
                own = np.asarray(episodes, dtype=np.int64)
                own_tails, own_rest = np.isin(tails, own), np.isin(rest, own)
                self._leads.append((tails[own_tails], rest[own_rest]))
                tails_placed |= own_tails
                rest_placed |= own_rest
                visited[d].update(tails[own_tails].tolist() + rest[own_rest].tolist())
            unknown = np.concatenate([tails[~tails_placed], rest[~rest_placed]])
            if len(unknown):
                raise ConfigError(
                    f"the elastic resume start names episode(s) {unknown[:5].tolist()} that are not selected in this "
                    "mixture; resume with the checkpoint's episode selection"
                )
        self.episodes = sorted(e for part in visited for e in part)
        self._lengths = {e: int(lengths[e]) for e in self.episodes}
        self._dataset_of = {e: d for d, part in enumerate(visited) for e in part}
        self.epoch = int(initial_epoch)
        self._started = False
        self._cursor = 0
        self._admitted = _Counters(len(self.datasets))
        self._planned = _Counters(len(self.datasets))
        self._window = _AdmissionWindow()
        self._plan: list[int] = []  # the datasets of the planned, not yet admitted, episodes
        # Per (dataset, its epoch): the admission order and each episode's position in it (by its index in
        # the dataset's sorted share): numpy, 16 bytes an episode.
        self._orders: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._sorted = [np.asarray(sorted(part), dtype=np.int64) for part in visited]

    def _part_sharder(
        self, dataset: int, episodes: list[int], lengths: Mapping[int, int], worker_split: str
    ) -> RankWorkerSharder:
        return _dataset_share(
            _name(self.names, dataset),
            lambda: RankWorkerSharder(
                episodes, [int(lengths[e]) for e in episodes], rank=self.rank, world_size=self.world_size,
                worker_id=self.worker_id, num_workers=self.num_workers, seed=part_seed(self.seed, dataset),
                shuffle=self.shuffle, worker_split=worker_split,
            ),
        )

    def clone(self, initial_epoch: int | None = None) -> WeightedMixtureSharder:
        """A fresh sharder of the same datasets, weights, topology and seed (not yet reset)."""
        twin = copy.copy(self)  # shares the per-dataset sharders and lengths, which never change
        BaseNode.__init__(twin)
        twin.epoch = self.epoch if initial_epoch is None else int(initial_epoch)
        twin._started, twin._cursor = False, 0
        twin._admitted, twin._planned = _Counters(len(self.datasets)), _Counters(len(self.datasets))
        twin._window, twin._plan, twin._orders = _AdmissionWindow(), [], {}
        return twin

    # -- what the pool sampler and the prefetcher read ---------------------------------------
    @property
    def num_frames(self) -> int:
        """:data:`ENDLESS_FRAMES`: a weighted loader epoch never ends (each dataset's epochs do)."""
        return ENDLESS_FRAMES

    def episode_length(self, episode: int) -> int:
        return self._lengths[episode]

    def frame_epoch(self, episode: int) -> int:
        """The epoch whose frame order the current visit of ``episode`` follows: its dataset's epoch
        at its latest admission (``loader epoch * DATASET_EPOCH_STRIDE + dataset epoch``)."""
        return self.epoch * DATASET_EPOCH_STRIDE + self.visit_epoch(episode)

    def visit_epoch(self, episode: int) -> int:
        """The epoch of its dataset in which ``episode`` was admitted last (0 before any admission).

        An episode is admitted again only once its visit ended, so a resident episode was admitted in
        the dataset's current epoch, or in the previous one (not yet re-admitted), or, not being in the
        reader's plain share, in a lead epoch."""
        d = self._dataset_of[episode]
        index = int(np.searchsorted(self._sorted[d], episode))
        epoch, cursor = self._admitted.epochs[d], self._admitted.cursors[d]
        candidates = [epoch, epoch - 1, *(range(LEAD_EPOCHS - 1, -1, -1) if self._lead_active else ())]
        for k in candidates:
            if 0 <= k <= epoch:
                position = int(self._order(d, k)[1][index])
                if position >= 0 and (k < epoch or position < cursor):
                    return k
        return max(0, epoch - 1) if not self._lead_active else 0

    def carried_visit(self, episode: int) -> tuple[int, int] | None:
        """``(frames taken, frame-order epoch)`` when the current visit of ``episode`` continues a visit
        the old topology of an elastic resume began (its lead's tail or carried rest), else None."""
        if not self._lead_active:
            return None
        lead = self.lead
        assert lead is not None
        k = self.visit_epoch(episode)
        if k == 0 and episode in lead.tails:
            return lead.tails[episode]
        if k == 1 and episode in lead.carried:
            return lead.carried[episode]
        return None

    def dataset_of(self, episode: int) -> int:
        """The mixture position of ``episode``'s dataset."""
        return self._dataset_of[episode]

    def dataset_order(self, dataset: int, epoch: int) -> list[int]:
        """The admission order of ``dataset``'s epoch ``epoch`` (of this loader epoch) on this reader."""
        return self._order(dataset, epoch)[0].tolist()

    def dataset_cursor(self, dataset: int) -> tuple[int, int]:
        """``(epoch, episodes of its order admitted)`` of ``dataset`` now."""
        return self._admitted.epochs[dataset], self._admitted.cursors[dataset]

    @property
    def _lead_active(self) -> bool:
        return self.lead is not None and self.epoch == self._lead_epoch

    @property
    def order(self) -> Sequence[int]:
        """The admission order by absolute position: admitted episodes, then the planned ones."""
        return self._window

    @property
    def cursor(self) -> int:
        """Episodes admitted so far in this loader epoch."""
        return self._cursor

    @property
    def dataset_epochs(self) -> list[int]:
        """Per dataset, the number of its current epoch in this loader epoch (0: its first)."""
        return list(self._admitted.epochs)

    def peek(self, count: int) -> list[int]:
        """The next ``count`` episodes, without consuming them."""
        self._plan_ahead(self._cursor + max(0, count))
        return list(self._window[self._cursor : self._cursor + max(0, count)])

    def epoch_order(self, epoch: int) -> list[int]:
        """Not defined: each dataset has its own epochs (:meth:`dataset_order`); resume planning replays
        a weighted mixture with ``resume.planning.weighted_remnant_of``."""
        raise TypeError("a weighted mixture's epochs are per dataset: use dataset_order(dataset, epoch)")

    # -- BaseNode -------------------------------------------------------------------------
    def _topology(self) -> list[int]:
        shares = [self.rank, self.world_size, self.worker_id, self.num_workers, *(len(p.episodes) for p in self.datasets)]
        return shares if self.lead is None else [*shares, *self.lead.summary()]

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        counters = _Counters(len(self.datasets))
        if initial_state is not None:
            saved = list(initial_state[self.TOPOLOGY_KEY])
            if saved != self._topology():
                raise ConfigError(
                    "cannot resume: the checkpoint was taken with rank/world_size/worker/num_workers/episodes per "
                    f"dataset {saved}, this reader has {self._topology()}; resume with the same world size, "
                    "--num_workers and episode selection"
                )
            if [float(w) for w in initial_state[self.WEIGHTS_KEY]] != self.weights:
                raise ConfigError(
                    f"cannot resume: the checkpoint's --dataset.streaming_weights were {initial_state[self.WEIGHTS_KEY]} "
                    f"(normalised), this run's are {self.weights}; resume with the same weights"
                )
            self.epoch = int(initial_state[self.EPOCH_KEY])
            self._cursor = int(initial_state[self.CURSOR_KEY])
            self._started = bool(initial_state[self.STARTED_KEY])
            counters.epochs = [int(v) for v in initial_state[self.DATASET_EPOCHS_KEY]]
            counters.cursors = [int(v) for v in initial_state[self.DATASET_CURSORS_KEY]]
            counters.admitted = [int(v) for v in initial_state[self.DATASET_FRAMES_KEY]]
            counters.total = sum(counters.admitted)
        else:
            if self._started:
                self.epoch += 1
            self._cursor = 0
            self._started = False
        self._admitted, self._planned = counters, counters.copy()
        self._window = _AdmissionWindow()
        self._window.base = self._cursor
        self._plan = []
        self._orders = {}
        self._plan_ahead(self._cursor + self.lookahead)

    def mark_started(self) -> None:
        """Record that this loader epoch's iteration began (a consumer pulled from the pool)."""
        self._started = True

    def next(self) -> int:
        self._started = True
        self._plan_ahead(self._cursor + 1 + self.lookahead)
        episode = self._window[self._cursor]
        self._advance(self._admitted, self._plan.pop(0))
        self._cursor += 1
        self._window.trim(self._cursor)
        self._prune_orders()
        return episode

    def get_state(self) -> dict[str, Any]:
        return {
            self.EPOCH_KEY: self.epoch,
            self.CURSOR_KEY: self._cursor,
            self.STARTED_KEY: self._started,
            self.TOPOLOGY_KEY: self._topology(),
            self.WEIGHTS_KEY: list(self.weights),
            self.DATASET_EPOCHS_KEY: list(self._admitted.epochs),
            self.DATASET_CURSORS_KEY: list(self._admitted.cursors),
            self.DATASET_FRAMES_KEY: list(self._admitted.admitted),
        }

    # -- the schedule -----------------------------------------------------------------------
    def _order(self, dataset: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``dataset``'s epoch ``epoch``: its admission order, and per episode of ``_sorted`` its position (-1: absent)."""
        key = (dataset, epoch)
        cached = self._orders.get(key)
        if cached is None:
            order = self._draw_order(dataset, epoch)
            positions = np.full(len(self._sorted[dataset]), -1, dtype=np.int64)
            positions[np.searchsorted(self._sorted[dataset], order)] = np.arange(len(order), dtype=np.int64)
            cached = self._orders[key] = (order, positions)
        return cached

    def _draw_order(self, dataset: int, epoch: int) -> np.ndarray:
        if self._lead_active and epoch < LEAD_EPOCHS:
            members = self._leads[dataset][epoch]
            if not self.shuffle:
                return members
            stream = [seed_entropy(part_seed(self.seed, dataset)), self.epoch, epoch, self.rank, self.worker_id]
            rng = np.random.default_rng(np.random.SeedSequence([*stream, _LEAD_ORDER_STREAM]))
            return members[rng.permutation(len(members))]
        return np.asarray(self.datasets[dataset].epoch_order(self.epoch * DATASET_EPOCH_STRIDE + epoch), dtype=np.int64)

    def _advance(self, counters: _Counters, dataset: int) -> int:
        """Take ``dataset``'s next episode in ``counters`` (its next epoch first when this one is over; a lead's
        epoch may be empty, a plain one never is)."""
        order, _ = self._order(dataset, counters.epochs[dataset])
        while counters.cursors[dataset] >= len(order):
            counters.epochs[dataset] += 1
            counters.cursors[dataset] = 0
            order, _ = self._order(dataset, counters.epochs[dataset])
        episode = int(order[counters.cursors[dataset]])
        counters.cursors[dataset] += 1
        length = self._lengths[episode] - self._taken_before(counters.epochs[dataset], episode)
        counters.admitted[dataset] += length
        counters.total += length
        return episode

    def _taken_before(self, epoch: int, episode: int) -> int:
        """Frames of this visit (``episode`` admitted in its dataset's ``epoch``) the old topology delivered."""
        if not self._lead_active or epoch >= LEAD_EPOCHS:
            return 0
        lead = self.lead
        assert lead is not None
        carried = lead.tails if epoch == 0 else lead.carried
        return carried.get(episode, (0, 0))[0]

    def _plan_ahead(self, end: int) -> None:
        """Plan admissions until the window holds ``end`` positions."""
        planned = self._planned
        while len(self._window) < end:
            dataset = next_dataset(self.weights, planned.admitted, planned.total)
            self._window.items.append(self._advance(planned, dataset))
            self._plan.append(dataset)

    def _prune_orders(self) -> None:
        if len(self._orders) > 2 * len(self.datasets):
            low = self._admitted.epochs
            for key in [k for k in self._orders if k[1] < low[k[0]] - 1]:
                del self._orders[key]
