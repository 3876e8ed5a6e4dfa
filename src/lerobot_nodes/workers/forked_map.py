"""Map a function over items in forked child processes, each child a contiguous range of them.

For CPU-bound work that holds the GIL part of the time (the ``meta/episodes`` parse: pyarrow
frees each parsed footer, ~200,000 small C++ objects, with the GIL held), where threads cannot
use more than one core. :func:`forked_map` guarantees:

* the result is ``[function(item) for item in items]``, in item order; each result is pickled
  back through a pipe as soon as it is computed and dropped by the child, so a child holds one
  result at a time (results kept alive between items would pin the C heap a parse frees, and
  make every later parse slower);
* an error raises the first exception in item order, as the child raised it (pickled back: the
  same type and message; its traceback is lost) or, when it cannot be pickled, a
  :class:`ForkedChildError` naming its type and message; a child stops at its first error, children
  of later ranges may have run further;
* a ``fork`` or ``pipe`` that fails (``ulimit -u``, ``-v``, ``-n``) raises :class:`ForkRefusedError` before
  any result is used, the children already forked killed and reaped;
* no child outlives the call: each child is killed (``SIGKILL``) by the kernel if the thread that
  forked it exits (``PR_SET_PDEATHSIG``), and the call kills and reaps every child it started
  before it returns or raises, whatever it raises (``KeyboardInterrupt`` too);
* a child never returns into the caller's code: it leaves with ``os._exit`` (no ``atexit``
  handlers, no flush of inherited stdio buffers, no finalizers run twice).

It forks: call it only where forking is safe (:func:`lerobot_nodes.workers.server.fork_blocker`
returns ``None``: no other threads, whose locks a child would inherit held), on Linux.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import selectors
import signal
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import ForkedChildError, ForkRefusedError
from .lifeline import set_parent_death_signal

Item = TypeVar("Item")
Result = TypeVar("Result")


def split_ranges(count: int, parts: int) -> list[range]:
    """``range(count)`` cut into at most ``parts`` contiguous, non-empty ranges of near-equal length, in order."""
    parts = max(1, min(parts, count))
    bounds = [count * i // parts for i in range(parts + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(parts)]


# A child's stream: frames of an 8-byte little-endian length and a pickled (kind, value), kind one of
# _RESULT (a result), _ERROR (the exception that stopped it, its last frame) or _DONE (all sent).
_HEADER = struct.Struct("<Q")
_RESULT, _ERROR, _DONE = 0, 1, 2
_READ_SIZE = 1 << 20


@dataclass
class _Child:
    pid: int
    fd: int
    """The read end of the pipe the child sends its results through."""
    span: range
    results: list[Any] = field(default_factory=list)
    error: BaseException | None = None
    ended: bool = False
    """Whether its last frame (_ERROR or _DONE) arrived."""
    pending: bytearray = field(default_factory=bytearray)
    status: int | None = None
    """Its wait status once reaped (its pid may then be reused: never signal it again)."""

    def reap(self) -> int:
        if self.status is None:
            self.status = os.waitpid(self.pid, 0)[1]
        return self.status

    def take(self, data: bytes) -> None:
        """Add ``data`` read from the pipe and unpickle every whole frame in what has arrived."""
        self.pending += data
        while len(self.pending) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self.pending)
            if len(self.pending) < _HEADER.size + length:
                return
            kind, value = pickle.loads(memoryview(self.pending)[_HEADER.size : _HEADER.size + length])
            del self.pending[: _HEADER.size + length]
            if kind == _RESULT:
                self.results.append(value)
            else:
                self.error, self.ended = (value if kind == _ERROR else None), True


def forked_map(function: Callable[[Item], Result], items: Sequence[Item], processes: int) -> list[Result]:
    """``[function(item) for item in items]``, computed by up to ``processes`` forked children (see
    the module docstring for what is guaranteed)."""
    children: list[_Child] = []
    received = False
    try:
        try:
            for span in split_ranges(len(items), processes):
                children.append(_fork_child(function, items, span, [child.fd for child in children]))
        except OSError as error:  # the finally kills and reaps the children forked so far
            raise ForkRefusedError(f"cannot start {processes} child processes: {error}") from error
        _receive_all(children)
        received = True
    finally:
        _end_children(children, kill=not received)
    results: list[Result] = []
    for child in children:
        if not child.ended:
            raise ForkedChildError(
                f"the child process for items {child.span.start}..{child.span.stop - 1} ended after "
                f"sending {len(child.results)} results ({_describe(child.reap())})"
            )
        results.extend(child.results)
        if child.error is not None:
            raise child.error
    return results


def _receive_all(children: Sequence[_Child]) -> None:
    """Read every child's pipe to its end, all at once (a child blocks when its pipe is full)."""
    with selectors.DefaultSelector() as selector:
        for child in children:
            selector.register(child.fd, selectors.EVENT_READ, child)
        open_pipes = len(children)
        while open_pipes:
            for key, _ in selector.select():
                child = key.data
                data = os.read(child.fd, _READ_SIZE)
                if data:
                    child.take(data)
                else:  # end of file: the child closed its end (it is exiting)
                    selector.unregister(child.fd)
                    open_pipes -= 1


def _fork_child(
    function: Callable[[Any], Any], items: Sequence[Any], span: range, inherited: Sequence[int]
) -> _Child:
    """Fork a child that runs ``function`` over ``items[span]`` and sends each result into a pipe.
    ``inherited``: the read ends of the children forked before, which it closes."""
    parent = os.getpid()
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except BaseException:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid == 0:  # pragma: no cover - runs in the child, which never returns
        for fd in (read_end, *inherited):
            os.close(fd)
        _child_main(function, items, span, write_end, parent)
    os.close(write_end)
    return _Child(pid, read_end, span)


def _child_main(
    function: Callable[[Any], Any], items: Sequence[Any], span: range, fd: int, parent: int
) -> None:
    code = 1
    try:
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the death signal was armed
            os._exit(1)
        # What the parent built is never garbage here: keep the collector off those objects, so
        # their pages stay shared with the parent instead of being copied when it walks them.
        gc.freeze()
        with os.fdopen(fd, "wb", closefd=True) as pipe:  # buffered: writes loop until whole
            for index in span:
                try:
                    result = function(items[index])
                except BaseException as exc:  # noqa: BLE001 - every error goes back to the parent
                    _send(pipe, _ERROR, exc)
                    break
                if not _send(pipe, _RESULT, result):
                    break
                del result  # before the next item: nothing of this one stays in the heap
            else:
                _send(pipe, _DONE, None)
        code = 0
    finally:
        os._exit(code)


def _send(pipe: Any, kind: int, value: Any) -> bool:
    """One frame into ``pipe``; False if ``value`` did not pickle and a :class:`ForkedChildError` error
    frame went instead (the child's last)."""
    try:
        payload = pickle.dumps((kind, value), protocol=pickle.HIGHEST_PROTOCOL)
        sent = True
    except Exception as exc:  # noqa: BLE001 - the error (or a result) does not pickle
        why = f"{type(value).__name__}: {value}" if kind == _ERROR else f"a result does not pickle: {exc}"
        payload = pickle.dumps((_ERROR, ForkedChildError(why)), protocol=pickle.HIGHEST_PROTOCOL)
        sent = False
    pipe.write(_HEADER.pack(len(payload)))
    pipe.write(payload)
    return sent


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _end_children(children: Sequence[_Child], kill: bool) -> None:
    """Close the children's pipes and reap them all; with ``kill`` (the parent is raising before
    every child sent its results) kill those not reaped yet first, rather than wait for them."""
    for child in children:
        with contextlib.suppress(OSError):
            os.close(child.fd)
        if kill and child.status is None:
            os.kill(child.pid, signal.SIGKILL)  # not reaped: the pid is still our child's
        child.reap()
