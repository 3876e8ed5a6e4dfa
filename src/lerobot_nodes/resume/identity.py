"""What a resume state was taken on: the dataset, the episode selection and the schedule settings.

A saved schedule position means something only for the same episodes, frames and schedule.
The identity is recorded beside every state and compared on load, so resuming on another
dataset or selection fails with what differs instead of a ``KeyError`` deep in a worker.

Datasets are compared by content (a fingerprint of their metadata), never by path: a copy
in another folder resumes. A pinned revision (a Hub commit sha) is compared when both sides
have one. The source address is recorded for the message only; it never holds credentials.

The sampling strategy is compared, but a run that leaves ``streaming_sampling_strategy`` unset first
adopts the checkpoint's (:func:`sampling_strategy_of`): the default changed to ``round_robin``, and
checkpoints of the versions before resume with the ``remaining`` they were made with.

The worker split (how a rank's episodes are split over its DataLoader workers) is recorded
too, but adopted rather than compared: a resumed run keeps splitting as its checkpoint did, and
a state without it was written before the contiguous split existed, so it resumes with the
``scattered`` split of those versions (:func:`worker_split_of`). So is the rank's default pool
(:data:`RANK_POOL`, sized for the batch size): a resumed run keeps its checkpoint's, and a state
without it keeps the pool of 32 of the versions before (:func:`rank_pool_of`). So is whether a batch held a
part of every worker (``streaming_batches_across_workers``): neither compared nor adopted, it
tells a step resume how the checkpointed run's steps map to each worker's samples; a state
without it was written before batches across workers, when a batch came from one worker
(:func:`batches_across_workers_of`).

With ``--dataset.streaming_bad_episodes=skip`` the identity records the episodes this rank left
out (:func:`with_skipped`): a resume that finds another skipped set would follow another schedule,
so it is refused. An identity without the record (``raise``, or a state of an older version) is a
run that skipped nothing; ``raise`` identities are exactly those of the versions before the option.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..config import (
    DEFAULT_RANK_POOL_SIZE,
    OPEN_RUNS_FOR_BATCH,
    OPEN_RUNS_FOR_BUDGET,
    OPEN_RUNS_STRANDED,
    StreamingConfig,
)
from ..errors import ConfigError
from ..format.meta import DatasetMeta
from ..nodes.sharder import CONTIGUOUS_SPLIT, SCATTERED_SPLIT, check_worker_split

logger = logging.getLogger("lerobot_nodes.dataset")

SOURCE = "source"
REVISION = "revision"
WORKER_SPLIT = "worker_split"
RANK_POOL = "rank_pool"
"""The rank's default pool the schedule used (``config.default_rank_pool_size`` of the loader's batch size);
absent in the identities of the versions before the batch-sized pool (``ScheduleStart.rank_pool`` None)."""
OPEN_RUNS = "open_runs"
"""The open-runs rule of the schedule (``config.OPEN_RUNS_STRANDED``; ``OPEN_RUNS_FOR_BATCH`` before strands); absent in the identities of
the versions before it, whose rule (``config.OPEN_RUNS_FOR_BUDGET``) a run resumed from them keeps (:func:`open_runs_rule_of`)."""
BATCHES_ACROSS_WORKERS = "batches_across_workers"
SKIPPED = "skipped_episodes"
SAMPLING_STRATEGY = "sampling_strategy"
"""Compared, but adopted first when this run leaves ``streaming_sampling_strategy`` unset (:func:`sampling_strategy_of`)."""
NONE_SKIPPED = "none"
FOUND_BAD = "episodes_found_bad_while_decoding"
"""How many episodes the checkpointed run had dropped mid-epoch (``streaming_bad_episodes=skip``, found
while decoding); recorded by :func:`with_found_bad` when any, never compared: a loader state resumes them
exactly, a step offset cannot (:func:`refuse_step_resume_after_found_bad`)."""
WEIGHTS = "weights"
"""A weighted mixture's normalised ``--dataset.streaming_weights``: recorded only when set (the identities
of unweighted runs are those of the versions before weights), compared always (absent = unweighted)."""
COMPARED: dict[str, str] = {
    "total_frames": "total frames",
    "fps": "fps",
    "features": "features (hash of the names)",
    "episode_lengths": "episode lengths (hash of every episode's length)",
    "episodes": "episode selection",
    SAMPLING_STRATEGY: "--dataset.streaming_sampling_strategy",
    "episode_pool_size": "--dataset.streaming_episode_pool_size",
    "byte_budget_gb": "--dataset.streaming_byte_budget_gb",
    "gop_runs": "--dataset.streaming_gop_runs",
}
"""Identity fields that must match, and how a mismatch names them.

The byte budget is here because the pool sampler admits an episode only when its bytes fit
next to the resident ones, GOP runs because they set each episode's frame order.
``streaming_prefetch_episodes`` is not: it only changes how far
ahead bytes are fetched, never the schedule, so a resume may change it. Nor are the disk cache
options (``streaming_disk_cache_gb``, ``streaming_disk_cache_dir``): the cache returns the
store's bytes exactly, so a checkpoint taken with it on resumes with it off, and back.
"""
_warned_unknown = False


def short_hash(value: Any) -> str:
    """12 hex digits of the SHA-256 of ``value`` as canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def without_credentials(url: str) -> str:
    """``url`` with any ``user:password@`` removed (a local path is returned as it is)."""
    parts = urlsplit(url)
    if not parts.netloc or "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def dataset_identity(
    source_url: str,
    revision: str | None,
    meta: DatasetMeta,
    episodes: Sequence[int],
    config: StreamingConfig,
    worker_split: str = CONTIGUOUS_SPLIT,
    rank_pool: int | None = DEFAULT_RANK_POOL_SIZE,
) -> dict[str, Any]:
    """The plain, small identity recorded with a resume state."""
    selected = [int(e) for e in episodes]
    weights = {} if config.streaming_weights is None else {WEIGHTS: list(config.streaming_weights)}
    return {
        **weights,
        SOURCE: without_credentials(source_url),
        REVISION: revision,
        "total_frames": meta.total_frames,
        "fps": meta.fps,
        "features": short_hash(sorted(meta.features)),
        "episode_lengths": short_hash([int(n) for n in meta.episodes.length]),
        "episodes": f"{len(selected)} episodes #{short_hash(selected)}",
        SAMPLING_STRATEGY: config.sampling_strategy,
        "episode_pool_size": config.streaming_episode_pool_size,
        "byte_budget_gb": config.streaming_byte_budget_gb,
        "gop_runs": config.streaming_gop_runs,
        WORKER_SPLIT: check_worker_split(worker_split),
        BATCHES_ACROSS_WORKERS: config.streaming_batches_across_workers,
        **({} if rank_pool is None else {RANK_POOL: int(rank_pool)}),
        OPEN_RUNS: OPEN_RUNS_STRANDED,
    }


def sampling_strategy_of(identity: Mapping[str, Any] | None) -> str | None:
    """The sampling strategy a run with this identity used (every version records it), or None without one."""
    if identity is None or identity.get(SAMPLING_STRATEGY) is None:
        return None
    return str(identity[SAMPLING_STRATEGY])


def worker_split_of(identity: Mapping[str, Any] | None) -> str:
    """The worker split a run with this identity used: the recorded one, or ``scattered`` for an
    identity without one (or no identity), which only the versions before the contiguous split wrote.
    An unknown recorded split is a :class:`ConfigError` naming it."""
    if identity is None or identity.get(WORKER_SPLIT) is None:
        return SCATTERED_SPLIT
    return check_worker_split(str(identity[WORKER_SPLIT]))


def batches_across_workers_of(identity: Mapping[str, Any] | None) -> bool:
    """Whether the run with this identity joined a part of every worker into each batch: the recorded
    setting, or ``False`` for an identity without one (versions before batches across workers)."""
    return bool(identity is not None and identity.get(BATCHES_ACROSS_WORKERS))


def with_batches_across_workers(identity: Mapping[str, Any], across: bool) -> dict[str, Any]:
    """``identity`` recording whether the loader joins a part of every worker into each batch."""
    return {**identity, BATCHES_ACROSS_WORKERS: bool(across)}


def with_worker_split(identity: Mapping[str, Any], worker_split: str) -> dict[str, Any]:
    """``identity`` recording ``worker_split`` (the split a resumed run adopts from its checkpoint)."""
    return {**identity, WORKER_SPLIT: check_worker_split(worker_split)}


def rank_pool_of(identity: Mapping[str, Any] | None) -> int | None:
    """The default rank pool a run with this identity used, or None for an identity without one (or no
    identity): the versions before the batch-sized pool (``ScheduleStart.rank_pool``)."""
    if identity is None or identity.get(RANK_POOL) is None:
        return None
    return int(identity[RANK_POOL])


def with_rank_pool(identity: Mapping[str, Any], rank_pool: int | None) -> dict[str, Any]:
    """``identity`` recording ``rank_pool`` (None: recording none, as the versions before the batch-sized pool)."""
    recorded = {key: value for key, value in identity.items() if key != RANK_POOL}
    return recorded if rank_pool is None else {**recorded, RANK_POOL: int(rank_pool)}


def open_runs_rule_of(identity: Mapping[str, Any] | None) -> str:
    """The open-runs rule a run with this identity used: the recorded one, or the budget rule of the versions
    before it for an identity without one (or no identity). An unknown rule is a :class:`ConfigError`."""
    if identity is None or identity.get(OPEN_RUNS) is None:
        return OPEN_RUNS_FOR_BUDGET
    rule = str(identity[OPEN_RUNS])
    if rule not in (OPEN_RUNS_STRANDED, OPEN_RUNS_FOR_BATCH, OPEN_RUNS_FOR_BUDGET):
        raise ConfigError(f"the checkpoint's open-runs rule {rule!r} is not one this version knows; resume with its version")
    return rule


def with_open_runs_rule(identity: Mapping[str, Any], rule: str) -> dict[str, Any]:
    """``identity`` recording the open-runs ``rule`` (the budget rule: recording none, as the versions before)."""
    recorded = {key: value for key, value in identity.items() if key != OPEN_RUNS}
    return recorded if rule == OPEN_RUNS_FOR_BUDGET else {**recorded, OPEN_RUNS: rule}


def with_skipped(identity: Mapping[str, Any], episodes: Sequence[int]) -> dict[str, Any]:
    """``identity`` recording the episodes this rank skipped as bad (``streaming_bad_episodes=skip``)."""
    skipped = sorted(int(e) for e in episodes)
    shown = ", ".join(str(e) for e in skipped[:8]) + (", ..." if len(skipped) > 8 else "")
    value = f"{len(skipped)} episodes #{short_hash(skipped)} ({shown})" if skipped else NONE_SKIPPED
    return {**identity, SKIPPED: value}


def with_found_bad(identity: Mapping[str, Any], found: int) -> dict[str, Any]:
    """``identity`` as a checkpoint records it: with :data:`FOUND_BAD` when the run found ``found`` > 0 bad episodes."""
    return {**identity, FOUND_BAD: int(found)} if found > 0 else dict(identity)


def refuse_step_resume_after_found_bad(saved: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for a step resume of a checkpoint whose run dropped episodes found bad mid-epoch.

    A step offset counts delivered samples; a reader that dropped a bad episode's later samples was
    further along its schedule than that count, and which samples it dropped is in its loader state only.
    """
    found = int(saved.get(FOUND_BAD, 0))
    if found:
        raise ConfigError(
            f"cannot resume by step offset: the checkpointed run skipped {found} episode{'s' if found != 1 else ''} "
            "found bad while decoding (--dataset.streaming_bad_episodes=skip), so its readers' positions are not "
            "their delivered samples; resume with the checkpoint's batch size, --num_workers and world size, "
            "which restores its loader state exactly"
        )


def identity_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``name old -> new`` for every compared field that differs (fields the saved state lacks are
    skipped; a missing skipped-episodes record means none were skipped)."""
    differences = []
    if saved.get(SKIPPED, NONE_SKIPPED) != current.get(SKIPPED, NONE_SKIPPED):
        differences.append(
            f"episodes skipped as bad (--dataset.streaming_bad_episodes=skip) {saved.get(SKIPPED, NONE_SKIPPED)!r} -> "
            f"{current.get(SKIPPED, NONE_SKIPPED)!r}"
        )
    if saved.get(REVISION) and current.get(REVISION) and saved[REVISION] != current[REVISION]:
        differences.append(f"revision {saved[REVISION]} -> {current[REVISION]}")
    if saved.get(WEIGHTS) != current.get(WEIGHTS):
        differences.append(f"--dataset.streaming_weights {saved.get(WEIGHTS)!r} -> {current.get(WEIGHTS)!r}")
    for key, name in COMPARED.items():
        if key in saved and saved[key] != current.get(key):
            differences.append(f"{name} {saved[key]!r} -> {current.get(key)!r}")
    return differences


def check_identity(saved: Mapping[str, Any] | None, current: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` naming what differs between the checkpoint's identity and this run's.

    ``None`` (a state saved before identities were recorded) is accepted as unknown, logged once
    per process (at INFO: DataLoader workers, whose logging is not configured, stay quiet).
    """
    global _warned_unknown
    if saved is None:
        if not _warned_unknown:
            _warned_unknown = True
            logger.info(
                "the resume state does not record which dataset it was taken on (saved by an older version): "
                "resuming without checking that it is %s with the same episode selection", current.get(SOURCE)
            )
        return
    differences = identity_differences(saved, current)
    if differences:
        raise ConfigError(
            f"cannot resume: the checkpoint was taken on another dataset, episode selection or schedule: "
            f"{'; '.join(differences)} (checkpoint source {saved.get(SOURCE)}, this run {current.get(SOURCE)}). "
            "Resume with the checkpoint's dataset, --dataset.episodes and streaming settings, or start a new run"
        )
