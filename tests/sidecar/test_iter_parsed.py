"""``iter_parsed``: results in the order given, and a consumer that stops early is not held by running parses.

A stopped ``lerobot-build-mp4-sidecar`` over a slow server waited for every parse in flight (each a few
1 s answers) before its stop line, and now and then outlasted the 5 s grace after SIGTERM.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np
import pytest

from lerobot_nodes.sidecar import SourceIdentity
from lerobot_nodes.sidecar.builder import iter_parsed
from lerobot_nodes.sources import ByteSource


def _identities(count: int) -> list[SourceIdentity]:
    return [SourceIdentity(path=f"videos/file-{i:03d}.mp4", size=1, fingerprint=None, revision=None) for i in range(count)]


def test_results_come_in_the_order_given_whatever_order_the_parses_end() -> None:
    ends = {f"videos/file-{i:03d}.mp4": threading.Event() for i in range(6)}

    def parser(source: ByteSource, path: str) -> Mapping[str, np.ndarray]:
        number = int(path[-7:-4])
        if number % 2 == 0 and number + 1 < len(ends):
            ends[f"videos/file-{number + 1:03d}.mp4"].wait(10)  # the even file ends after the odd one
        ends[path].set()
        return {"offsets": np.arange(number + 1)}

    parsed = list(iter_parsed(None, _identities(6), workers=3, parser=parser))  # type: ignore[arg-type]
    assert [p.identity.path for p in parsed] == sorted(ends)
    assert [p.samples for p in parsed] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("how", ["close", "error"])
def test_a_consumer_that_stops_is_not_held_by_the_parses_still_running(how: str) -> None:
    release = threading.Event()
    started = threading.Semaphore(0)
    parsed_paths: list[str] = []

    def parser(source: ByteSource, path: str) -> Mapping[str, np.ndarray]:
        parsed_paths.append(path)
        started.release()
        if path != "videos/file-000.mp4":
            assert release.wait(30), "never released"
        return {"offsets": np.arange(3)}

    parsed = iter_parsed(None, _identities(8), workers=4, parser=parser)  # type: ignore[arg-type]
    try:
        assert next(parsed).identity.path == "videos/file-000.mp4"
        for _ in range(4):
            assert started.acquire(timeout=30)  # file 0 and the next three are (or were) running
        if how == "close":
            parsed.close()
        else:
            with pytest.raises(KeyboardInterrupt):
                parsed.throw(KeyboardInterrupt())
        # Before: close() joined the pool, so it returned only after `release` (never, here, but for the timeout).
        assert not release.is_set()
        running = [t for t in threading.enumerate() if t.name.startswith("sidecar-parse")]
        assert running, "the blocked parses should still be running in the background"
    finally:
        release.set()
    for thread in [t for t in threading.enumerate() if t.name.startswith("sidecar-parse")]:
        thread.join(30)
        assert not thread.is_alive()
    # Files 0-3 were submitted first and file 4 when file 0 was taken; the rest were never submitted.
    assert set(parsed_paths) <= {f"videos/file-{i:03d}.mp4" for i in range(5)}, parsed_paths
