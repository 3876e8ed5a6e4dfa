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

:func:`lerobot_nodes.loader.start_worker_context` starts it before a dataset is opened,
when the training process is still plain. The server's Python signal handlers and root
logging handlers are reset to a new interpreter's, its objects are frozen out of the cyclic
garbage collector (nothing inherited is ever freed by a worker's collection, and pages stay
shared), and it ends with the process that started it (:mod:`lerobot_nodes.workers.lifeline`).
"""

from __future__ import annotations

import gc
import io
import logging
import os
import signal
import socket
import sys
import threading
from multiprocessing import connection as _connection
from multiprocessing import forkserver, popen_forkserver, resource_tracker, spawn
from multiprocessing import reduction as _reduction
from multiprocessing import util as _util
from multiprocessing.context import ForkServerContext, ForkServerProcess, set_spawning_popen
from typing import Any

from .lifeline import guard_server

logger = logging.getLogger("lerobot_nodes.workers.server")

# The stdlib's own forkserver helpers, which typeshed leaves out.
connection: Any = _connection
reduction: Any = _reduction
util: Any = _util

PRELOAD = ["lerobot_nodes.dataset"]
"""What a forkserver started the stdlib way imports before it forks a worker."""


def fork_blocker() -> str | None:
    """Why the calling process must not be forked into a server now, or None if it may be."""
    if sys.version_info >= (3, 14):
        return "Python 3.14 forkserver handshake (an authentication key) is not reproduced by the fork"
    threads = [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()]
    if threads:
        return f"threads running: {', '.join(sorted(threads))}"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised"
    return None


def open_codec_contexts() -> int:
    """How many PyAV codec contexts this process holds (0 when PyAV was never imported)."""
    if "av" not in sys.modules:
        return 0
    from av.codec.context import CodecContext

    # type() and issubclass, not isinstance: isinstance reads __class__, which some lazy
    # module proxies answer with a warning.
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), CodecContext))


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
                self._forkserver_address = self._forkserver_alive_fd = self._forkserver_pid = None
            with socket.socket(socket.AF_UNIX) as listener:
                address = connection.arbitrary_address("AF_UNIX")
                listener.bind(address)
                if not util.is_abstract_socket_namespace(address):
                    os.chmod(address, 0o600)
                listener.listen()
                # Every worker holds the write end of "alive"; the server stops at its EOF.
                alive_r, alive_w = os.pipe()
                for stream in (sys.stdout, sys.stderr):
                    if stream is not None:
                        stream.flush()  # or the server and every worker would print it again
                try:
                    pid = os.fork()
                except BaseException:
                    os.close(alive_r)
                    os.close(alive_w)
                    raise
                if pid == 0:
                    _serve(listener.fileno(), alive_r, alive_w)  # never returns
                os.close(alive_r)
            self._forkserver_address = address
            self._forkserver_alive_fd = alive_w
            self._forkserver_pid = pid
            self.forked = True


def _serve(listener_fd: int, alive_r: int, alive_w: int) -> None:
    """In the fork: become the server, or a stdlib forkserver if the copy is unsafe to fork from."""
    code = 0
    try:
        os.close(alive_w)
        SERVER._lock = threading.Lock()  # forked while held: a fresh one for this process and its workers
        guard_server()
        if open_codec_contexts():
            _exec_stdlib_server(listener_fd, alive_r)
        _reset_to_new_interpreter()
        gc.freeze()
        forkserver.main(listener_fd, alive_r, preload=[])
    except SystemExit:
        pass  # the stdlib loop's way to say every client has gone
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
        SERVER.ensure_running()


CONTEXT = WorkerContext()
