"""The process DataLoader workers are forked from: a fork of the training process, made early.

A forkserver started the stdlib way is a new interpreter that imports torch, PyAV and this
package before it forks its first worker: about 2 s here, the better part of the time to
the first batch. The training process has imported all of that already, so
:class:`ForkedServer` forks it instead and runs the stdlib forkserver loop in the copy.
Workers are still forked from that server, one request each, exactly as with
``forkserver`` (same wire protocol, same fd passing, same preparation data), and arrive
with every module in place.

A fork is only as clean as the process it copies, so the server is forked only when the copy
is safe, and started the stdlib way otherwise:

- the training process runs no other thread (a lock one of them holds would stay locked in
  every worker) and has not initialised CUDA;
- the copy holds no open FFmpeg codec context (freeing one whose threads stayed behind
  crashes a worker): if it does, it turns itself into the stdlib forkserver with ``exec``.

The first :class:`~lerobot_nodes.dataset.StreamingLeRobotDataset` built starts it
(:func:`start_before_threads`), before it opens a file system (s3fs starts an event-loop thread) or
runs a thread of its own; :func:`lerobot_nodes.loader.start_worker_context` starts it earlier still.
A server the dataset started that turns out to be unneeded (the dataset is read without workers
first) is stopped (:func:`retire_unused_server`), so a run without workers keeps no extra process. The server's Python signal handlers and root
logging handlers are reset to a new interpreter's, its objects are frozen out of the cyclic
garbage collector (nothing inherited is ever freed by a worker's collection, and pages stay
shared), and it ends with the process that started it (:mod:`lerobot_nodes.workers.lifeline`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from multiprocessing import connection as _connection
from multiprocessing import forkserver, popen_forkserver, resource_tracker, spawn
from multiprocessing import reduction as _reduction
from multiprocessing import util as _util
from multiprocessing.context import (
    ForkServerContext,
    ForkServerProcess,
    get_spawning_popen,
    set_spawning_popen,
)
from typing import Any

from .lifeline import guard_server
from .main_guard import reimporting_main

logger = logging.getLogger("lerobot_nodes.workers.server")

# The stdlib's own forkserver helpers, which typeshed leaves out.
connection: Any = _connection
reduction: Any = _reduction
util: Any = _util

PRELOAD = ["lerobot_nodes.dataset"]
"""What a forkserver started the stdlib way imports before it forks a worker."""
IMPORTED_BEFORE_THE_FORK = ("torchdata.stateful_dataloader", "pyarrow.parquet", "numpy.random")
"""What :func:`start_before_threads` imports first: what every DataLoader worker imports before its
first batch (the worker loop, the Parquet reader, and ``numpy.random``, which torch's worker loop
imports to seed it and the schedule draws from: 4-10 ms per worker) and the training process imports
moments later anyway, so the server holds it once for every worker (shared pages) instead of each
worker importing it."""


FORK_SAFE_ATTRIBUTE = "lerobot_nodes_fork_safe"
"""A thread with this attribute set true holds no lock while it waits (a blocking ``read`` of a pipe),
so a fork made beside it is as clean as one made alone (the command's stop watchdog,
``lerobot_nodes.cli.signals.StopWatchdog``); the copy has no such thread."""


def fork_blocker() -> str | None:
    """Why the calling process must not be forked into a server now, or None if it may be."""
    if sys.version_info >= (3, 14):
        return "Python 3.14 forkserver handshake (an authentication key) is not reproduced by the fork"
    threads = [
        thread.name
        for thread in threading.enumerate()
        if thread is not threading.main_thread() and not getattr(thread, FORK_SAFE_ATTRIBUTE, False)
    ]
    if threads:
        return f"threads running: {', '.join(sorted(threads))}"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised"
    return None


def open_codec_contexts() -> int:
    """How many PyAV codec contexts this process holds (0 when PyAV was never imported).

    The server's copy asks this right after the fork, while the training process waits for it
    to serve. Where PyAV's codec context classes are heap types (Cython 3 builds), every instance
    refers to its class, so the instances are among the class's referrers
    (:func:`_codec_contexts_by_referrers`): the walk only reads the heap, where listing every object
    (:func:`gc.get_objects`) writes each one's reference count, which in a fresh fork copies every
    page of the heap (measured: 40-55 ms and ~48 MB of private memory in the copy, against 20-28 ms
    and none). Both count the same instances; other builds take the list."""
    if "av" not in sys.modules:
        return 0
    from av.codec.context import CodecContext

    classes = _subclasses(CodecContext)
    if all(cls.__flags__ & HEAP_TYPE for cls in classes):
        return _codec_contexts_by_referrers(classes)
    # type() and issubclass, not isinstance: isinstance reads __class__, which some lazy
    # module proxies answer with a warning.
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), CodecContext))


HEAP_TYPE = 1 << 9
"""``Py_TPFLAGS_HEAPTYPE``: an instance of such a class holds (and its traversal visits) a reference to it."""


def _subclasses(cls: type) -> list[type]:
    """``cls`` and every class derived from it, at any depth."""
    found, pending = [], [cls]
    while pending:
        current = pending.pop()
        found.append(current)
        pending.extend(current.__subclasses__())
    return found


def _codec_contexts_by_referrers(classes: list[type]) -> int:
    """The instances of ``classes`` (heap types: each instance's traversal visits its class) that the
    garbage collector tracks, found as the classes' referrers. The referrers also hold the classes'
    own dicts, MROs and descriptors, which are not instances."""
    return sum(1 for obj in gc.get_referrers(*classes) if type(obj) in classes)


class ForkedServer(forkserver.ForkServer):
    """A ``multiprocessing`` forkserver made by forking the process that starts it.

    Falls back to the stdlib start (a new interpreter preloading :data:`PRELOAD`) where
    :func:`fork_blocker` names a reason. ``forked`` says how the running server started.
    """

    _forkserver_address: Any
    _forkserver_alive_fd: int | None
    _forkserver_pid: int | None
    _lock: threading.Lock
    _preload_modules: list[str]

    def __init__(self) -> None:
        super().__init__()
        self._preload_modules = list(PRELOAD)
        self.forked = False
        self.wanted = False
        """Asked for by a DataLoader with workers (``WorkerContext.start_server``), not only started early."""
        self.workers_started = 0
        self.retired = False
        """:func:`retire_unused_server` stopped one: :func:`start_before_threads` starts no other."""
        self.forking = False
        """This server's own fork is under way (``os.fork``'s hooks must leave it alone)."""
        self._kept_modules_r: int | None = None
        self._keeps_modules: bool | None = None

    def connect_to_new_process(self, fds: Any) -> Any:
        self.workers_started += 1
        return super().connect_to_new_process(fds)

    def workers_share_main(self) -> bool:
        """Whether the workers of the running server see this process's ``__main__`` as it is, so that
        multiprocessing does not run the main script again in each of them (``spawn.prepare``): true of
        a fork that kept this process's modules, false of a new interpreter (stdlib start, or a copy that
        replaced itself because it held an open codec). False when no server runs."""
        if self._forkserver_pid is None or not self.forked:
            return False
        if self._keeps_modules is None and self._kept_modules_r is not None:
            # The copy writes one byte once it has decided to stay (a few ms after the fork); an
            # exec closes the pipe instead.
            self._keeps_modules = os.read(self._kept_modules_r, 1) == KEPT_MODULES
            os.close(self._kept_modules_r)
            self._kept_modules_r = None
        return bool(self._keeps_modules)

    def stop(self) -> bool:
        """Stop the running server now; workers it forked end with it. False, doing nothing, when
        none runs or another thread is starting or stopping it (never waits for that thread: an
        ``os.fork`` hook may call this)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            pid = self._forkserver_pid
            if pid is None:
                return False
            if self._forkserver_alive_fd is not None:
                os.close(self._forkserver_alive_fd)  # the stdlib loop's way to stop: EOF on "alive"
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # a copy still importing before its loop, or exec'ing
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            self._forget_server()
            return True
        finally:
            self._lock.release()

    def _forget_server(self) -> None:
        if self._kept_modules_r is not None:
            os.close(self._kept_modules_r)
        address = self._forkserver_address
        if isinstance(address, str) and not util.is_abstract_socket_namespace(address):
            with contextlib.suppress(OSError):
                os.unlink(address)
        self._forkserver_address = self._forkserver_alive_fd = self._forkserver_pid = None
        self._kept_modules_r = self._keeps_modules = None
        self.forked = False

    def ensure_running(self) -> None:
        blocker = fork_blocker()
        if blocker is not None:
            running = self._forkserver_pid
            super().ensure_running()
            if self._forkserver_pid != running:
                self.forked = False
                logger.debug("DataLoader workers start from a new forkserver process (%s)", blocker)
            return
        with self._lock:
            resource_tracker.ensure_running()  # before the fork: server and workers share it
            if self._forkserver_pid is not None:
                pid, _ = os.waitpid(self._forkserver_pid, os.WNOHANG)
                if not pid:
                    return
                if self._forkserver_alive_fd is not None:
                    os.close(self._forkserver_alive_fd)
                self._forget_server()
            with socket.socket(socket.AF_UNIX) as listener:
                address = connection.arbitrary_address("AF_UNIX")
                listener.bind(address)
                if not util.is_abstract_socket_namespace(address):
                    os.chmod(address, 0o600)
                listener.listen()
                # Every worker holds the write end of "alive"; the server stops at its EOF.
                alive_r, alive_w = os.pipe()
                kept_r, kept_w = os.pipe()  # not inherited by an exec: EOF says the copy replaced itself
                for stream in (sys.stdout, sys.stderr):
                    if stream is not None:
                        stream.flush()  # or the server and every worker would print it again
                # Everything alive now is shared with the copy page by page. The collector's full
                # passes in this process write into every object they walk, so each one would copy
                # those pages here (tens of MB with 2 workers over S3); frozen objects are not walked.
                gc.freeze()
                self.forking = True
                try:
                    pid = os.fork()
                except BaseException:
                    for fd in (alive_r, alive_w, kept_r, kept_w):
                        os.close(fd)
                    raise
                finally:
                    self.forking = False
                if pid == 0:
                    os.close(kept_r)
                    _serve(listener.fileno(), alive_r, alive_w, kept_w)  # never returns
                os.close(alive_r)
                os.close(kept_w)
            self._forkserver_address = address
            self._forkserver_alive_fd = alive_w
            self._forkserver_pid = pid
            self._kept_modules_r = kept_r
            self._keeps_modules = None
            self.forked = True


KEPT_MODULES = b"k"
"""What the server's copy writes to its parent once it stays a copy (``ForkedServer.workers_share_main``)."""


def _serve(listener_fd: int, alive_r: int, alive_w: int, kept_w: int) -> None:
    """In the fork: become the server, or a stdlib forkserver if the copy is unsafe to fork from."""
    code = 0
    try:
        os.close(alive_w)
        SERVER._lock = threading.Lock()  # forked while held: a fresh one for this process and its workers
        guard_server()
        gc.unfreeze()  # frozen before the fork: back where the referrer walk looks (frozen again below)
        if open_codec_contexts():
            _exec_stdlib_server(listener_fd, alive_r)
        os.write(kept_w, KEPT_MODULES)
        os.close(kept_w)
        _reset_to_new_interpreter()
        gc.freeze()
        forkserver.main(listener_fd, alive_r, preload=[])
    except SystemExit:
        pass  # the stdlib loop's way to say every client has gone
    except BrokenPipeError:
        pass  # the training process ended (an error right after the fork) or retired this copy before it served
    except BaseException:
        code = 1
        try:
            sys.excepthook(*sys.exc_info())
            sys.stderr.flush()
        except BaseException:
            pass
    finally:
        os._exit(code)  # never the training process's atexit handlers or buffers


def _exec_stdlib_server(listener_fd: int, alive_r: int) -> None:
    """Replace this copy with the stdlib forkserver on the same socket and pipe (never returns)."""
    for fd in (listener_fd, alive_r):
        os.set_inheritable(fd, True)
    command = f"from multiprocessing.forkserver import main; main({listener_fd}, {alive_r}, {PRELOAD!r}, sys_path={sys.path!r})"
    executable = spawn.get_executable()
    os.execv(executable, [executable, *util._args_from_interpreter_flags(), "-c", command])


def _reset_to_new_interpreter() -> None:
    """Signal handlers and root logging handlers as a new interpreter has them."""
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    for log_handler in list(logging.root.handlers):
        logging.root.removeHandler(log_handler)


SERVER = ForkedServer()
"""The one server of this process (a worker that starts workers of its own gets its own)."""


class _Popen(popen_forkserver.Popen):
    """``popen_forkserver.Popen`` asking :data:`SERVER` instead of the stdlib's forkserver."""

    _fds: list[int]

    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        buffer = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buffer)
            reduction.dump(process_obj, buffer)
        finally:
            set_spawning_popen(None)
        self.sentinel, data_w = SERVER.connect_to_new_process(self._fds)
        # A duplicate of the data pipe's write end: the child's sentinel of this process.
        parent_w = os.dup(data_w)
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
        with open(data_w, "wb", closefd=True) as pipe:
            pipe.write(buffer.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class ServerProcess(ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:
        return _Popen(process_obj)


class WorkerContext(ForkServerContext):
    """A ``forkserver`` multiprocessing context whose server is :data:`SERVER`."""

    Process = ServerProcess  # type: ignore[assignment]

    def start_server(self) -> None:
        SERVER.wanted = True
        SERVER.ensure_running()


def start_before_threads(imports: Sequence[str] = ()) -> bool:
    """Fork :data:`SERVER` now, if this process may still be forked; True if a forked server runs.

    For the first dataset a process builds, before it opens a file system or starts a thread: then
    the server is a copy of this process and DataLoader workers need no new interpreter. Imports
    :data:`IMPORTED_BEFORE_THE_FORK` and ``imports`` (e.g. the file system the dataset opens next;
    one that fails to import is left to fail where it is used) first. A no-op where there is no
    forkserver, in a daemonic process (a DataLoader worker: it cannot start workers), while a
    multiprocessing child runs the main script again (:mod:`lerobot_nodes.workers.main_guard`), and
    where :func:`fork_blocker` names a reason: workers then get the stdlib start, as before. Once
    :func:`retire_unused_server` has stopped one, it starts no other (a process that reads datasets
    without workers does not fork once per dataset).
    """
    if SERVER._forkserver_pid is not None:
        return SERVER.forked
    if SERVER.retired:  # this process reads datasets without workers: no fork per dataset
        return False
    if (
        "forkserver" not in multiprocessing.get_all_start_methods()
        or multiprocessing.current_process().daemon
    ):
        return False
    if reimporting_main() or fork_blocker() is not None:
        return False
    for name in (*IMPORTED_BEFORE_THE_FORK, *imports):
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    if fork_blocker() is not None:  # an import started a thread
        return False
    SERVER.ensure_running()
    return SERVER.forked


NATIVE_SCHEMES = ("http", "https", "hf", "file", "s3", "s3a")
"""Root schemes this package reads itself, not through an fsspec file system."""


def filesystem_modules(root: object) -> list[str]:
    """The module of the fsspec file system a dataset ``root`` (``s3://...``) is read through, to import
    before the fork (``s3fs`` takes about 0.5 s to import: once, not once per worker); [] for others.
    A list or tuple of roots (a mixture) gives each one's."""
    if isinstance(root, (list, tuple)):
        return sorted({name for part in root for name in filesystem_modules(part)})
    if not isinstance(root, str) or "://" not in root:
        return []
    scheme = root.split("://", 1)[0].lower()
    if scheme in NATIVE_SCHEMES:
        return []
    from fsspec.registry import known_implementations

    class_path = known_implementations.get(scheme, {}).get("class", "")
    return [class_path.rsplit(".", 1)[0]] if "." in class_path else []


def spawning_elsewhere() -> bool:
    """Whether a process is being started right now (its arguments pickled) by a start method other
    than :data:`SERVER`'s: a plain DataLoader's ``spawn`` or stdlib ``forkserver`` workers."""
    popen = get_spawning_popen()
    return popen is not None and not isinstance(popen, _Popen)


def retire_unused_server() -> bool:
    """Stop :data:`SERVER` if only :func:`start_before_threads` wanted it and it has started no worker.

    Called where a dataset turns out to be read without workers (its graph built in the training
    process, ``streaming_dataloader(num_workers=0)``) or by workers of another start method
    (:func:`spawning_elsewhere`, or any ``os.fork`` but the server's own: ``fork`` workers), so such
    a run keeps no extra process. True if it stopped one. A
    DataLoader that wants workers later starts a server again (a new interpreter, if threads run by then).
    """
    if SERVER._forkserver_pid is None or SERVER.wanted or SERVER.workers_started or not SERVER.stop():
        return False
    SERVER.retired = True
    return True


def _retire_before_another_fork() -> None:
    # A fork this server does not make: a plain DataLoader's "fork" workers (torch's default on
    # Linux before Python 3.14), which never need the server.
    if not SERVER.forking:
        retire_unused_server()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_retire_before_another_fork)

CONTEXT = WorkerContext()
