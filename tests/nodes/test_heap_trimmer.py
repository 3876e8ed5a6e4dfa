"""HeapTrimmer: items and state pass through unchanged; free heap memory goes back every N items."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torchdata.nodes import IterableWrapper

from lerobot_nodes import load_meta, open_source
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.nodes import HeapTrimmer
from lerobot_nodes.nodes.heap_trimmer import glibc_malloc_trim
from lerobot_nodes.streaming_graph import BatchOptions, SampleOptions, ScheduleStart, build_streaming_graph

from .conftest import DELTA_TIMESTAMPS


class CountingTrim:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def test_every_nth_item_trims_and_a_reset_starts_counting_again() -> None:
    trim = CountingTrim()
    node = HeapTrimmer(IterableWrapper(range(10)), every=4, trim=trim)
    node.reset()
    assert list(node) == list(range(10))
    assert trim.calls == node.trims == 2
    node.reset()
    next(node), next(node), next(node)
    assert trim.calls == 2  # three items since the reset
    next(node)
    assert trim.calls == 3


def test_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every must be >= 1"):
        HeapTrimmer(IterableWrapper([]), every=0)


def _graph(root, trim_heap_every):
    source = open_source(root)
    meta = load_meta(source)
    config = StreamingConfig(streaming_episode_pool_size=3, streaming_decode_threads=2)
    return build_streaming_graph(
        source, meta, list(range(len(meta.episodes))), config=config,
        schedule=ScheduleStart(seed=1000),
        samples=SampleOptions(delta_timestamps=DELTA_TIMESTAMPS, return_uint8=True),
        batches=BatchOptions(batch_size=4, trim_heap_every=trim_heap_every),
    )  # fmt: skip


def _indices(batches) -> list[list[int]]:
    return [batch["index"].tolist() for batch in batches]


@pytest.mark.timeout(120)
def test_a_graph_with_the_trimmer_yields_and_resumes_as_one_without(av1_dataset) -> None:
    plain, trimmed = _graph(av1_dataset, None), _graph(av1_dataset, 1)
    assert isinstance(trimmed.root, HeapTrimmer) and not isinstance(plain.root, HeapTrimmer)
    try:
        plain.root.reset()
        trimmed.root.reset()
        head = [next(plain.root) for _ in range(3)]
        head_trimmed = [next(trimmed.root) for _ in range(3)]
        for a, b in zip(head, head_trimmed, strict=True):
            assert list(a) == list(b)
            assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))
        state = trimmed.root.state_dict()
        assert state == plain.root.state_dict()  # the same layout: checkpoints are interchangeable
        rest = _indices(plain.root)
        trimmed.root.reset(state)
        assert _indices(trimmed.root) == rest
        if glibc_malloc_trim() is not None:
            assert trimmed.root.trims >= 3 + len(rest)
    finally:
        plain.close()
        trimmed.close()


@pytest.mark.skipif(glibc_malloc_trim() is None, reason="the C library has no malloc_trim (not glibc)")
def test_glibc_malloc_trim_gives_freed_heap_memory_back() -> None:
    # In a fresh process: 400 blocks of 64 KiB (below malloc's mmap threshold, so on the heap)
    # freed under a block that pins the top of the heap (too big for any hole below), so malloc
    # cannot shrink the heap by itself.
    script = textwrap.dedent(
        """
        import ctypes
        from lerobot_nodes.nodes.heap_trimmer import glibc_malloc_trim

        def rss_kib():
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS"):
                    return int(line.split()[1])

        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        blocks = [libc.malloc(64 * 1024) for _ in range(400)]
        for block in blocks:
            ctypes.memset(block, 1, 64 * 1024)
        pin = libc.malloc(100 * 1024)
        assert pin > max(blocks)
        for block in blocks:
            libc.free(block)
        held = rss_kib()
        glibc_malloc_trim()()
        print(held - rss_kib())
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 20 * 1024  # KiB: most of the 25 MiB freed
