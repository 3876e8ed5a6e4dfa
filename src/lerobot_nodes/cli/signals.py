"""SIGTERM and SIGINT end a command through its ``finally`` blocks, not mid-air.

``kill``, SLURM and ``docker stop`` send SIGTERM, whose default action ends the process
without running any cleanup; Ctrl-C raises ``KeyboardInterrupt`` with a traceback. Inside
:func:`stopping_on_signals` either signal raises :class:`Stopped` on the main thread instead,
so the command shuts its DataLoader down and the caller prints one line and exits with
128 + the signal number, as a shell reports a process killed by that signal. A second signal
while shutting down gets the default action (an impatient second Ctrl-C ends at once; the
workers and forkserver still end with the process, see ``lerobot_nodes.workers.lifeline``).

A Python signal handler runs only between bytecodes of the main thread, so a main thread blocked
inside C code (a Parquet read under a tight ``ulimit -v``, a lock a failed thread start left
behind) would never see the signal. :class:`StopWatchdog` bounds that: the C-level handler wakes
a watchdog thread through ``signal.set_wakeup_fd``, and a command still running
:data:`STOP_GRACE_S` after the signal ends with the same line and exit code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from ..workers.lifeline import dump_stacks_on
from ..workers.server import FORK_SAFE_ATTRIBUTE

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

STOP_GRACE_S = 5.0
"""How long after SIGTERM/SIGINT a command may still run (its shutdown included) before the
watchdog ends the process."""

_deferred: list[int] = []
_owner = [os.getpid()]
"""The process whose command :func:`stopping_on_signals` guards (a fork inherits the handler, not the command)."""


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
    if os.getpid() != _owner[0]:
        # A fork that inherited the handler (the worker server, a forked DataLoader worker) ends
        # as the signal's default action would, instead of raising in whatever code it runs.
        os.kill(os.getpid(), signum)
        return
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
    dump_stacks_on(STACK_DUMP_SIGNAL)  # and in DataLoader workers, whichever way they start


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
    _owner[0] = os.getpid()
    previous = {signum: signal.signal(signum, _stop) for signum in HANDLED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class StopWatchdog:
    """Ends the process :data:`STOP_GRACE_S` after a handled signal if the command has not ended by then.

    Guarantees: it never acts before a signal arrives, nor once :meth:`close` has run (the
    command returned); when it acts, it prints ``NAME: stopped by SIGTERM`` plus what it waited
    for on stderr and ends the process with 128 + the signal, like the normal path. Where a
    thread cannot be started (a thread or memory limit), it stays off and the command runs as
    before.
    """

    def __init__(self, name: str, grace_s: float = STOP_GRACE_S) -> None:
        self._name = name
        self._grace_s = grace_s
        self._done = threading.Event()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # the C-level handler must never block
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="lerobot-nodes-stop-watchdog", daemon=True)
        setattr(self._thread, FORK_SAFE_ATTRIBUTE, True)  # waits in os.read or Event.wait, holding no lock
        try:
            self._thread.start()
        except RuntimeError:  # can't start new thread: the limit the command will report itself
            self._restore()

    def _watch(self) -> None:
        # Every signal with a Python handler writes its number (torch's SIGCHLD handler too); 0 is close().
        signum = 0
        while signum not in HANDLED:
            try:
                received = os.read(self._read_fd, 1)
            except OSError:
                return
            if not received or received[0] == 0 or self._done.is_set():
                return
            signum = received[0]
        if self._done.wait(self._grace_s):
            return
        with contextlib.suppress(OSError, ValueError):
            print(
                f"{self._name}: stopped by {signal.Signals(signum).name} (the command did not end within "
                f"{self._grace_s:g} s of the signal; ended without its cleanup)",
                file=sys.stderr,
                flush=True,
            )
        os._exit(128 + signum)

    def _restore(self) -> None:
        with contextlib.suppress(ValueError):  # not the main thread any more: nothing was set
            signal.set_wakeup_fd(self._previous_fd)
        for fd in (self._write_fd, self._read_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        """The command ended: the watchdog never acts after this."""
        self._done.set()
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"\0")  # wakes the watchdog (0 is no signal) so it returns
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)
        self._restore()


def _forget_wakeup_fd() -> None:
    # A forked copy (the worker server, DataLoader workers) must not wake the parent's watchdog
    # with its own signals (torch terminates workers with SIGTERM).
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_wakeup_fd)


@contextmanager
def stop_watchdog(name: str, grace_s: float = STOP_GRACE_S) -> Iterator[None]:
    """A :class:`StopWatchdog` for the block (main thread only; elsewhere signals never arrive)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watchdog = StopWatchdog(name, grace_s)
    try:
        yield
    finally:
        watchdog.close()


def run_until_stopped(command: Callable[[], int], name: str) -> int:
    """Run ``command`` within :func:`stopping_on_signals`; a stop prints one line on stderr,
    ``NAME: stopped by SIGTERM[ detail]``, and returns 128 + the signal (143, 130). A command
    that does not end within :data:`STOP_GRACE_S` of the signal is ended by :class:`StopWatchdog`."""
    with stopping_on_signals(), stop_watchdog(name):
        try:
            code = command()
            raise_if_stopped()  # a signal deferred while the last batch was received
            return code
        except Stopped as stop:
            print(stop.message(name), file=sys.stderr)
            return stop.exit_code
