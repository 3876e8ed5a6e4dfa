"""Log records of DataLoader workers reach the training process's logging.

A spawned or forkserver worker starts with no logging configuration: what it logs below
WARNING is dropped, and the rest goes straight to its stderr, past the training process's
handlers and progress bar. SPEC §7 tells users to look for lines that workers log (range
retries, lock waits, unwritable caches), so each worker sends the records of the
``lerobot_nodes`` loggers through a queue to the training process, where a thread hands
them to the logger of the same name there: they print with the training process's handlers,
format and level, above a tqdm bar when its logging redirect is active.
"""

from __future__ import annotations

import logging
import logging.handlers
import threading
import weakref
from collections.abc import Callable
from multiprocessing.context import BaseContext
from typing import Any

PACKAGE_LOGGER = "lerobot_nodes"
WORKER_ATTRIBUTE = "worker_id"
"""Set on every relayed record: the DataLoader worker that logged it."""
_STOP = None


class WorkerLogRelay:
    """The training-process end: a queue workers log into, and the thread that re-logs each record.

    Records keep their logger name, level, time and message; ``record.worker_id`` says which
    worker logged. The thread ends on :meth:`close` (idempotent) or with the owner object
    given to :meth:`close_with`.
    """

    def __init__(self, context: BaseContext) -> None:
        self.queue: Any = context.Queue()
        self.level = logging.getLogger(PACKAGE_LOGGER).getEffectiveLevel()
        self._thread = threading.Thread(target=self._relay, name="lerobot-nodes-worker-logs", daemon=True)
        self._thread.start()
        self._closed = False

    def _relay(self) -> None:
        while True:
            try:
                record = self.queue.get()
            except (EOFError, OSError):  # the queue was closed under us at interpreter exit
                return
            if record is _STOP:
                return
            logger = logging.getLogger(record.name)
            if not logger.disabled and record.levelno >= logger.getEffectiveLevel():
                logger.handle(record)

    def close(self) -> None:
        """Re-log what is queued, then stop the thread."""
        if self._closed:
            return
        self._closed = True
        self.queue.put(_STOP)
        self._thread.join(timeout=5)
        self.queue.close()

    def close_with(self, owner: object) -> None:
        """Close when ``owner`` (the DataLoader) is garbage collected."""
        weakref.finalize(owner, WorkerLogRelay.close, self)

    def worker_init_fn(self, then: Callable[[int], None] | None = None) -> RelayLogs:
        """A ``worker_init_fn`` that sends the worker's records here, then calls ``then``."""
        return RelayLogs(self.queue, self.level, then)


class RelayLogs:
    """Worker side: the ``lerobot_nodes`` loggers send their records to the training process.

    Replaces whatever handlers the package logger had in the worker and stops propagation,
    so no record prints twice (once by the worker's stderr fallback, once relayed). Each
    message starts with ``[worker N]``. Picklable (the queue only while a process starts,
    which is when DataLoader pickles its ``worker_init_fn``).
    """

    def __init__(self, queue: Any, level: int, then: Callable[[int], None] | None = None) -> None:
        self.queue = queue
        self.level = level
        self.then = then

    def __call__(self, worker_id: int) -> None:
        logger = logging.getLogger(PACKAGE_LOGGER)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        handler = logging.handlers.QueueHandler(self.queue)
        handler.addFilter(_TagWorker(worker_id))
        logger.addHandler(handler)
        logger.setLevel(self.level)
        logger.propagate = False
        if self.then is not None:
            self.then(worker_id)


class _TagWorker(logging.Filter):
    def __init__(self, worker_id: int) -> None:
        super().__init__()
        self.worker_id = worker_id

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, WORKER_ATTRIBUTE):
            setattr(record, WORKER_ATTRIBUTE, self.worker_id)
            record.msg = f"[worker {self.worker_id}] {record.msg}"
        return True
