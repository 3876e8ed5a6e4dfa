"""DataLoader plumbing for a :class:`~lerobot_nodes.dataset.StreamingLeRobotDataset`.

``streaming_dataloader`` builds the ``StatefulDataLoader`` as LeRobot training does, with
workers forked from a server process (:func:`worker_context`, ``lerobot_nodes.workers``),
their logs relayed to this process and batches assembled in the reader;
``loader_batch_size`` reads the batch size back; ``shutdown_dataloader`` stops the workers
within a bound. Nothing here changes which samples a loader yields.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import multiprocessing.context
import os
import signal
import threading
import weakref
from typing import Any

from .batch_memory.batch_ring import BatchRing
from .batch_memory.worker_parts import JoinedParts
from .dataset import StreamingLeRobotDataset
from .errors import ConfigError
from .resume.identity import with_batches_across_workers
from .workers.lifeline import GuardedWorkerInit
from .workers.logs import WorkerLogRelay
from .workers.main_guard import fail_missing_guard, missing_guard_message, unguarded_main_line
from .workers.server import CONTEXT as WORKER_CONTEXT
from .workers.server import SERVER, WorkerContext, retire_unused_server

logger = logging.getLogger("lerobot_nodes.dataset")


def streaming_dataloader(dataset: StreamingLeRobotDataset, batch_size: int, num_workers: int, **kwargs: Any) -> Any:
    """A ``StatefulDataLoader`` for ``dataset`` as LeRobot training builds it.

    Batches are assembled where the samples are decoded: ``dataset.batch_size`` is set to
    ``batch_size`` and the DataLoader itself gets ``batch_size=None``, so each worker (or, with
    ``num_workers=0``, the graph) collates whole batches into one storage (shared memory in a
    worker) and the training process only receives them. The batches are the ones a DataLoader
    with ``batch_size`` would build; :func:`loader_batch_size` reads the batch size back. A
    ``collate_fn`` other than ``default_collate``, or ``drop_last=True``, keeps the batching in
    the DataLoader (per-sample hand-off, as before).

    With two or more workers and ``streaming_batches_across_workers`` (the default), each worker
    assembles parts of ``batch_size / num_workers`` samples and the loader joins one part of each
    worker into every batch (:class:`~lerobot_nodes.batch_memory.worker_parts.JoinedParts`), so a
    batch draws on every worker's episodes; with ``pin_memory`` the joined batch is allocated pinned
    and the DataLoader does not pin the parts.

    With ``streaming_episode_pool_size`` unset, the rank's pool is sized for ``batch_size``: 4 batches of
    episodes, at least 32 (``StreamingLeRobotDataset.rank_pool``; a resumed run keeps its checkpoint's).

    ``num_workers`` is clamped to what the rank can feed (with a warning); workers persist
    across epochs so the streaming order moves on to the next epoch. Workers (and the
    forkserver) end within about a second of the training process, however it ends: the
    ``worker_init_fn`` is wrapped in :class:`~lerobot_nodes.workers.lifeline.GuardedWorkerInit`,
    which still calls a ``worker_init_fn`` given here. What workers log under
    ``lerobot_nodes`` is logged again in this process (``lerobot_nodes.workers.logs``).
    """
    from torch.utils.data import default_collate
    from torchdata.stateful_dataloader import StatefulDataLoader

    dataset.size_pool_for(batch_size)  # before planning a resume: the schedule's pool holds 4 batches of episodes
    dataset.plan_resume(num_workers, batch_size)  # before clamping: every rank decides on the same topology
    num_workers = dataset.clamp_num_workers(num_workers)
    in_reader = kwargs.get("collate_fn") in (None, default_collate) and not kwargs.get("drop_last", False)
    dataset.batch_size = int(batch_size) if in_reader else None
    across = (
        in_reader
        and num_workers > 1
        and dataset.config.streaming_batches_across_workers
        and int(batch_size) >= num_workers
    )
    dataset.batches_across_workers = num_workers if across else 1
    dataset.identity = with_batches_across_workers(dataset.identity, across)
    # Pinned only where an accelerator is (the DataLoader itself ignores pin_memory without one).
    pin_parts = bool(across and kwargs.pop("pin_memory", False) and _accelerator_available())
    options: dict[str, Any] = {"num_workers": num_workers, "shuffle": False}
    if in_reader:
        kwargs.pop("collate_fn", None)
        kwargs.pop("drop_last", None)
        options["batch_size"] = None
    else:
        options.update(batch_size=batch_size, drop_last=False)
    relay: WorkerLogRelay | None = None
    if num_workers == 0:
        retire_unused_server()  # the one the dataset started in case it got workers
    else:
        context = kwargs.pop("multiprocessing_context", None) or worker_context()
        if isinstance(context, str):
            context = multiprocessing.get_context(context)
        if isinstance(context, WorkerContext):
            context.start_server()  # before the log relay's thread, which would rule out a fork
        check_main_guard(context)
        relay = WorkerLogRelay(context)
        prefetch_factor = kwargs.pop("prefetch_factor", 4)
        # A part is released as soon as it is joined (the batch is a copy): the parts in flight and
        # one waiting for the other workers' parts (measured: 72 % reused, 41 % without it); a whole
        # batch is also held by the training step, and while it fetches the next.
        dataset.batches_in_flight = (prefetch_factor or 2) + (1 if across else 2)
        options.update(
            persistent_workers=True,
            prefetch_factor=prefetch_factor,
            multiprocessing_context=context,
            worker_init_fn=GuardedWorkerInit(relay.worker_init_fn(kwargs.pop("worker_init_fn", None))),
        )
    # The workers write their parts into these shared batches, so joining them copies no frames (a
    # pinned batch is a copy anyway): one per batch in flight and one for the part a worker starts
    # as the training process receives the last part of the batch before (fewer: measured, every
    # other part written apart and copied).
    ring = (
        BatchRing(dataset.batches_in_flight + 1, num_workers, int(batch_size), dataset.ring_cameras())
        if across and not pin_parts
        else None
    )
    dataset.batch_ring = ring
    options.update(kwargs)
    loader = (
        _joining_loader_class()(dataset, parts=num_workers, pin_parts=pin_parts, ring=ring, **options)
        if across
        else StatefulDataLoader(dataset, **options)
    )
    if relay is not None:
        relay.close_with(loader)
        _LOG_RELAYS[loader] = relay
    return loader


def _accelerator_available() -> bool:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return bool(torch.cuda.is_available())


@functools.cache
def _joining_loader_class() -> type:
    """``StatefulDataLoader`` whose iterator joins one part of each worker into a batch (defined on
    first use: torchdata is imported only when a loader is built)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    class JoiningStatefulDataLoader(StatefulDataLoader):  # type: ignore[misc]
        """Batches of ``parts`` consecutive worker parts (:class:`JoinedParts`); the state is the
        DataLoader's own, read between batches, so at a batch boundary."""

        def __init__(
            self, *args: Any, parts: int, pin_parts: bool = False, ring: BatchRing | None = None, **kwargs: Any
        ) -> None:
            super().__init__(*args, **kwargs)
            self.parts = parts
            self.pin_parts = pin_parts
            self.ring = ring

        def __iter__(self) -> Any:
            # Before the workers are reset: their first parts of this iterator read it.
            first_slot = self.ring.begin() if self.ring is not None else 0
            parts = super().__iter__()
            return JoinedParts(parts, self.parts, pin_memory=self.pin_parts, ring=self.ring, first_slot=first_slot)

    return JoiningStatefulDataLoader


def loader_batch_size(loader: Any) -> int:
    """Samples per batch of ``loader``: the DataLoader's ``batch_size``, or its streaming dataset's
    when the dataset assembles the batches (``streaming_dataloader``)."""
    if loader.batch_size is not None:
        return int(loader.batch_size)
    size = getattr(loader.dataset, "batch_size", None)
    if size is None:
        raise ConfigError("this DataLoader yields single samples (batch_size=None and a dataset that does not batch)")
    return int(size)


_LOG_RELAYS: weakref.WeakKeyDictionary[Any, WorkerLogRelay] = weakref.WeakKeyDictionary()
"""The worker-log relay of each loader ``streaming_dataloader`` built, closed by ``shutdown_dataloader``."""


def shutdown_dataloader(loader: Any, *, within_s: float | None = None) -> None:
    """Stop ``loader``'s worker processes now and wait for them.

    Persistent workers otherwise live until the loader is garbage collected. This is the
    shutdown torch runs when an iterator is collected (``_shutdown_workers``: tell each
    worker to stop, join it for up to 5 s, terminate it if it has not stopped); idempotent,
    and a no-op without workers. ``within_s``: a worker still running that long after the
    shutdown began is terminated at once (with a warning naming it), instead of after torch's
    5 s per worker: what a stop signal wants (``lerobot-nodes stream`` on SIGTERM/SIGINT).
    """
    iterator = getattr(loader, "_iterator", None)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        deadline = None
        if within_s is not None and getattr(iterator, "_workers", None):
            deadline = threading.Timer(within_s, _terminate_stragglers, args=(iterator, within_s))
            deadline.daemon = True
            deadline.start()
        try:
            shutdown()
        finally:
            if deadline is not None:
                deadline.cancel()
                deadline.join()
    if iterator is not None:
        loader._iterator = None
    relay = _LOG_RELAYS.pop(loader, None)
    if relay is not None:
        relay.close()  # after the workers: their last records are relayed first


def _terminate_stragglers(iterator: Any, within_s: float) -> None:
    # By pid: Process.is_alive() would read the worker's sentinel, which the main thread's join
    # is reading at the same time (a forkserver worker's exit status is read once).
    stragglers = []
    for worker in iterator._workers:
        try:
            os.kill(worker.pid, 0)
        except (ProcessLookupError, TypeError):
            continue  # gone already (or never started)
        stragglers.append(worker.pid)
    if not stragglers:
        return
    # As torch's own shutdown does before it terminates a worker (the main thread is still joining
    # one): forget the workers' pids, so that torch's SIGCHLD handler does not report a failure.
    if getattr(iterator, "_worker_pids_set", False):
        from torch.utils.data._utils import signal_handling

        iterator._worker_pids_set = False
        with contextlib.suppress(RuntimeError):  # the main thread got there first
            signal_handling._remove_worker_pids(id(iterator))
    for pid in stragglers:
        logger.warning("DataLoader worker (pid %s) still running %.1f s after the shutdown began: terminated", pid, within_s)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def check_main_guard(context: multiprocessing.context.BaseContext) -> None:
    """End the script with one line (``lerobot_nodes.workers.main_guard``) if the workers ``context``
    starts would run the main script again and the caller runs at its top level without
    ``if __name__ == "__main__":``. Workers forked from a copy of this process (``fork``, or the
    workers' server while it is a fork) do not run it again: an unguarded script works with them."""
    if context.get_start_method() == "fork":
        return
    if isinstance(context, WorkerContext) and SERVER.workers_share_main():
        return
    where = unguarded_main_line()
    if where is not None:
        fail_missing_guard(missing_guard_message(*where, context.get_start_method()))


def start_worker_context() -> multiprocessing.context.BaseContext:
    """Start the process DataLoader workers are forked from now, rather than at the first ``iter()``.

    Called while this process runs no other thread, it forks this process into the workers'
    server (``lerobot_nodes.workers.server``): workers then arrive with torch, PyAV and this
    package imported, instead of waiting for a new interpreter to import them (about 2 s here).
    The first ``StreamingLeRobotDataset`` built does the same (and stops the server again if the
    dataset is read without workers); call this earlier when something before the dataset starts
    threads (a logger's, a Hub client's). ``lerobot-nodes train`` and ``stream`` and the
    ``lerobot-train`` drop-in call it when ``--num_workers`` > 0. Idempotent; returns
    :func:`worker_context`. With ``spawn`` (no forkserver) it does nothing.
    """
    context = worker_context()
    if isinstance(context, WorkerContext):
        context.start_server()
    return context


def worker_context() -> multiprocessing.context.BaseContext:
    """How DataLoader workers start: from a server process, never forked from a busy training process.

    A worker forked from the training process once it has decoded video inherits FFmpeg
    decoders whose threads stayed in the parent, and freeing them crashes the worker (LeRobot
    trains with ``spawn`` for this reason). Workers are forked from a server instead: a copy
    of this process made while it is still plain (:func:`start_worker_context`), or else a new
    interpreter importing this package, which also makes the server end with the process that
    started it (``lerobot_nodes.workers.lifeline``). ``spawn`` where there is no forkserver.
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        return WORKER_CONTEXT
    return multiprocessing.get_context("spawn")
