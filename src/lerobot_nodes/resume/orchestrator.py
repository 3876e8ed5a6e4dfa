"""A streaming dataset's pending resume, held through explicit stages until a reader runs it.

A resume enters in one of two ways: a loader state (``load_state_dict``: where each reader's
graph stood) or a training step (``resume_from_step``: batches already delivered, maybe by
another topology). It leaves when a reader's ``iter()`` has started from it and that epoch is
over. The stages::

    StepPending --plan()--> StepPlanned --begin()--> Resumed --begin()--> (plain epochs)
         \\__________________begin()_________________/^
    Restoring --begin()--> Resumed (a saved epoch start) or plain epochs (a plain position)

:class:`ResumeOrchestrator` owns the stage; the dataset asks it what the next ``iter()``
starts from (:meth:`~ResumeOrchestrator.begin`) and what its state dict records
(:meth:`~ResumeOrchestrator.saved`). The planning itself is :mod:`.planning`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .planning import (
    RankOffsets,
    Remnant,
    StepCheckpoint,
    Topology,
    WeightedRemnant,
    WorkerStart,
    assign_remnant,
    assign_weighted_remnant,
    describe_change,
    exact_start,
    rank_offsets,
    remnant_of,
    replay_checkpoint,
    weighted_remnant_of,
)
from .schedules import RankSchedule

logger = logging.getLogger("lerobot_nodes.dataset")

GRAPH_KEY = "graph"
START_KEY = "start"
CHECKPOINT_KEY = "step_checkpoint"


# -- the stages --------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepPending:
    """A step checkpoint nobody has planned yet (the reader plans it if the training process did not)."""

    checkpoint: StepCheckpoint


@dataclass(frozen=True)
class StepPlanned:
    """A step checkpoint planned in the training process: exact ``offsets`` (same split) or a ``remnant``."""

    checkpoint: StepCheckpoint
    offsets: RankOffsets | None = field(default=None, repr=False)
    remnant: Remnant | WeightedRemnant | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Restoring:
    """A loader state: this reader's saved epoch start and/or graph position, not yet iterated."""

    start: WorkerStart | None
    graph_state: dict[str, Any] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Resumed:
    """``iter()`` started from ``start``; the next ``iter()`` reads plain epochs from ``start.next_epoch``."""

    start: WorkerStart


Stage = StepPending | StepPlanned | Restoring | Resumed | None


# -- what an iter() starts from ------------------------------------------------------------------
@dataclass(frozen=True)
class PlainEpochs:
    """A fresh graph of the plain schedule from ``epoch`` (the resume's epoch is over)."""

    epoch: int


@dataclass(frozen=True)
class StartAt:
    """A graph for ``start`` (``None``: the plain schedule), restored to ``graph_state`` when given, else
    fast-forwarded to ``start``'s position (an exact start) or started fresh (an elastic one)."""

    start: WorkerStart | None
    graph_state: dict[str, Any] | None


class ResumeOrchestrator:
    """Holds one dataset's resume stage; every transition is a method here.

    Guarantees: the expensive replay of a step resume runs at most once per process (in the
    training process when :meth:`plan` is called, else in each reader); a reader starts from
    a resume exactly once, and plain epochs follow it; :meth:`saved` records what a reader
    needs to continue from any stage.
    """

    def __init__(self) -> None:
        self.stage: Stage = None

    @property
    def pending_checkpoint(self) -> StepCheckpoint | None:
        """The step checkpoint a reader has not started from yet (None at any other stage)."""
        return self.stage.checkpoint if isinstance(self.stage, (StepPending, StepPlanned)) else None

    # -- entering --------------------------------------------------------------------------
    def from_step(self, checkpoint: StepCheckpoint) -> None:
        self.stage = StepPending(checkpoint)

    def restore(self, state: Mapping[str, Any], topology: Mapping[str, Any]) -> None:
        """Enter from a loader state's :data:`GRAPH_KEY`, :data:`START_KEY` and :data:`CHECKPOINT_KEY`."""
        start = _saved_start(state, topology)
        checkpoint = state.get(CHECKPOINT_KEY)
        graph_state = state.get(GRAPH_KEY)
        if checkpoint is not None and graph_state is None and start is None:
            self.stage = StepPending(_checkpoint_from_state(checkpoint))
        elif start is not None or graph_state:
            self.stage = Restoring(start=start, graph_state=graph_state)
        else:
            self.stage = None

    # -- planning --------------------------------------------------------------------------
    def plan(self, schedule: Callable[[], RankSchedule], new: Topology, batch_size: int | None = None) -> None:
        """Plan a pending step resume for ``new`` (a no-op at any other stage)."""
        if isinstance(self.stage, StepPending):
            self.stage = _planned(self.stage.checkpoint, schedule(), new, batch_size)

    def begin(
        self, schedule: Callable[[], RankSchedule], worker_id: int, num_workers: int
    ) -> PlainEpochs | StartAt | None:
        """What this reader's ``iter()`` starts from (``None``: the next plain epoch of its graph), and
        the stage after it. ``schedule`` is called only when a step resume is planned or started."""
        stage = self.stage
        if stage is None:
            return None
        if isinstance(stage, Resumed):
            self.stage = None
            return PlainEpochs(stage.start.next_epoch)
        if isinstance(stage, Restoring):
            self.stage = Resumed(stage.start) if stage.start is not None else None
            return StartAt(stage.start, stage.graph_state)
        rank_schedule = schedule()
        if isinstance(stage, StepPending):
            stage = _planned(stage.checkpoint, rank_schedule, Topology(rank_schedule.world_size, num_workers))
        start = _started(stage, rank_schedule, worker_id, num_workers)
        self.stage = Resumed(start)
        return StartAt(start, None)

    # -- saving ----------------------------------------------------------------------------
    def saved(self, live_graph_state: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
        """The state dict entries of this stage; ``live_graph_state`` reads the running graph's position."""
        stage = self.stage
        if isinstance(stage, (StepPending, StepPlanned)):
            return {GRAPH_KEY: None, START_KEY: None, CHECKPOINT_KEY: _checkpoint_state(stage.checkpoint)}
        if isinstance(stage, Restoring):
            start = stage.start
            return {GRAPH_KEY: stage.graph_state, START_KEY: None if start is None else start.to_state(), CHECKPOINT_KEY: None}
        start = stage.start if isinstance(stage, Resumed) else None
        return {GRAPH_KEY: live_graph_state(), START_KEY: None if start is None else start.to_state(), CHECKPOINT_KEY: None}


def _planned(
    checkpoint: StepCheckpoint, schedule: RankSchedule, new: Topology, batch_size: int | None = None
) -> StepPlanned:
    """Exact or elastic, decided on the requested topologies (the same on every rank); the replay
    uses the workers each old rank really ran."""
    old = checkpoint.topology
    if schedule.excluded is not None and not new.splits_like(old):
        raise ConfigError(
            f"cannot resume step {checkpoint.step} in another topology (world size {old.world_size} -> "
            f"{new.world_size}, --num_workers {old.num_workers} -> {new.num_workers}) with "
            "--dataset.streaming_bad_episodes=skip: each rank knows only its own skipped episodes, and the replay needs "
            "every old rank's; resume with the checkpoint's world size and --num_workers"
        )
    make_sampler = schedule.samplers(old.world_size)
    workers = schedule.workers_of_rank(old)
    if new.splits_like(old):
        if new != old or batch_size not in (None, checkpoint.batch_size):
            logger.info(describe_change(checkpoint, new, None, batch_size))
        return StepPlanned(checkpoint, offsets=rank_offsets(checkpoint, schedule.rank, make_sampler, workers))
    remnant: Remnant | WeightedRemnant
    if schedule.weighted:  # each dataset in its own epochs on every old worker
        remnant = weighted_remnant_of(checkpoint, make_sampler, workers)
    else:
        positions = replay_checkpoint(checkpoint, make_sampler, workers)
        remnant = remnant_of(positions, dict(zip(schedule.episodes, schedule.lengths, strict=True)))
    logger.info(describe_change(checkpoint, new, remnant, batch_size))
    return StepPlanned(checkpoint, remnant=remnant)


def _started(planned: StepPlanned, schedule: RankSchedule, worker_id: int, num_workers: int) -> WorkerStart:
    """This reader's :class:`WorkerStart` from a planned step resume."""
    if planned.offsets is not None:
        schedule_worker, offset = exact_start(planned.offsets, worker_id, num_workers)
        return WorkerStart(epoch=offset.epoch, schedule_worker=schedule_worker, samples=offset.samples)
    assert planned.remnant is not None
    new = Topology(schedule.world_size, num_workers)
    if isinstance(planned.remnant, WeightedRemnant):
        return assign_weighted_remnant(
            planned.remnant, new, schedule.rank, worker_id, schedule.seed, schedule.worker_split
        )
    return assign_remnant(planned.remnant, new, schedule.rank, worker_id, schedule.seed, schedule.worker_split)


def _checkpoint_state(checkpoint: StepCheckpoint) -> dict[str, int | bool]:
    return {
        "step": checkpoint.step,
        "batch_size": checkpoint.batch_size,
        "world_size": checkpoint.topology.world_size,
        "num_workers": checkpoint.topology.num_workers,
        "across_workers": checkpoint.across_workers,
    }


def _checkpoint_from_state(state: Mapping[str, Any]) -> StepCheckpoint:
    return StepCheckpoint(
        int(state["step"]),
        int(state["batch_size"]),
        Topology(int(state["world_size"]), int(state["num_workers"])),
        across_workers=bool(state.get("across_workers", False)),  # states before batches across workers: False
    )


def _saved_start(state: Mapping[str, Any], topology: Mapping[str, Any]) -> WorkerStart | None:
    """The saved epoch start; states of the previous version recorded a worker shift instead."""
    if state.get(START_KEY) is not None:
        return WorkerStart.from_state(state[START_KEY])
    shift = int(topology.get("worker_shift", 0))
    if not shift:
        return None
    return WorkerStart(
        epoch=int(topology["shifted_epoch"]),
        schedule_worker=(int(topology["worker_id"]) + shift) % int(topology["num_workers"]),
    )
