"""Processes started for a training process end when it ends.

A DataLoader started with ``forkserver`` leaves three kinds of processes behind when the
training process dies without shutting it down (SIGKILL, a SIGTERM nobody handles, a
crash): the workers, the forkserver and multiprocessing's resource tracker. Nothing stops
them soon. torch's worker watchdog compares ``os.getppid()`` with the worker's parent, and
a forkserver worker's parent is the server, not the training process; the server exits
only when every worker has closed its end of a pipe they all share; the tracker exits only
when the trainer, the server and every worker have closed theirs. Each waits for another.

This module breaks the cycle from both ends:

- :func:`guard_worker`, in every DataLoader worker (installed by
  :class:`GuardedWorkerInit` and by the dataset when a worker builds its graph): a daemon
  thread waits on the training process itself and ends the worker with ``os._exit`` the
  moment it is gone. A worker forked by a forkserver also asks Linux for SIGKILL when the
  server dies (``PR_SET_PDEATHSIG``), which ends it even when its own threads are stuck.
- :func:`guard_server`, in the process workers are forked from (the forkserver runs it when
  it preloads ``lerobot_nodes.dataset``, :mod:`lerobot_nodes.workers.server` right after its
  fork): the same wait on the process that started the server.

Once they are gone the resource tracker's pipe closes, so it unlinks the shared-memory
segments and semaphores the training process registered (a killed process never unlinks
its own) and exits. Everything happens within about a second of the training process's death.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait

ORPHAN_EXIT_CODE = 128 + signal.SIGKILL
"""Exit status of a process ended because the training process is gone (as if SIGKILLed)."""
POLL_INTERVAL_S = 0.25
"""How often the parent is polled where Linux pidfds are unavailable."""
PR_SET_PDEATHSIG = 1

_guarded_pid: int | None = None
"""The process whose guard is running (module state survives fork, so the pid tells)."""
_claim_lock = threading.Lock()
_stack_dump_signals: set[int] = set()
"""Signals :func:`dump_stacks_on` registered in this process, registered again in its workers."""


def set_parent_death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent *thread* exits.

    The kernel tracks the thread that forked, not the process: only safe where that thread
    lives as long as the parent does (a forkserver forks from its main loop). False where
    unsupported.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (Linux >= 5.3), else ``None``."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:  # the process is gone already, or the kernel has no pidfds
        return None


def _claim() -> bool:
    """True the first time it is called in this process: the caller starts its guard."""
    global _guarded_pid
    with _claim_lock:
        if _guarded_pid == os.getpid():
            return False
        _guarded_pid = os.getpid()
        return True


def _exit_when(handles: list[int], alive: Callable[[], bool], name: str) -> None:
    """End this process once any of ``handles`` is readable (or, with none, once ``alive()`` is False).

    ``os._exit`` skips interpreter shutdown on purpose: it would wait for the threads of a
    graph whose consumer no longer exists.
    """

    def run() -> None:
        if handles:
            wait(handles)
        else:
            while alive():
                time.sleep(POLL_INTERVAL_S)
        os._exit(ORPHAN_EXIT_CODE)

    threading.Thread(target=run, name=name, daemon=True).start()


def guard_worker() -> bool:
    """End this multiprocessing child as soon as the process that started it is gone.

    For DataLoader workers (spawn, forkserver or fork). A no-op, returning False, outside a
    multiprocessing child and when this process is already guarded. If the training process
    is already gone, the worker exits at once.
    """
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None or not _claim():
        return False
    forked_by = os.getppid()
    if forked_by != parent.pid and set_parent_death_signal(signal.SIGKILL) and os.getppid() != forked_by:
        os._exit(ORPHAN_EXIT_CODE)  # the forkserver died before the request took effect
    # multiprocessing's sentinel: the read end of a pipe only the training process writes to.
    sentinel = getattr(parent, "_sentinel", None)
    handles = [sentinel] if isinstance(sentinel, int) else []
    pidfd = _pidfd(parent.pid)
    if pidfd is not None:
        # A fork-started sibling inherits the trainer's end of that pipe and would keep the
        # sentinel quiet; the pidfd does not care. (Opened before the liveness check below,
        # so it cannot name a recycled pid.)
        handles.append(pidfd)
    if handles and wait(handles, timeout=0):
        os._exit(ORPHAN_EXIT_CODE)
    _exit_when(handles, lambda: os.getppid() == forked_by, "lerobot-nodes-worker-lifeline")
    return True


def _imported_by_forkserver() -> bool:
    """Whether the caller runs in a forkserver's preload imports, not in a process it forked.

    Both have ``multiprocessing.forkserver.main`` on their stack (a forked child returns
    through it); only a child also has ``_serve_one``, which is nearer the top.
    """
    from multiprocessing import forkserver

    server_main = forkserver.main.__code__
    serve_child = forkserver._serve_one.__code__  # type: ignore[attr-defined]
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is serve_child:
            return False
        if frame.f_code is server_main:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def guard_forkserver() -> bool:
    """In a forkserver's preload import: end the server as soon as the process that started it is gone.

    A no-op, returning False, in any other process. Its workers go with it (their
    parent-death signal), and it forks from its main thread, so its watch thread is never
    copied into a worker.
    """
    if not _imported_by_forkserver():
        return False
    return guard_server()


def guard_server() -> bool:
    """In a process that forks DataLoader workers: end it as soon as the process that started it is gone.

    For the forkserver (:func:`guard_forkserver`) and for ``lerobot_nodes.workers.server``'s
    fork of the training process. False when this process is already guarded.
    """
    if not _claim():
        return False
    starter = os.getppid()
    pidfd = _pidfd(starter)
    if os.getppid() != starter:  # the starter died (and its pid may be reused): stop now
        os._exit(ORPHAN_EXIT_CODE)
    _exit_when([pidfd] if pidfd is not None else [], lambda: os.getppid() == starter, "lerobot-nodes-forkserver-lifeline")
    return True


def dump_stacks_on(signum: int) -> bool:
    """On ``signum``, print the Python stack of every thread to stderr (``faulthandler``), in this
    process and in every DataLoader worker a :class:`GuardedWorkerInit` made after this call starts.

    A worker forked from a copy of this process would inherit the handler, but one from a new
    interpreter (a stdlib forkserver, spawn) would not, and the signal's default action would end it:
    so the worker registers it itself. False where it cannot be registered (no such signal, or
    stderr has no file descriptor, as inside a test's capture).
    """
    try:
        faulthandler.register(signum, all_threads=True)
    except (AttributeError, ValueError, OSError, RuntimeError):  # io.UnsupportedOperation is both of the last two
        return False
    _stack_dump_signals.add(signum)
    return True


class GuardedWorkerInit:
    """A DataLoader ``worker_init_fn``: :func:`guard_worker`, the training process's
    :func:`dump_stacks_on` signals, then the user's own function.

    Picklable whenever the wrapped function is, as spawn and forkserver require.
    """

    def __init__(self, worker_init_fn: Callable[[int], None] | None = None) -> None:
        self.worker_init_fn = worker_init_fn
        self.stack_dump_signals = tuple(sorted(_stack_dump_signals))

    def __call__(self, worker_id: int) -> None:
        guard_worker()
        for signum in getattr(self, "stack_dump_signals", ()):
            with contextlib.suppress(AttributeError, ValueError, OSError, RuntimeError):
                faulthandler.register(signum, all_threads=True)
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
