"""Shared-memory segments owned by one process and read by the DataLoader workers it starts.

Pickling such an object sends only the segment's name, so spawned and forkserver workers
attach to the same bytes without a file and without the bytes travelling in the pickle.
"""

from __future__ import annotations

import contextlib
from multiprocessing import resource_tracker, shared_memory
from typing import Any


class Segment(shared_memory.SharedMemory):
    """A ``SharedMemory`` that, when collected while arrays still view its buffer, stays mapped
    quietly (``SharedMemory`` would print an ignored ``BufferError``): the mapping goes with the process."""

    def __del__(self) -> None:
        with contextlib.suppress(BufferError, OSError):
            self.close()


def release(memory: shared_memory.SharedMemory, view: Any = None) -> None:
    """Unlink, then close, a segment this process created."""
    # Unlink first: closing fails while a numpy view of the buffer is still alive.
    with contextlib.suppress(FileNotFoundError):
        memory.unlink()
    with contextlib.suppress(BufferError):
        memory.close()


def attach_untracked(name: str) -> Segment:
    """Attach to a segment without registering it, so a worker's exit never unlinks it.

    The creating process owns the segment. Python 3.13 has ``track=False`` for this; older
    versions register every attach with the resource tracker, so registration is skipped.
    """
    original = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None  # type: ignore[assignment]
    try:
        return Segment(name=name)
    finally:
        resource_tracker.register = original  # type: ignore[assignment]
