"""Small builders shared by the node tests: pure schedules, fake payloads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from lerobot_nodes.fetch import ByteBudget
from lerobot_nodes.nodes import EpisodePoolSampler, RankWorkerSharder, ScheduleItem


def make_sampler(
    episodes: Sequence[int],
    lengths: Sequence[int],
    *,
    rank: int = 0,
    world_size: int = 1,
    worker_id: int = 0,
    num_workers: int = 1,
    pool_size: int = 4,
    strategy: str = "remaining",
    seed: int | None = 0,
    costs: dict[int, int] | None = None,
    budget: ByteBudget | None = None,
    shuffle: bool = True,
    initial_epoch: int = 0,
) -> EpisodePoolSampler:
    sharder = RankWorkerSharder(
        episodes,
        lengths,
        rank=rank,
        world_size=world_size,
        worker_id=worker_id,
        num_workers=num_workers,
        seed=seed,
        shuffle=shuffle,
        initial_epoch=initial_epoch,
    )
    return EpisodePoolSampler(
        sharder,
        pool_size=pool_size,
        strategy=strategy,
        seed=seed,
        episode_cost=costs.__getitem__ if costs is not None else None,
        budget=budget,
    )


def pairs(items: Sequence[ScheduleItem]) -> list[tuple[int, int]]:
    return [(item.episode, item.frame) for item in items]


def lerobot_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("lerobot-nodes")]


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def graph_options(**flat):
    """``build_streaming_graph``'s grouped options from flat keywords (``seed=``, ``delta_timestamps=``, ...)."""
    import dataclasses

    from lerobot_nodes.streaming_graph import (
        BatchOptions,
        GraphServices,
        ReaderSlot,
        SampleOptions,
        ScheduleStart,
    )

    groups = {"reader": ReaderSlot, "schedule": ScheduleStart, "samples": SampleOptions, "services": GraphServices}
    options = {}
    for name, group in groups.items():
        fields = {f.name for f in dataclasses.fields(group)}
        taken = {key: flat.pop(key) for key in list(flat) if key in fields}
        if taken:
            options[name] = group(**taken)
    if "batch_size" in flat:
        renamed = {"shared_memory_batches": "shared_memory"}
        options["batches"] = BatchOptions(**{renamed.get(k, k): flat.pop(k) for k in list(flat) if k in
                                             ("batch_size", "shared_memory_batches", "batches_in_flight", "trim_heap_every")})
    assert not flat or set(flat) <= {"config"}, f"unknown graph options {sorted(flat)}"
    options.update(flat)
    return options
