"""SIGTERM and SIGINT end a command through its ``finally`` blocks, not mid-air.

``kill``, SLURM and ``docker stop`` send SIGTERM, whose default action ends the process
without running any cleanup; Ctrl-C raises ``KeyboardInterrupt`` with a traceback. Inside
:func:`stopping_on_signals` either signal raises :class:`Stopped` on the main thread instead,
so the command shuts its DataLoader down and the caller prints one line and exits with
128 + the signal number, as a shell reports a process killed by that signal. A second signal
while shutting down gets the default action (an impatient second Ctrl-C ends at once; the
workers and forkserver still end with the process, see ``lerobot_nodes.workers.lifeline``).
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

HANDLED = (signal.SIGTERM, signal.SIGINT)
RECEIVING_FROM_WORKERS = (
    "/multiprocessing/resource_sharer.py",
    "/multiprocessing/reduction.py",
    "/torch/multiprocessing/reductions.py",
)
"""Code that takes a batch's tensors from a DataLoader worker, one file descriptor per tensor."""

IN_FINALIZER = ("/weakref.py",)
"""Where an exception is printed and dropped instead of raised: ``weakref.finalize`` callbacks
(a received batch's release runs in one, lerobot_nodes.batch_memory.recycled_storage)."""

WORKERS_STOP_WITHIN_S = 2.0
"""After a stop signal, DataLoader workers still running this long into the shutdown are terminated
(torch would wait 5 s for each)."""

_deferred: list[int] = []


class Stopped(BaseException):
    """A termination signal arrived. A ``BaseException``, like ``KeyboardInterrupt``, so that
    ``except Exception`` blocks let it through."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.detail = ""

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def message(self, command: str) -> str:
        detail = f" {self.detail}" if self.detail else ""
        return f"{command}: stopped by {signal.Signals(self.signum).name}{detail}"


def _must_not_raise_here(frame: FrameType | None) -> bool:
    """Whether the main thread is taking a tensor from a worker, or running a finalizer.

    Breaking the first handshake off makes the worker's descriptor-sharing thread print a
    ``BrokenPipeError`` traceback while the loader shuts down; an exception raised in a
    finalizer is printed and lost. Both last milliseconds, so the stop waits for the next
    batch (:func:`raise_if_stopped`).
    """
    while frame is not None:
        if frame.f_code.co_filename.replace("\\", "/").endswith(RECEIVING_FROM_WORKERS + IN_FINALIZER):
            return True
        frame = frame.f_back
    return False


def _stop(signum: int, frame: FrameType | None) -> None:
    for handled in HANDLED:
        signal.signal(handled, signal.SIG_DFL)
    # Recorded either way: should the raise below still be swallowed somewhere (a ``__del__``),
    # the loop's next raise_if_stopped() stops.
    _deferred.append(signum)
    if _must_not_raise_here(frame):
        return
    raise Stopped(signum)


STACK_DUMP_SIGNAL: int | None = getattr(signal, "SIGUSR2", None)
"""``kill -USR2 <pid>`` prints the Python stack of every thread of a running command to stderr.
Registered before DataLoader workers are forked, so their stacks come too (SIGUSR1 is left alone:
SLURM sends it ahead of a time limit)."""


def dump_stacks_on_signal() -> None:
    """Print every thread's Python stack on :data:`STACK_DUMP_SIGNAL` (where the platform has it)
    to stderr; a no-op where stderr has no file descriptor (a command run inside a test's capture)."""
    if STACK_DUMP_SIGNAL is None or threading.current_thread() is not threading.main_thread():
        return
    try:
        faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
    except (AttributeError, ValueError, OSError, RuntimeError):  # io.UnsupportedOperation is both of the last two
        return


def raise_if_stopped() -> None:
    """Raise the :class:`Stopped` of a signal that arrived while a batch was being received."""
    if _deferred:
        raise Stopped(_deferred.pop())


@contextmanager
def stopping_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise :class:`Stopped` (main thread only).

    Loops that take batches from DataLoader workers call :func:`raise_if_stopped` once per
    batch, for a signal that arrived while a batch was being received.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # Python delivers signals to the main thread only; leave its handlers alone
        return
    _deferred.clear()
    previous = {signum: signal.signal(signum, _stop) for signum in HANDLED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_until_stopped(command: Callable[[], int], name: str) -> int:
    """Run ``command`` within :func:`stopping_on_signals`; a stop prints one line on stderr,
    ``NAME: stopped by SIGTERM[ detail]``, and returns 128 + the signal (143, 130)."""
    with stopping_on_signals():
        try:
            code = command()
            raise_if_stopped()  # a signal deferred while the last batch was received
            return code
        except Stopped as stop:
            print(stop.message(name), file=sys.stderr)
            return stop.exit_code
