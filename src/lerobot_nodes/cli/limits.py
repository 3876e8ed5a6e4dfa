"""One line for a command that ran into a process limit: memory, threads or open files.

Under ``ulimit -v``, ``ulimit -u`` or ``ulimit -n`` a command fails deep inside a library
(``MemoryError``, ``RuntimeError: can't start new thread``, ``OSError: [Errno 24] Too many open
files``, torch's ``unable to mmap ... Cannot allocate memory``), often in a DataLoader worker,
whose traceback torch re-raises in the training process. :func:`resource_limit_message` names
the limit that was hit, the value it has in this process, and the options that lower the need.
It never imports torch or pyarrow: the errors are matched by class and message.
"""

from __future__ import annotations

import errno
import os
import re
import sys

try:
    import resource
except ImportError:  # Windows: no rlimits to name
    resource = None  # type: ignore[assignment]

_OUT_OF_MEMORY = re.compile(
    r"cannot allocate memory|out of memory|unable to mmap|failed to map segment|std::bad_alloc|malloc of size", re.I
)
_NO_THREAD = re.compile(
    r"can't start new thread|cannot start new thread|thread creation failed|pthread_create", re.I
)
_TOO_MANY_FILES = re.compile(r"too many open files", re.I)

MEMORY_ADVICE = (
    "lower --num_workers, --dataset.streaming_byte_budget_gb, --dataset.streaming_decoded_frame_budget_mb or "
    "--batch_size, or raise the limit"
)
THREAD_ADVICE = "lower --num_workers or --dataset.streaming_decode_threads, or raise the limit"
FILES_ADVICE = "raise it (ulimit -n 4096) or lower --num_workers"
FEW_PROCESSES = 16384
"""A process limit (``ulimit -u``) below this is named as a possible cause of a failed thread start;
distributions default to tens of thousands, which a training job does not reach."""
RAISED_OPEN_FILES = 4096
"""The soft open-file limit a command raises a lower one to, when the hard limit allows."""


def _limit(kind: str) -> int | None:
    """The soft limit ``RLIMIT_<kind>`` of this process, or None when unlimited or unknown."""
    if resource is None or not hasattr(resource, f"RLIMIT_{kind}"):
        return None
    soft, _ = resource.getrlimit(getattr(resource, f"RLIMIT_{kind}"))
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _address_space() -> str:
    limit = _limit("AS")
    return (
        ""
        if limit is None
        else f" under an address-space limit of {limit / 2**30:.1f} GiB (ulimit -v {limit // 1024})"
    )


def _messages(error: BaseException) -> str:
    """The text of ``error`` and of its causes (a worker's error re-raised by torch holds the original's traceback)."""
    parts = []
    current: BaseException | None = error
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


def resource_limit_message(error: BaseException) -> str | None:
    """One line naming the process limit ``error`` ran into and what to do, or None if it is not one."""
    text = _messages(error)
    number = getattr(error, "errno", None)
    if number in (errno.EMFILE, errno.ENFILE) or _TOO_MANY_FILES.search(text):
        limit = _limit("NOFILE")
        where = f" (limit {limit}, ulimit -n)" if limit is not None else ""
        return f"too many open files{where}: {FILES_ADVICE}"
    if _NO_THREAD.search(text):
        limits = []
        address = _limit("AS")
        if address is not None:
            limits.append(f"{address / 2**30:.1f} GiB of address space (ulimit -v {address // 1024}), which thread stacks use")
        processes = _limit("NPROC")
        if processes is not None and processes < FEW_PROCESSES:
            limits.append(f"{processes} processes and threads (ulimit -u)")
        where = f" under a limit of {' and '.join(limits)}" if limits else ""
        return f"cannot start a thread{where}: {THREAD_ADVICE}"
    if isinstance(error, MemoryError) or number == errno.ENOMEM or _OUT_OF_MEMORY.search(text):
        return f"out of memory{_address_space()}: {MEMORY_ADVICE}"
    return None


def open_files_needed(num_workers: int) -> int:
    """File descriptors a command with ``num_workers`` DataLoader workers needs at least (measured:
    the demo streams with 2 workers at a limit of 40 and fails at 32; each worker holds pipes,
    queues and the descriptors of the batch tensors it sends)."""
    return 24 + 8 * max(0, int(num_workers))


def ensure_open_file_limit(num_workers: int) -> None:
    """Raise the soft open-file limit to what ``num_workers`` need when the hard limit allows; else a
    :class:`~lerobot_nodes.errors.ConfigError` naming the limit, before any worker starts."""
    if resource is None or not hasattr(resource, "RLIMIT_NOFILE"):
        return
    from ..errors import ConfigError

    needed = open_files_needed(num_workers)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard == resource.RLIM_INFINITY or hard >= needed:  # room to spare, as far as the hard limit allows
        raised = RAISED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, RAISED_OPEN_FILES)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(needed, raised), hard))
        return
    fewer = f" or --num_workers={(hard - 24) // 8}" if hard >= open_files_needed(1) else " or --num_workers=0"
    raise ConfigError(
        f"the open-file limit is {hard} (ulimit -n) and --num_workers={num_workers} needs about {needed} "
        f"(every worker passes its batches' tensors as file descriptors): raise it (ulimit -n 4096){fewer}"
    )


ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def system_allocator_under_address_limit() -> None:
    """Under ``ulimit -v``, make pyarrow allocate with the system ``malloc`` (unless the user chose a pool).

    pyarrow's default pool (mimalloc here) reserves address space in large arenas; under an
    address-space limit a failed reservation hung a metadata read in a futex wait once in a few runs
    (the process ignored SIGTERM too), where ``malloc`` fails with an error this module reports.
    Set before pyarrow is imported, so DataLoader workers inherit it.
    """
    if _limit("AS") is not None and ARROW_POOL_ENV not in os.environ and "pyarrow" not in sys.modules:
        os.environ[ARROW_POOL_ENV] = "system"
