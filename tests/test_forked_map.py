"""The ``meta/episodes`` parse in forked processes (``workers/forked_map.py``), in real processes.

Each case runs in a fresh interpreter (no other threads: the state ``load_meta`` forks in) over a
small generated dataset of 20 ``meta/episodes`` files: the forked parse loads exactly what the
threaded one does, an unreadable file raises the same error as the threaded parse (the first in
file order), and no child outlives the call, whether it returns, raises, is interrupted, or its
parent is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lerobot_nodes.testing.scale import write_scale_metadata

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked readers are Linux-only")

EPISODES = 20_000  # 20 files of 1,000 episodes: above the forked path's 16-file floor


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_scale_metadata(tmp_path_factory.mktemp("forked") / "ds", EPISODES, stats_features=1)


PREAMBLE = """
import json, os, sys
import numpy as np
import psutil
import lerobot_nodes.format.meta as meta
from lerobot_nodes.workers import forked_map as fm
from lerobot_nodes.sources import LocalSource

forks = []
real_forked_map = meta.forked_map

def counting_forked_map(function, items, processes):
    forks.append(processes)
    return real_forked_map(function, items, processes)

meta.forked_map = counting_forked_map
meta.os.sched_getaffinity = lambda pid: {0, 1}  # two cores even on a one-core runner

def open_meta(forked):
    meta._FORK_MIN_FILES = 16 if forked else 10**9
    return meta.load_meta(LocalSource(sys.argv[1]), table_cache=False)

def children():
    return [p.pid for p in psutil.Process().children(recursive=True)]
"""


def run(script: str, *args: str, timeout: float = 120) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PREAMBLE + script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_forked_parse_loads_what_the_threads_load(dataset: Path) -> None:
    out = run(
        """
forked = open_meta(True)
after_forked = children()
threaded = open_meta(False)
a, b = forked.episodes, threaded.episodes
arrays = lambda t: meta._table_arrays(t)[0]
same = all(np.array_equal(x, arrays(b)[k]) and x.dtype == arrays(b)[k].dtype for k, x in arrays(a).items())
print(json.dumps({"forks": forks, "same": same, "tasks": a.tasks == b.tasks, "n": len(a),
                  "names": list(a.tasks.names) == list(b.tasks.names), "children": after_forked}))
""",
        str(dataset),
    )
    assert out["forks"] == [2], "the forked path did not run"
    assert out["n"] == EPISODES
    assert out["same"] and out["tasks"] and out["names"]
    assert out["children"] == []


def _corrupt(dataset: Path, tmp_path: Path, files: list[int]) -> Path:
    """A copy of ``dataset`` whose ``meta/episodes`` files at these positions end in garbage."""
    copy = tmp_path / "ds"
    subprocess.run(["cp", "-r", str(dataset), str(copy)], check=True)
    paths = sorted((copy / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    for index in files:
        with open(paths[index], "r+b") as f:
            f.seek(-4, os.SEEK_END)
            f.write(b"NOPE")
    return copy


@pytest.mark.parametrize("bad", [[3, 15], [15], [9, 10]])
def test_an_unreadable_file_raises_the_first_error_in_file_order(
    dataset: Path, tmp_path: Path, bad: list[int]
) -> None:
    copy = _corrupt(dataset, tmp_path, bad)
    out = run(
        """
errors = {}
for forked in (True, False):
    try:
        open_meta(forked)
    except meta.MetadataError as exc:
        errors[forked] = str(exc)
print(json.dumps({"forks": forks, "forked": errors.get(True), "threaded": errors.get(False), "children": children()}))
""",
        str(copy),
    )
    assert out["forks"] == [2]
    assert out["threaded"] is not None and out["forked"] == out["threaded"]
    first = sorted((copy / "meta" / "episodes").glob("chunk-*/file-*.parquet"))[bad[0]]
    assert str(first.relative_to(copy)) in out["forked"]
    assert out["children"] == []


def test_an_interrupted_call_leaves_no_child() -> None:
    out = run(
        """
import signal, time

def interrupt(signum, frame):
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
signal.alarm(1)
started = time.monotonic()
try:
    fm.forked_map(time.sleep, [60, 60, 60], 2)
    outcome = "returned"
except KeyboardInterrupt:
    outcome = "interrupted"
print(json.dumps({"outcome": outcome, "seconds": time.monotonic() - started, "children": children()}))
"""
    )
    assert out["outcome"] == "interrupted"
    assert out["seconds"] < 30
    assert out["children"] == []


def test_children_die_with_their_parent(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = (
        PREAMBLE
        + f"""
import time
def note_and_sleep(seconds):
    with open({str(pids)!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    time.sleep(seconds)
fm.forked_map(note_and_sleep, [60, 60], 2)
"""
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < 2):
            time.sleep(0.05)
        children = [int(pid) for pid in pids.read_text().split()]
        assert len(children) == 2
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        alive = children
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in children if _running(pid)]
            time.sleep(0.05)
        assert alive == [], f"children outlived their parent: {alive}"
    finally:
        parent.kill()
        parent.wait()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_child_that_dies_is_reported() -> None:
    out = run(
        """
def die(item):
    if item == 3:
        os.kill(os.getpid(), 9)
    return item

try:
    fm.forked_map(die, list(range(6)), 2)
    message = None
except fm.ForkedChildError as exc:
    message = str(exc)
print(json.dumps({"message": message, "children": children()}))
"""
    )
    assert out["message"] is not None and "items 3..5" in out["message"] and "signal 9" in out["message"]
    assert out["children"] == []


def test_results_keep_item_order_across_ranges() -> None:
    out = run(
        """
print(json.dumps({"results": fm.forked_map(lambda i: (i, os.getpid()), list(range(7)), 3), "me": os.getpid()}))
"""
    )
    items = [item for item, _ in out["results"]]
    workers = {pid for _, pid in out["results"]}
    assert items == list(range(7))
    assert len(workers) == 3 and out["me"] not in workers


def test_a_pipe_or_fork_refused_by_a_limit_is_cannot_fork_and_the_meta_read_falls_back_to_threads(
    dataset: Path,
) -> None:
    out = run(
        f"""
import resource
open_now = len(os.listdir("/proc/self/fd")) - 1  # less the descriptor listdir itself held
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 2, hard))  # one pipe, not two
try:
    fm.forked_map(lambda item: item, list(range(8)), 4)
    refused = None
except fm.ForkRefusedError as exc:
    refused = str(exc)
left = children()
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
threads = meta.load_meta(meta.LocalSource({str(dataset)!r}), check_files=False, table_cache=False)
meta._LOCAL_READERS = 1  # the fallback reads one file at a time: one descriptor, which the limit leaves
import io, logging
said = io.StringIO()
logging.getLogger("lerobot_nodes.format").addHandler(logging.StreamHandler(said))
logging.getLogger("lerobot_nodes.format").setLevel(logging.DEBUG)
source = meta.LocalSource({str(dataset)!r})
open_now = len(os.listdir("/proc/self/fd")) - 1  # less the descriptor listdir itself held
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 2, hard))
fallback = meta.load_meta(source, check_files=False, table_cache=False)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
same = bool(np.array_equal(threads.episodes.length, fallback.episodes.length))
print(json.dumps({{"refused": refused, "children": left, "same": same, "episodes": len(fallback.episodes),
                   "after": children(), "fell_back": "with threads: cannot start" in said.getvalue()}}))
"""
    )
    assert out["refused"] is not None and "Too many open files" in out["refused"]
    assert out["children"] == []  # the child forked before the refused pipe is killed and reaped
    assert out["fell_back"]  # the meta read tried its forked readers, was refused, and read with threads
    assert out["same"] and out["episodes"] == EPISODES and out["after"] == []
