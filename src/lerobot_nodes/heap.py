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


def arrow_allocates_from_the_heap() -> None:
    """Make the C heap pyarrow's default memory pool in this process (a DataLoader worker's).

    pyarrow's bundled allocator (mimalloc or jemalloc) keeps the pages of freed buffers for itself:
    each worker held about 8 MB of Parquet reads that way. From the C heap they go back to the
    system with the rest (:func:`glibc_malloc_trim`, ``nodes.HeapTrimmer``).
    """
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
