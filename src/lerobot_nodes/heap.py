"""Free heap memory handed back to the system: glibc's ``malloc_trim(0)``, where the C library has it.

Reading large Parquet footers or decoding video leaves freed-but-retained pages in the C heap;
the metadata loader (after opening) and the heap-trimmer node (every few batches) return them.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


def glibc_malloc_trim() -> Callable[[], object] | None:
    """``malloc_trim(0)`` of this process's C library, or None where it has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return functools.partial(trim, 0)
