"""The logical schedule of one worker: which (episode, anchor frame) comes next.

:class:`EpisodePoolSampler` keeps a pool of resident episodes, admitted in the sharder's
order, and draws anchor frames from it. Each episode's frames are visited in a permutation
drawn from (seed, epoch, episode), so every frame of every episode is yielded exactly once
per epoch. Nothing here does I/O or looks at time: the schedule is a pure function of the
seed, the epoch, the topology, the pool limits and the episodes' byte costs.

Within an episode, anchors come in runs one key frame decodes forward (GOP runs). Several runs of
an episode are open at once (``open_runs``, derived from the settings by
``streaming_graph.open_anchor_runs``) and the episode's anchors take one frame of each in turn,
so the draws of one episode that share a batch are far apart instead of neighbouring frames
(issue 24), while each run is still decoded forward, by its own clip decoder. An episode with fewer
runs than the anchors a batch takes of it reads each run in strands (:class:`RunStrands`), so the
anchors one run gives a batch are several frames apart too; its decoders keep the frames they pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from ..arrays import sorted_union, sorted_unique
from ..config import SAMPLING_STRATEGIES, resolve_seed
from ..errors import ConfigError
from ..fetch.byte_cache import ByteBudget
from .sharder import RankWorkerSharder, seed_entropy
from .weighted_sharder import WeightedMixtureSharder

_CHOICE_STREAM = 0x43484F53
_FRAME_STREAM = 0x4652414D
_SKIP_BLOCK = 256
"""Picks :meth:`EpisodePoolSampler.fast_forward` draws per generator call at most."""


@dataclass(frozen=True)
class ScheduleItem:
    """One anchor of the schedule: frame ``frame`` (episode-relative) of ``episode``.

    ``seq`` is the item's position in this worker's epoch; ``last_of_episode`` marks the
    episode's final anchor this epoch (after it, the episode's bytes may be released).
    """

    episode: int
    frame: int
    seq: int
    epoch: int
    last_of_episode: bool
    reach: int = 0
    """Frames the decoders of the anchor's run read ahead of its next anchor (stranded runs, see
    :class:`RunStrands`): they keep that many frames more, in the order decoded."""


ANCHOR_BLOCK = 2
"""Frames anchored together: LeRobot encodes with a key frame every 2 frames (``g=2``)."""


def interleave_runs(runs: Sequence[np.ndarray], open_runs: int) -> np.ndarray:
    """The frames of ``runs`` with ``open_runs`` of them open at a time, one frame of each in turn.

    Slot ``i`` holds an open run; the order takes the next frame of slot 0, of slot 1, ... and
    again from slot 0; when a run ends, the next unopened run (in ``runs`` order) takes its slot,
    and once none is left the slot closes. Each run's frames stay in their order (ascending, or its
    strands, :func:`strand_run`: its clip decoder decodes forward), and ``open_runs = 1`` is the runs
    one after the other.
    """
    runs = [run for run in runs if len(run)]
    if open_runs <= 1 or len(runs) <= 1:
        return np.concatenate(runs).astype(np.int64, copy=False) if runs else np.zeros(0, dtype=np.int64)
    slots: list[tuple[np.ndarray, int]] = [(run, 0) for run in runs[:open_runs]]
    upcoming = open_runs
    out: list[int] = []
    while slots:
        survivors: list[tuple[np.ndarray, int]] = []
        for run, position in slots:
            out.append(int(run[position]))
            if position + 1 < len(run):
                survivors.append((run, position + 1))
            elif upcoming < len(runs):
                survivors.append((runs[upcoming], 0))
                upcoming += 1
        slots = survivors
    return np.asarray(out, dtype=np.int64)


STRAND_STRIDE = 7
"""Frames between the strands of a stranded run (:func:`strand_run`): neighbouring anchors of the run
are at least ``STRAND_STRIDE - 1`` = 6 frames apart, more than the 5 frames within which the batch-mixing
figures count a same-episode pair as near (``batch_mixing.NEAR_FRAMES``)."""


@dataclass(frozen=True)
class RunStrands:
    """How an episode with fewer GOP runs than a batch draws from it reads each run: in ``ways`` strands.

    ``draws`` is how many anchors of one episode a batch takes (the batch over the resident episodes),
    spread over the episode's open runs; a run that gives a batch more than one is read in that many
    strands (:func:`strand_run`), so its anchors in one batch are ``STRAND_STRIDE`` frames apart instead
    of neighbours. A stranded run's decoder keeps the frames it decoded ahead of the run's next anchor
    (:meth:`reach`) on top of its ``kept`` frames; the ways are cut until the episode's runs keep at most
    ``frames_per_episode`` (the rank's decoded-frame budget over its resident episodes). A pure function
    of the settings and ``meta/info.json``, as the open runs are.
    """

    draws: int
    kept: int
    frames_per_episode: int
    stride: int = STRAND_STRIDE

    def ways(self, open_runs: int, run_length: int) -> int:
        """Strands of a run of ``run_length`` frames when ``open_runs`` runs of its episode are open."""
        ways = min(-(-self.draws // max(1, open_runs)), run_length // self.stride)
        while ways > 1 and open_runs * (self.kept + strand_reach(run_length, ways, self.stride)) > self.frames_per_episode:
            ways -= 1
        return max(1, ways)

    def reach(self, length: int, run_starts: Sequence[int] | np.ndarray, open_runs: int) -> int:
        """Frames the decoders of an episode of ``length`` frames (runs from ``run_starts``, ``open_runs``
        open at once) read ahead of a run's next anchor at most: the largest :func:`strand_reach` of its runs."""
        lengths = np.diff(run_bounds(int(length), run_starts)).tolist()
        opened = min(max(1, open_runs), len(lengths))
        return max((strand_reach(n, self.ways(opened, n), self.stride) for n in lengths if n), default=0)

    def name(self) -> str:
        """The strands in a schedule's saved settings (a resume must read runs the same way)."""
        return f"strands-{self.draws}-{self.kept}-{self.frames_per_episode}-{self.stride}"


def _strand_blocks(length: int, ways: int, stride: int) -> list[tuple[int, list[int]]]:
    """``(block start, strand lengths)`` of a run of ``length`` frames in ``ways`` strands: blocks of at
    least ``ways * stride`` frames, each split into ``ways`` consecutive strands of at least ``stride``.

    Odd blocks (taken last strand first) have strands of one length; even blocks (first strand first)
    take the rest of the run, their first strands one frame longer where it does not divide. So a
    strand's frames are always ``ways`` anchors apart, and the last anchor of a block is never a
    neighbour of the next block's first.
    """
    blocks = length // (ways * stride)
    odd = blocks // 2
    strand = length // blocks // ways
    even_total = length - odd * ways * strand
    evens = blocks - odd
    out, start = [], 0
    for b in range(blocks):
        if b % 2:
            lengths = [strand] * ways
        else:
            e = b // 2
            size = even_total // evens + (1 if e < even_total % evens else 0)
            lengths = [size // ways + (1 if j < size % ways else 0) for j in range(ways)]
        out.append((start, lengths))
        start += sum(lengths)
    return out


def strand_reach(length: int, ways: int, stride: int = STRAND_STRIDE) -> int:
    """How far ahead of a stranded run's lowest undelivered frame its decoder reads (frames): the first
    anchor of a block is its first or last strand's start, the other strands' frames below it wait."""
    if ways <= 1 or length < ways * stride:
        return 0
    return max(sum(lengths[:-1]) for _, lengths in _strand_blocks(length, ways, stride))


def strand_run(run: np.ndarray, ways: int, stride: int = STRAND_STRIDE) -> np.ndarray:
    """The frames of ``run`` (consecutive, ascending) read in ``ways`` strands.

    The run is cut in blocks of at least ``ways * stride`` frames, each block in ``ways`` consecutive
    strands; a block yields the first frame of each strand, then the second of each, and so on, its
    strands taken first to last in even blocks and last to first in odd ones. Guarantee: any ``ways``
    consecutive frames of the result are pairwise at least ``stride - 1`` frames apart, and the decoder
    reading it forward keeps at most :func:`strand_reach` frames it decoded ahead. ``ways`` 1, or a run
    shorter than ``ways * stride``, is the run as it is.
    """
    if ways <= 1 or len(run) < ways * stride:
        return run
    first = int(run[0])
    out: list[int] = []
    for b, (start, lengths) in enumerate(_strand_blocks(len(run), ways, stride)):
        starts = np.cumsum([0, *lengths[:-1]]) + start
        strands = list(range(ways)) if b % 2 == 0 else list(range(ways - 1, -1, -1))
        for i in range(max(lengths)):
            out.extend(first + int(starts[j]) + i for j in strands if i < lengths[j])
    return np.asarray(out, dtype=np.int64)


def frame_order(
    seed: int,
    epoch: int,
    episode: int,
    length: int,
    block: int = ANCHOR_BLOCK,
    run_starts: Sequence[int] | np.ndarray | None = None,
    open_runs: int = 1,
    strands: RunStrands | None = None,
) -> np.ndarray:
    """The order in which the frames of ``episode`` are anchored in ``epoch``.

    A permutation of runs of consecutive frames, each run in ascending order. Runs start at
    ``run_starts`` (ascending episode frames; 0 is implied, values outside ``(0, length)`` are
    ignored), by default every ``block`` frames. The episode's next anchor is its run's next
    frame, so the clip decoder only decodes forward within a run: with runs that are GOPs (see
    :func:`gop_run_starts`) about one decoded frame per delivered frame at any GOP size. Anchors
    of one episode are still interleaved with the other episodes of the pool, so batches stay
    as mixed. Runs of ``block`` frames and ``run_starts = 0, block, 2 block, ...`` give the same
    order (the same draw).

    ``open_runs`` > 1 (GOP runs only): that many runs are open at once and the episode's anchors
    take one frame of each in turn (:func:`interleave_runs`), so the anchors of one episode that
    land in one batch come from different runs, far apart, while each run is still decoded
    forward by its own clip decoder. The runs and their order are the same draw as with one.

    ``strands`` (GOP runs only): each run is read in :meth:`RunStrands.ways` strands
    (:func:`strand_run`) instead of ascending, when the episode's open runs are fewer than the anchors
    a batch takes of it; :meth:`RunStrands.reach` says how far its decoders then read ahead.
    """
    sequence = np.random.SeedSequence([seed_entropy(seed), int(epoch), int(episode), _FRAME_STREAM])
    length = int(length)
    if run_starts is None:
        blocks = np.random.default_rng(sequence).permutation(-(-length // block))
        order = (blocks[:, None] * block + np.arange(block)[None, :]).reshape(-1)
        return order[order < length]
    bounds = run_bounds(length, run_starts)
    runs = np.random.default_rng(sequence).permutation(len(bounds) - 1)
    if len(runs) == 0 or length == 0:
        return np.arange(0, dtype=np.int64)
    frames = [np.arange(bounds[r], bounds[r + 1], dtype=np.int64) for r in runs]
    if strands is not None:
        opened = min(max(1, open_runs), len(frames))
        frames = [strand_run(run, strands.ways(opened, len(run)), strands.stride) for run in frames]
    return interleave_runs(frames, open_runs)


def run_bounds(length: int, run_starts: Sequence[int] | np.ndarray) -> np.ndarray:
    """Where the runs of an episode of ``length`` frames begin, then ``length``: 0, the ``run_starts``
    inside ``(0, length)`` (ascending, once each), ``length``."""
    starts = sorted_unique(np.asarray(run_starts, dtype=np.int64))
    return np.concatenate(([0], starts[(starts > 0) & (starts < length)], [length])).astype(np.int64)


GOP_SKEW_FRAMES = 3
"""Frames a run may start after the GOP start of a camera whose GOPs are not aligned with the
others' (x264 scene-cut key frames shift one camera's GOPs by a frame or two): the camera then
decodes those few frames again, instead of most of a GOP at a start that is mid-GOP for it."""


def gop_run_starts(
    gop_starts: Sequence[Sequence[int] | np.ndarray], lookback: int, max_skew: int = GOP_SKEW_FRAMES
) -> np.ndarray:
    """Run starts for :func:`frame_order` from each camera's GOP starts (episode frames).

    A run's first anchor makes every camera's decoder restart at that camera's last GOP start
    at or before it, and decode from there (the rest of a run, and frames past a GOP end, are
    decoded forward). A GOP start of any camera is a run start only when it is at most
    ``max_skew`` frames after the last GOP start of every camera: with cameras whose GOPs are
    aligned, every GOP start; where one camera's GOPs are shifted (scene-cut key frames), the
    later of nearly coincident starts, and none that is mid-GOP for a camera (each such start
    cost that camera up to a GOP of frames decoded and not delivered). Each start is shifted by
    ``lookback``, the frames of history a camera window reads before its anchor: the first
    anchor of a run then reads its window from the GOPs it starts, and the run's last anchors
    read into the next GOP by decoding forward, never back.
    """
    cameras = [sorted_unique(np.asarray(s, dtype=np.int64)) for s in gop_starts]
    merged = sorted_unique(np.concatenate(cameras or [np.zeros(0, np.int64)]))
    merged = merged[merged > 0]
    keep = np.ones(len(merged), dtype=bool)
    for starts in cameras:
        starts = sorted_union(starts, [0])
        last = starts[np.searchsorted(starts, merged, side="right") - 1]
        keep &= merged - last <= max(0, int(max_skew))
    return merged[keep] + max(0, int(lookback))


class EpisodePoolSampler(BaseNode[ScheduleItem]):
    """Exact-coverage episode pool over the episodes of a :class:`RankWorkerSharder`.

    Admission: episodes join the pool in the sharder's order while the pool has fewer than
    ``pool_size`` episodes and ``budget`` admits the episode's byte cost next to the resident
    ones (the same rule the byte cache applies to fetches, so every pool fits in memory).

    Strategies:
      * ``remaining``: the next episode is drawn with weight = its remaining unvisited frames;
      * ``round_robin``: each round shuffles the resident episodes and takes one frame of each;
        episodes admitted during a round join the next round.

    Within an episode, anchors follow :func:`frame_order`: runs from ``run_starts(episode)``
    (e.g. GOP-aligned runs, see :func:`gop_run_starts`), else runs of two frames. ``runs``
    names the run rule in the saved settings, so a checkpoint is resumed with the same rule;
    ``open_runs`` (GOP runs only) interleaves that many runs of an episode (:func:`interleave_runs`),
    and ``strands`` reads an episode's runs in strands when they are fewer than a batch takes of it
    (:class:`RunStrands`; each item says how far its run's decoders read ahead, ``ScheduleItem.reach``);
    both are saved with the rule.

    Guarantees: each of the worker's frames exactly once per epoch; the same (seed, epoch,
    rank, worker, strategy, pool_size, run rule, costs, run starts) give the same schedule; ``reset(state)`` with a
    state from ``state_dict()`` continues with exactly the items that followed it. The state
    is small: the sharder cursor, ``[episode, frames taken]`` per resident episode, the current
    round and the generator state.

    ``carried`` (elastic resume) maps an episode partly delivered under another topology to
    ``(frames taken, epoch of its frame order)``: it joins the pool with those frames already
    taken and continues its own frame order, so it yields only its undelivered frames. A weighted
    mixture's source visits an episode again in later epochs, so there the source says which visit
    is carried (``WeightedMixtureSharder.carried_visit``) and ``carried`` is not used.
    """

    SOURCE_KEY = "source"
    NUM_YIELDED_KEY = "num_yielded"
    POOL_KEY = "pool"
    ROUND_KEY = "round"
    RNG_KEY = "rng"
    SETTINGS_KEY = "settings"

    def __init__(
        self,
        source: RankWorkerSharder | WeightedMixtureSharder,
        *,
        pool_size: int,
        strategy: str = "remaining",
        seed: int | None = None,
        episode_cost: Callable[[int], int] | None = None,
        budget: ByteBudget | None = None,
        carried: Mapping[int, tuple[int, int]] | None = None,
        run_starts: Callable[[int], Sequence[int] | np.ndarray] | None = None,
        runs: str = "pairs",
        open_runs: int = 1,
        strands: RunStrands | None = None,
    ) -> None:
        super().__init__()
        if pool_size < 1:
            raise ConfigError(f"--dataset.streaming_episode_pool_size must be >= 1, got {pool_size}")
        if strategy not in SAMPLING_STRATEGIES:
            raise ConfigError(
                f"--dataset.streaming_sampling_strategy must be one of {', '.join(SAMPLING_STRATEGIES)}, got {strategy!r}"
            )
        self.source = source
        # A weighted mixture's source yields an episode again in its dataset's next epoch.
        self._repeats = bool(getattr(source, "REPEATS_EPISODES", False))
        self.pool_size = int(pool_size)
        self.strategy = strategy
        self.seed = resolve_seed(seed)
        self.episode_cost = episode_cost
        self.budget = budget or ByteBudget.unlimited()
        self.carried = {int(e): (int(taken), int(epoch)) for e, (taken, epoch) in (carried or {}).items()}
        self.run_starts = run_starts
        self.runs = runs
        self.open_runs = max(1, int(open_runs)) if run_starts is not None else 1
        self.strands = strands if run_starts is not None else None
        self.epoch = 0
        self._pool: list[list[int]] = []  # [episode, frames taken], admission order
        self._left: list[int] = []  # frames not yet taken of each pool entry, in the pool's order
        self._round: list[int] = []
        self._orders: dict[int, np.ndarray] = {}
        self._reaches: dict[int, int] = {}
        self._costs: dict[int, int] = {}
        self._rng = np.random.default_rng(0)
        self._num_yielded = 0

    def clone(self, source: RankWorkerSharder | WeightedMixtureSharder) -> EpisodePoolSampler:
        """A fresh sampler with the same settings over ``source`` (not yet reset)."""
        return EpisodePoolSampler(
            source,
            pool_size=self.pool_size,
            strategy=self.strategy,
            seed=self.seed,
            episode_cost=self.episode_cost,
            budget=self.budget,
            carried=self.carried,
            run_starts=self.run_starts,
            runs=self.runs,
            open_runs=self.open_runs,
            strands=self.strands,
        )

    def state_after(self, num_items: int, epoch: int) -> dict[str, Any]:
        """The state this sampler has after ``num_items`` items of ``epoch``, computed on a clone.

        Pure schedule logic (episode costs aside): nothing is fetched or decoded, and this
        sampler is left untouched. Raises ``ValueError`` past the end of the epoch.
        """
        clone = self.clone(self.source.clone(initial_epoch=epoch))
        clone.reset(None)
        try:
            clone.fast_forward(num_items)
        except StopIteration:
            raise ValueError(
                f"cannot skip {num_items} samples: epoch {epoch} of this worker has {clone._num_yielded}"
            ) from None
        return clone.state_dict()

    def fast_forward(self, num_items: int) -> None:
        """Advance ``num_items`` items without building them (resume replay; raises ``StopIteration`` at the end).

        The state afterwards equals that after ``num_items`` calls of :meth:`next` (checked by
        tests/nodes/test_pool_sampler_fast_forward.py): same admissions, picks and generator
        draws, but no frame orders or items. ``remaining`` draws the picks up to the next
        possible episode end in one generator call, which yields the same numbers as one call
        per pick.
        """
        left = int(num_items)
        while left > 0:
            self.source.mark_started()
            self._admit()
            if not self._pool:
                raise StopIteration
            left -= self._skip_remaining(left) if self.strategy == "remaining" else self._skip_round_robin(left)

    def _skip_remaining(self, limit: int) -> int:
        """Up to ``limit`` picks of ``remaining``; returns how many were made.

        Until an episode ends and another is admitted, the pick totals only decrease by one, so
        a block of picks is drawn in one generator call. When an admission changes the totals
        mid-block, the generator is rewound and only the picks made are drawn again: the
        numbers, and the state, are those of one call per pick.
        """
        remaining = list(self._left)
        total = sum(remaining)
        block = min(limit, total, _SKIP_BLOCK)
        saved = self._rng.bit_generator.state
        for done, draw in enumerate(self._rng.integers(np.arange(total, total - block, -1)).tolist(), start=1):
            slot = 0
            while draw >= remaining[slot]:
                draw -= remaining[slot]
                slot += 1
            remaining[slot] -= 1
            self._take(slot)
            if remaining[slot] == 0:
                del remaining[slot]
                if done < block:
                    held = len(self._pool)
                    self._admit()  # what the next pick's next() does first
                    if len(self._pool) != held:
                        self._rng.bit_generator.state = saved
                        self._rng.integers(np.arange(total, total - done, -1))
                        return done
        return block

    def _skip_round_robin(self, limit: int) -> int:
        """Up to ``limit`` picks of ``round_robin``: the rest of the current round (a new one is drawn by
        :meth:`_pick_round_robin`), stopping after an episode ends (admission may follow)."""
        if not self._round:
            self._take(self._pick_round_robin())
            return 1
        pool, round_, length = self._pool, self._round, self.source.episode_length
        slots = {episode: slot for slot, (episode, _) in enumerate(pool)}
        done = 0
        # The bookkeeping of _take, inlined: this loop is most of a long replay.
        while done < len(round_) and done < limit:
            episode = round_[done]
            slot = slots[episode]
            entry = pool[slot]
            entry[1] += 1
            self._left[slot] -= 1
            done += 1
            if entry[1] == length(episode):
                del pool[slot]
                del self._left[slot]
                self._orders.pop(episode, None)
                self._reaches.pop(episode, None)
                break
        del round_[:done]
        self._num_yielded += done
        return done

    def _take(self, slot: int) -> None:
        """Count one frame of the episode in ``slot`` as taken (the bookkeeping of :meth:`next`)."""
        episode, taken = self._pool[slot]
        self._pool[slot][1] = taken + 1
        self._left[slot] -= 1
        if taken + 1 == self.source.episode_length(episode):
            del self._pool[slot]
            del self._left[slot]
            self._orders.pop(episode, None)
            self._reaches.pop(episode, None)
        self._num_yielded += 1

    # -- what the prefetcher reads ----------------------------------------------------------
    def resident_episodes(self) -> list[int]:
        """Episodes in the pool now, in admission order."""
        return [episode for episode, _ in self._pool]

    def admission_order(self) -> Sequence[int]:
        """Every episode of this epoch in the order the pool admits them."""
        return self.source.order

    def admitted_count(self) -> int:
        """How many episodes of :meth:`admission_order` were admitted so far."""
        return self.source.cursor

    def cost(self, episode: int) -> int:
        """Byte cost of ``episode`` (0 without a cost function), checked against the rank budget."""
        cached = self._costs.get(episode)
        if cached is None:
            cached = int(self.episode_cost(episode)) if self.episode_cost is not None else 0
            self.budget.check_episode(episode, cached)
            self._costs[episode] = cached
        return cached

    # -- BaseNode -------------------------------------------------------------------------
    def _settings(self) -> list[Any]:
        # Two-frame runs are the rule of checkpoints written before the rule was saved.
        base: list[Any] = [self.strategy, self.pool_size, self.seed]
        if self.runs == "pairs":
            return base
        rule = self.runs if self.open_runs == 1 else f"{self.runs}-open-{self.open_runs}"
        return [*base, rule if self.strands is None else f"{rule}-{self.strands.name()}"]

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._orders.clear()
        self._reaches.clear()
        self._costs.clear()
        if initial_state is not None:
            saved = list(initial_state[self.SETTINGS_KEY])
            if saved != self._settings():
                raise ConfigError(
                    f"cannot resume: the checkpoint's schedule used strategy/pool_size/seed/anchor runs {saved}, this "
                    f"reader uses {self._settings()}; keep --dataset.streaming_sampling_strategy, the pool settings, "
                    "--seed, --dataset.streaming_gop_runs, the camera delta_timestamps and (for the open runs, '-open-N') "
                    "--dataset.streaming_decoded_frame_budget_mb when resuming (a checkpoint "
                    "without an anchor-run entry used two-frame runs: --dataset.streaming_gop_runs=false)"
                )
            self.source.reset(initial_state[self.SOURCE_KEY])
            self.epoch = self.source.epoch
            self._pool = [[int(e), int(taken)] for e, taken in initial_state[self.POOL_KEY]]
            self._left = [self.source.episode_length(e) - taken for e, taken in self._pool]
            self._round = [int(e) for e in initial_state[self.ROUND_KEY]]
            self._rng = np.random.default_rng(self._choice_seed())
            self._rng.bit_generator.state = initial_state[self.RNG_KEY]
            self._num_yielded = int(initial_state[self.NUM_YIELDED_KEY])
        else:
            self.source.reset(None)
            self.epoch = self.source.epoch
            self._pool = []
            self._left = []
            self._round = []
            self._rng = np.random.default_rng(self._choice_seed())
            self._num_yielded = 0

    def _choice_seed(self) -> np.random.SeedSequence:
        return np.random.SeedSequence(
            [seed_entropy(self.seed), self.epoch, self.source.rank, self.source.worker_id, _CHOICE_STREAM]
        )

    def next(self) -> ScheduleItem:
        self.source.mark_started()
        self._admit()
        if not self._pool:
            raise StopIteration
        slot = self._pick_remaining() if self.strategy == "remaining" else self._pick_round_robin()
        episode, taken = self._pool[slot]
        order = self._frame_order(episode)
        frame = int(order[taken])
        self._pool[slot][1] = taken + 1
        self._left[slot] -= 1
        last = taken + 1 == len(order)
        reach = self._reaches.get(episode, 0)
        if last:
            del self._pool[slot]
            del self._left[slot]
            del self._orders[episode]
            self._reaches.pop(episode, None)
        item = ScheduleItem(
            episode=episode, frame=frame, seq=self._num_yielded, epoch=self.epoch, last_of_episode=last, reach=reach
        )
        self._num_yielded += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {
            self.SOURCE_KEY: self.source.state_dict(),
            self.NUM_YIELDED_KEY: self._num_yielded,
            self.POOL_KEY: [list(slot) for slot in self._pool],
            self.ROUND_KEY: list(self._round),
            # numpy builds a fresh dict of plain ints on every read of ``state``.
            self.RNG_KEY: self._rng.bit_generator.state,
            self.SETTINGS_KEY: self._settings(),
        }

    # -- schedule logic ---------------------------------------------------------------------
    def _admit(self) -> None:
        """Fill the pool in the sharder's order, within the episode count and the byte budget."""
        while len(self._pool) < self.pool_size:
            upcoming = self.source.peek(1)
            if not upcoming:
                return
            if self._repeats and any(episode == upcoming[0] for episode, _ in self._pool):
                return  # its dataset's next epoch (a weighted mixture): admitted once its current visit ends
            held = sum(self.cost(episode) for episode, _ in self._pool)
            if not self.budget.admits(held, len(self._pool), self.cost(upcoming[0])):
                return
            episode = next(self.source)
            carried = self._carried_visit(episode)
            taken = 0 if carried is None else carried[0]
            self._pool.append([episode, taken])
            self._left.append(self.source.episode_length(episode) - taken)

    def _frame_order(self, episode: int) -> np.ndarray:
        order = self._orders.get(episode)
        if order is None:
            carried = self._carried_visit(episode)
            epoch = carried[1] if carried is not None else self.source.frame_epoch(episode)
            starts = self.run_starts(episode) if self.run_starts is not None else None
            length = self.source.episode_length(episode)
            order = self._orders[episode] = frame_order(
                self.seed, epoch, episode, length, run_starts=starts, open_runs=self.open_runs, strands=self.strands
            )
            if self.strands is not None and starts is not None:
                reach = self.strands.reach(length, starts, self.open_runs)
                if reach:
                    self._reaches[episode] = reach
        return order

    def _carried_visit(self, episode: int) -> tuple[int, int] | None:
        """``(frames taken, frame-order epoch)`` when the current visit of ``episode`` continues one begun
        under another topology (an elastic resume), else None."""
        if isinstance(self.source, WeightedMixtureSharder):
            return self.source.carried_visit(episode)
        return self.carried.get(episode)

    def _pick_remaining(self) -> int:
        left = self._left
        draw = int(self._rng.integers(sum(left)))
        for slot, count in enumerate(left):
            if draw < count:
                return slot
            draw -= count
        raise AssertionError("unreachable: the draw is below the total remaining")

    def _pick_round_robin(self) -> int:
        resident = self.resident_episodes()
        if not self._round:
            # A new round: the resident episodes (admitted before it started) in a fresh order.
            self._round = [resident[int(i)] for i in self._rng.permutation(len(resident))]
        return resident.index(self._round.pop(0))

