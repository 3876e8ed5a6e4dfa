"""Resume planning, as pure functions: where each reader starts after a checkpoint.

A *loader state* (``StatefulDataLoader.state_dict()``) holds every node's position and resumes
exactly in the same topology. A *step checkpoint* (LeRobot's ``training_step.json``: step,
batch size, world size, ``--num_workers``, seed) holds none; this module derives it:

1. :func:`resume_point` -- per worker of a rank, the samples delivered after ``step`` batches.
   ``StatefulDataLoader`` (and ``DataLoader``) take batches from the workers in turn (w0, w1,
   ..., skipping workers whose epoch is over), each batch from one worker; or, with batches
   across workers (``streaming_batches_across_workers``), parts of ``batch_size / num_workers``
   in that order, ``num_workers`` consecutive parts to a batch.
2. :func:`replay_worker` / :func:`replay_checkpoint` -- the old schedules replayed to those
   offsets with the pool sampler's own code (``EpisodePoolSampler.state_after``): arithmetic on
   sharder and sampler states, nothing fetched or decoded.
3. Same split (world size and worker count unchanged): :func:`exact_start` -- each worker
   continues its own schedule (sample-exact when the batch size is unchanged too).
   Another split: :func:`remnant_of` collects the frames no old worker delivered in its current
   epoch, :func:`assign_remnant` splits them frame-balanced over the new ranks and workers as
   whole episodes (a partly delivered episode continues with its remaining frames only).
   Each new rank computes the same remnant, so every remaining frame is delivered exactly once.
   A weighted mixture (``streaming_weights``): :func:`weighted_remnant_of` collects, per dataset,
   the visits of every old worker's previous dataset epoch still open and the undelivered rest of
   its current one; :func:`assign_weighted_remnant` splits each dataset's part over the new readers
   the same way, and each reader's weighted schedule reads them as that dataset's first two epochs.

The result is a :class:`WorkerStart` per reader: the starting state of its sharder and pool
sampler. The nodes after the sampler hold no schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, ClassVar

from ..config import split_evenly
from ..nodes.pool_sampler import EpisodePoolSampler
from ..nodes.sharder import (
    CONTIGUOUS_SPLIT,
    SCATTERED_SPLIT,
    RankWorkerSharder,
    contiguous_balanced_split,
    frame_balanced_assignment,
    seed_entropy,
)
from ..nodes.weighted_sharder import WeightedMixtureSharder


@dataclass(frozen=True)
class WorkerOffset:
    """Worker ``worker_id`` is in ``epoch`` and has delivered ``samples`` of it."""

    epoch: int
    samples: int


def batches_per_epoch(samples: int, batch_size: int) -> int:
    """Batches a worker yields per epoch (``drop_last=False``: a short last batch counts)."""
    return math.ceil(samples / batch_size)


def worker_offsets(
    step: int, batch_size: int, worker_samples: Sequence[int], *, across_workers: bool = False
) -> list[WorkerOffset]:
    return resume_point(step, batch_size, worker_samples, across_workers=across_workers)[0]


def resume_point(
    step: int, batch_size: int, worker_samples: Sequence[int], *, across_workers: bool = False
) -> tuple[list[WorkerOffset], int]:
    """The position of every worker of one rank after the rank consumed ``step`` batches.

    ``worker_samples[w]`` is the number of samples worker ``w`` yields per epoch (one entry
    for ``num_workers=0``). Epochs restart from worker 0, as a new DataLoader iterator does.
    Also returns the worker that yields the next batch (batch number ``step``), or with
    ``across_workers`` the next part.

    ``across_workers``: worker ``w`` yields parts of ``split_evenly(batch_size, workers, w)``
    samples and a batch joins ``workers`` consecutive parts (an epoch's last joins what is left).
    """
    if step < 0 or batch_size < 1:
        raise ValueError(f"step must be >= 0 and batch_size >= 1, got step={step}, batch_size={batch_size}")
    if not worker_samples or any(n < 1 for n in worker_samples):
        raise ValueError(f"every worker needs at least one sample per epoch, got {list(worker_samples)}")
    workers = len(worker_samples)
    joined = across_workers and workers > 1
    sizes = [split_evenly(batch_size, workers, w) if joined else batch_size for w in range(workers)]
    per_worker = [batches_per_epoch(n, size) for n, size in zip(worker_samples, sizes, strict=True)]
    if joined:
        epoch, batches = divmod(step, math.ceil(sum(per_worker) / workers))
        remainder = batches * workers
    else:
        epoch, remainder = divmod(step, sum(per_worker))
    taken = [0] * len(per_worker)
    worker = 0
    for _ in range(remainder):
        while taken[worker] >= per_worker[worker]:
            worker = (worker + 1) % len(per_worker)
        taken[worker] += 1
        worker = (worker + 1) % len(per_worker)
    while taken[worker] >= per_worker[worker]:
        worker = (worker + 1) % len(per_worker)
    offsets = [
        WorkerOffset(epoch=epoch, samples=min(count * size, samples))
        for count, size, samples in zip(taken, sizes, worker_samples, strict=True)
    ]
    return offsets, worker


# -- topologies and step checkpoints ----------------------------------------------------------
@dataclass(frozen=True)
class Topology:
    """How a run splits the stream: ``world_size`` ranks of ``num_workers`` DataLoader workers each.

    ``num_workers=0`` (the training process reads) splits a rank like one worker does.
    """

    world_size: int
    num_workers: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.num_workers < 0:
            raise ValueError(f"world_size must be >= 1 and num_workers >= 0, got {self}")

    @property
    def parts(self) -> int:
        """Schedules per rank (one for ``num_workers=0``)."""
        return max(1, self.num_workers)

    def splits_like(self, other: Topology) -> bool:
        """Whether both give every worker the same episodes and schedule (same ranks, same parts)."""
        return self.world_size == other.world_size and self.parts == other.parts

    def describe(self) -> str:
        return f"{self.world_size} rank(s) x {self.num_workers} worker(s)"


@dataclass(frozen=True)
class StepCheckpoint:
    """A LeRobot-style checkpoint: every rank consumed ``step`` batches of ``batch_size`` in ``topology``.

    ``across_workers``: each batch joined a part of every worker (``streaming_batches_across_workers``).
    The arithmetic assumes the run read plain epochs in one topology from step 0.
    """

    step: int
    batch_size: int
    topology: Topology
    across_workers: bool = False

    def __post_init__(self) -> None:
        if self.step < 0 or self.batch_size < 1:
            raise ValueError(f"step must be >= 0 and batch_size >= 1, got {self}")


SamplerFactory = Callable[[int, int, int], EpisodePoolSampler]
"""``(rank, worker_id, num_workers) -> `` a fresh (not reset) sampler of that worker's plain schedule,
built as the graph builds it (``nodes.graph.schedule_sampler``)."""


# -- replaying the old schedule (arithmetic, no I/O) -------------------------------------------
@dataclass(frozen=True)
class WorkerPosition:
    """Old worker ``worker`` of rank ``rank`` after the checkpoint: ``samples`` delivered in ``epoch``.

    ``admitted`` are the episodes its pool admitted so far, ``pool`` the resident ones with the
    frames taken of each; ``sampler_state`` restores its sampler exactly there.
    """

    rank: int
    worker: int
    epoch: int
    samples: int
    episodes: tuple[int, ...]
    admitted: tuple[int, ...]
    pool: tuple[tuple[int, int], ...]
    sampler_state: dict[str, Any] = field(compare=False, repr=False)


@dataclass(frozen=True)
class RankOffsets:
    """Where every worker of one old rank stands, and which worker yields the rank's next batch."""

    rank: int
    offsets: tuple[WorkerOffset, ...]
    next_worker: int

    @property
    def epoch(self) -> int:
        return self.offsets[0].epoch


WorkersOfRank = Callable[[int], int]
"""``rank -> `` the DataLoader workers that rank really ran (``num_workers`` clamped to its episodes)."""


def rank_samplers(
    checkpoint: StepCheckpoint, rank: int, make_sampler: SamplerFactory, workers_of: WorkersOfRank | None = None
) -> list[EpisodePoolSampler]:
    """Fresh samplers of every worker old rank ``rank`` ran."""
    num_workers = checkpoint.topology.num_workers if workers_of is None else workers_of(rank)
    return [make_sampler(rank, worker, num_workers) for worker in range(max(1, num_workers))]


def offsets_of(checkpoint: StepCheckpoint, rank: int, samplers: Sequence[EpisodePoolSampler]) -> RankOffsets:
    """The per-worker offsets of old rank ``rank`` (:func:`resume_point` over its workers' epoch sizes)."""
    samples = [sampler.source.num_frames for sampler in samplers]
    offsets, next_worker = resume_point(
        checkpoint.step, checkpoint.batch_size, samples, across_workers=checkpoint.across_workers
    )
    return RankOffsets(rank=rank, offsets=tuple(offsets), next_worker=next_worker)


def rank_offsets(
    checkpoint: StepCheckpoint, rank: int, make_sampler: SamplerFactory, workers_of: WorkersOfRank | None = None
) -> RankOffsets:
    """The per-worker offsets of old rank ``rank``."""
    return offsets_of(checkpoint, rank, rank_samplers(checkpoint, rank, make_sampler, workers_of))


def replay_worker(sampler: EpisodePoolSampler, rank: int, worker: int, offset: WorkerOffset) -> WorkerPosition:
    """Replay ``sampler``'s own schedule to ``offset``: the sampler's code on a clone, nothing fetched or decoded."""
    state = sampler.state_after(offset.samples, offset.epoch)
    cursor = int(state[EpisodePoolSampler.SOURCE_KEY][RankWorkerSharder.CURSOR_KEY])
    return WorkerPosition(
        rank=rank,
        worker=worker,
        epoch=offset.epoch,
        samples=offset.samples,
        episodes=tuple(sampler.source.episodes),
        admitted=tuple(sampler.source.epoch_order(offset.epoch)[:cursor]),
        pool=tuple((int(e), int(taken)) for e, taken in state[EpisodePoolSampler.POOL_KEY]),
        sampler_state=state,
    )


def replay_checkpoint(
    checkpoint: StepCheckpoint, make_sampler: SamplerFactory, workers_of: WorkersOfRank | None = None
) -> list[WorkerPosition]:
    """Every old worker of every old rank at the checkpoint (what each new rank recomputes alike)."""
    positions = []
    for rank in range(checkpoint.topology.world_size):
        samplers = rank_samplers(checkpoint, rank, make_sampler, workers_of)
        where = offsets_of(checkpoint, rank, samplers)
        for worker, (sampler, offset) in enumerate(zip(samplers, where.offsets, strict=True)):
            positions.append(replay_worker(sampler, rank, worker, offset))
    return positions


# -- the remnant: what the old topology had not delivered yet ----------------------------------
@dataclass(frozen=True)
class RemnantEpisode:
    """An episode of the remnant: ``taken`` of its ``length`` frames were delivered, in the frame
    order of ``order_epoch`` (``taken=0``: untouched)."""

    episode: int
    length: int
    taken: int = 0
    order_epoch: int = 0
    dataset: int = 0
    """The mixture position of its dataset (a weighted mixture's remnant is split per dataset)."""

    @property
    def remaining(self) -> int:
        return self.length - self.taken


@dataclass(frozen=True)
class Remnant:
    """The frames no old rank delivered in its current epoch, as episodes (sorted by index).

    ``epoch`` is the epoch the remnant is read as (the latest epoch of any old rank); plain
    epochs continue from ``epoch + 1``.
    """

    epoch: int
    episodes: tuple[RemnantEpisode, ...]

    @property
    def num_frames(self) -> int:
        return sum(item.remaining for item in self.episodes)


def remnant_of(positions: Sequence[WorkerPosition], lengths: Mapping[int, int]) -> Remnant:
    """The undelivered rest of every old worker's current epoch.

    Guarantee: a frame is in the remnant iff its old worker had not delivered it in that
    worker's current epoch; old workers own disjoint episodes, so no frame appears twice.
    """
    items: list[RemnantEpisode] = []
    for position in positions:
        resident = dict(position.pool)
        admitted = set(position.admitted)
        for episode in position.episodes:
            taken = resident.get(episode)
            if taken is not None and taken > 0:
                items.append(RemnantEpisode(episode, int(lengths[episode]), taken, position.epoch))
            elif taken is not None or episode not in admitted:
                items.append(RemnantEpisode(episode, int(lengths[episode])))
    epoch = max((position.epoch for position in positions), default=0)
    return Remnant(epoch=epoch, episodes=tuple(sorted(items, key=lambda item: item.episode)))


@dataclass(frozen=True)
class WeightedRemnant:
    """A weighted mixture's undelivered frames at a checkpoint, per dataset in the old workers' own epochs.

    Each old worker reads each dataset in that dataset's own epochs, so at the checkpoint a dataset's
    share on one worker may still have visits of its previous epoch open (``tails``: the rest of
    each such visit) besides the undelivered rest of its current epoch (``rest``: whole episodes
    not admitted yet, and resident ones with the frames taken). An episode of a tail is in ``rest``
    too (whole): its visit of the current epoch had not begun. ``epoch`` is the loader epoch.
    """

    epoch: int
    tails: tuple[RemnantEpisode, ...]
    rest: tuple[RemnantEpisode, ...]

    @property
    def episodes(self) -> tuple[RemnantEpisode, ...]:
        return self.tails + self.rest

    @property
    def num_frames(self) -> int:
        return sum(item.remaining for item in self.episodes)

    def dataset_frames(self) -> dict[int, int]:
        """Undelivered frames per dataset."""
        frames: dict[int, int] = {}
        for item in self.episodes:
            frames[item.dataset] = frames.get(item.dataset, 0) + item.remaining
        return frames


def weighted_remnant_of(
    checkpoint: StepCheckpoint, make_sampler: SamplerFactory, workers_of: WorkersOfRank | None = None
) -> WeightedRemnant:
    """Every old worker of a weighted mixture replayed to the checkpoint, and what it had not delivered.

    Guarantee: per old worker and dataset, the frames of its current dataset epoch not yet delivered
    are in ``rest`` once, and those of its previous epoch's visits still open in ``tails`` once;
    nothing it delivered is in either. Old workers own disjoint shares of every dataset.
    """
    tails: list[RemnantEpisode] = []
    rest: list[RemnantEpisode] = []
    loader_epoch = 0
    for rank in range(checkpoint.topology.world_size):
        samplers = rank_samplers(checkpoint, rank, make_sampler, workers_of)
        where = offsets_of(checkpoint, rank, samplers)
        for sampler, offset in zip(samplers, where.offsets, strict=True):
            state = sampler.state_after(offset.samples, offset.epoch)
            replay = sampler.clone(sampler.source.clone(initial_epoch=offset.epoch))
            replay.reset(state)
            sharder = replay.source
            if not isinstance(sharder, WeightedMixtureSharder):
                raise TypeError("weighted_remnant_of replays the schedules of a weighted mixture")
            loader_epoch = max(loader_epoch, sharder.epoch)
            resident = {int(e): int(taken) for e, taken in state[EpisodePoolSampler.POOL_KEY]}
            for d, part in enumerate(sharder.datasets):
                epoch, cursor = sharder.dataset_cursor(d)
                admitted = set(sharder.dataset_order(d, epoch)[:cursor])
                for episode in part.episodes:
                    length = sharder.episode_length(episode)
                    whole = RemnantEpisode(episode, length, dataset=d)
                    if episode in resident:
                        visit = RemnantEpisode(
                            episode, length, resident[episode], sharder.frame_epoch(episode), dataset=d
                        )
                        if sharder.visit_epoch(episode) < epoch:  # the previous epoch's visit, still open
                            tails.append(visit)
                            rest.append(whole)
                        else:
                            rest.append(visit)
                    elif episode not in admitted:
                        rest.append(whole)
    by_episode = attrgetter("episode")
    return WeightedRemnant(loader_epoch, tuple(sorted(tails, key=by_episode)), tuple(sorted(rest, key=by_episode)))


# -- where each new worker starts --------------------------------------------------------------
@dataclass(frozen=True)
class WorkerStart:
    """How one reader (a DataLoader worker, or the training process) runs its first epoch after a resume.

    Exact (``assigned is None``): it continues old worker ``schedule_worker`` of its own rank,
    from ``sampler_state`` after ``samples`` delivered samples (``None``: from the epoch's start).
    Elastic: it reads the remnant episodes ``assigned`` to it; ``carried`` lists
    ``(episode, frames taken, order epoch)`` of those partly delivered. Either way, epoch
    ``epoch + 1`` onwards are plain epochs of the reader's own topology. A weighted mixture's elastic
    start also has ``tails``: old visits of a previous dataset epoch to finish, ``(episode, frames
    taken, order epoch)`` (see :class:`~lerobot_nodes.nodes.weighted_sharder.ElasticLead`).
    """

    epoch: int
    schedule_worker: int
    samples: int = 0
    sampler_state: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    assigned: tuple[int, ...] | None = None
    carried: tuple[tuple[int, int, int], ...] = ()
    tails: tuple[tuple[int, int, int], ...] = ()

    EPOCH_KEY: ClassVar[str] = "epoch"
    WORKER_KEY: ClassVar[str] = "schedule_worker"
    ASSIGNED_KEY: ClassVar[str] = "assigned"
    CARRIED_KEY: ClassVar[str] = "carried"
    TAILS_KEY: ClassVar[str] = "tails"

    @property
    def elastic(self) -> bool:
        return self.assigned is not None

    @property
    def next_epoch(self) -> int:
        return self.epoch + 1

    def carried_map(self) -> dict[int, tuple[int, int]]:
        """``episode -> (frames taken, order epoch)``, as ``EpisodePoolSampler(carried=...)`` takes it."""
        return {episode: (taken, order_epoch) for episode, taken, order_epoch in self.carried}

    def tails_map(self) -> dict[int, tuple[int, int]]:
        """``episode -> (frames taken, order epoch)`` of the :attr:`tails`."""
        return {episode: (taken, order_epoch) for episode, taken, order_epoch in self.tails}

    def to_state(self) -> dict[str, Any]:
        """Plain values to save with a loader state (the sampler position is in the graph state)."""
        return {
            self.EPOCH_KEY: self.epoch,
            self.WORKER_KEY: self.schedule_worker,
            self.ASSIGNED_KEY: None if self.assigned is None else list(self.assigned),
            self.CARRIED_KEY: [list(item) for item in self.carried],
            self.TAILS_KEY: [list(item) for item in self.tails],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> WorkerStart:
        assigned = state[cls.ASSIGNED_KEY]
        return cls(
            epoch=int(state[cls.EPOCH_KEY]),
            schedule_worker=int(state[cls.WORKER_KEY]),
            assigned=None if assigned is None else tuple(int(e) for e in assigned),
            carried=tuple((int(e), int(t), int(o)) for e, t, o in state[cls.CARRIED_KEY]),
            tails=tuple((int(e), int(t), int(o)) for e, t, o in state.get(cls.TAILS_KEY, ())),
        )


_REMNANT_STREAM = 0x524D4E54


def assign_remnant(
    remnant: Remnant, topology: Topology, rank: int, worker_id: int, seed: int, worker_split: str = CONTIGUOUS_SPLIT
) -> WorkerStart:
    """The remnant episodes of (``rank``, ``worker_id``) in ``topology``.

    Whole episodes, weighted by their remaining frames, split frame-balanced over the ranks
    (``frame_balanced_assignment``) and then over each rank's workers as the run splits its
    plain epochs (``worker_split``: runs of consecutive episodes, ``contiguous_balanced_split``,
    or the older ``scattered`` split): every remnant frame goes to exactly one worker; a part may
    be empty when the remnant has fewer episodes than parts. Deterministic in (remnant,
    topology, seed, worker_split).
    """
    _check_reader(topology, rank, worker_id)
    part = _split_items(remnant.episodes, topology, rank, worker_id, seed_entropy(seed) ^ _REMNANT_STREAM, worker_split)
    return WorkerStart(
        epoch=remnant.epoch,
        schedule_worker=worker_id,
        assigned=tuple(item.episode for item in part),
        carried=tuple((item.episode, item.taken, item.order_epoch) for item in part if item.taken),
    )


def assign_weighted_remnant(
    remnant: WeightedRemnant,
    topology: Topology,
    rank: int,
    worker_id: int,
    seed: int,
    worker_split: str = CONTIGUOUS_SPLIT,
) -> WorkerStart:
    """The part of a weighted mixture's remnant (``rank``, ``worker_id``) in ``topology`` reads first.

    Each dataset's tails, and each dataset's rest, are split on their own as :func:`assign_remnant`
    splits a remnant (frame-balanced over the ranks, then over the rank's workers by ``worker_split``),
    so every new reader gets its share of every dataset's undelivered frames and every such frame goes
    to exactly one reader. Deterministic in (remnant, topology, seed, worker_split).
    """
    _check_reader(topology, rank, worker_id)
    chosen: list[list[RemnantEpisode]] = []
    for stage, items in enumerate((remnant.tails, remnant.rest)):
        by_dataset: dict[int, list[RemnantEpisode]] = {}
        for item in items:  # sorted by episode, so each dataset's list is too
            by_dataset.setdefault(item.dataset, []).append(item)
        mine: list[RemnantEpisode] = []
        for dataset, own in sorted(by_dataset.items()):
            entropy = seed_entropy(seed) ^ _REMNANT_STREAM ^ (((dataset + 1) << 8 | stage) * 0x9E3779B1)
            mine += _split_items(own, topology, rank, worker_id, entropy, worker_split)
        chosen.append(mine)
    tails, rest = chosen
    return WorkerStart(
        epoch=remnant.epoch,
        schedule_worker=worker_id,
        assigned=tuple(sorted(item.episode for item in rest)),
        carried=tuple((item.episode, item.taken, item.order_epoch) for item in rest if item.taken),
        tails=tuple((item.episode, item.taken, item.order_epoch) for item in tails),
    )


def _check_reader(topology: Topology, rank: int, worker_id: int) -> None:
    if not 0 <= rank < topology.world_size or not 0 <= worker_id < topology.parts:
        raise ValueError(f"rank {rank} / worker {worker_id} is not in {topology}")


def _split_items(
    items: Sequence[RemnantEpisode], topology: Topology, rank: int, worker_id: int, entropy: int, worker_split: str
) -> list[RemnantEpisode]:
    """The items (sorted by episode) of (``rank``, ``worker_id``): frame-balanced over the ranks, then split
    over the rank's workers by ``worker_split``."""
    if not items:
        return []
    ranks = frame_balanced_assignment([item.remaining for item in items], topology.world_size, entropy)
    mine = [items[i] for i in ranks[rank]]
    if not mine:
        return []
    remaining = [item.remaining for item in mine]  # ``mine`` is sorted by episode, as ``items`` is
    if worker_split == SCATTERED_SPLIT:
        workers = frame_balanced_assignment(remaining, topology.parts, entropy ^ (rank + 1))
    else:
        workers = contiguous_balanced_split(remaining, topology.parts)
    return [mine[i] for i in workers[worker_id]]


def exact_start(offsets: RankOffsets, worker_id: int, num_workers: int) -> tuple[int, WorkerOffset]:
    """The old worker whose schedule DataLoader worker ``worker_id`` continues, unchanged topology.

    A new DataLoader asks worker 0 first; the interrupted run's next batch came from
    ``offsets.next_worker``. Worker ``p`` therefore reads old worker ``(p + next_worker) % n``
    for the rest of the epoch, which keeps the batch order of an uninterrupted run.
    """
    schedule_worker = (worker_id + offsets.next_worker) % num_workers if num_workers > 0 else 0
    return schedule_worker, offsets.offsets[schedule_worker]


def describe_change(
    checkpoint: StepCheckpoint, new: Topology, remnant: Remnant | WeightedRemnant | None, batch_size: int | None = None
) -> str:
    """The one log line of a resume in another topology or batch size (``batch_size``: the new one, if known)."""
    old = checkpoint.topology
    batch = "" if batch_size is None or batch_size == checkpoint.batch_size else f", batch size {batch_size}"
    what = (
        f"resuming step {checkpoint.step} (batch size {checkpoint.batch_size}) of a {old.describe()} run as "
        f"{new.describe()}{batch}"
    )
    if remnant is None:
        return (
            f"{what}: every worker keeps its own schedule, so each frame of the epoch is still delivered once; "
            "batch boundaries differ from an uninterrupted run"
        )
    if isinstance(remnant, WeightedRemnant):
        frames = ", ".join(f"{count} of dataset {d}" for d, count in sorted(remnant.dataset_frames().items()))
        return (
            f"{what}: the topology changed, so the {remnant.num_frames} frame(s) ({frames or 'none'}) not yet delivered "
            "in each dataset's current epoch on each old worker (with the rest of its previous epoch's visits still "
            "open) are split over the new ranks and workers, each dataset on its own, and each is delivered exactly "
            "once; the order differs from an uninterrupted run; each dataset then continues with its next epochs in "
            "the new topology, weighed as before"
        )
    return (
        f"{what}: the topology changed, so the {remnant.num_frames} frame(s) of {len(remnant.episodes)} episode(s) "
        f"not yet delivered in epoch {remnant.epoch} are split over the new ranks and workers and each is delivered "
        f"exactly once; the order differs from an uninterrupted run; epochs from {remnant.epoch + 1} "
        "use the new topology"
    )
