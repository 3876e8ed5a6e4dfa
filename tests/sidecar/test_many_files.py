"""Thousands of video files: an open index holds no file descriptor (issue 28).

CPython's ``mmap.mmap`` keeps a dup of its file descriptor (before 3.13), so a process holding one
mapped record per MP4 ran out of descriptors past ``ulimit -n`` (Errno 24 at 5,000 files under
1,024). Records are now mapped and their files closed at once (``sidecar.derived.map_readonly``).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.mp4 import read_index_from_source
from lerobot_nodes.sidecar import MappedRecord, MappedVideoIndex, SidecarCache, SourceIdentity
from lerobot_nodes.sidecar.derived import is_file_mapped, write_record
from lerobot_nodes.sources import LocalSource
from lerobot_nodes.testing import write_files_dataset

MANY_FILES = int(os.environ.get("LEROBOT_NODES_MANY_FILES", "5000"))
"""Video files of the descriptor-limit test: 5,000 in CI (~15 s); benchmarks/scale_open.py runs 20,000
(``LEROBOT_NODES_MANY_FILES=20000`` runs it here too, ~1 min on 2 cores)."""


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _mappings_of(folder: Path) -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if str(folder) in line)


pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="counts descriptors in /proc")


def test_a_mapped_record_holds_no_file_descriptor_and_unmaps_when_dropped(av1_dataset: Path, tmp_path: Path) -> None:
    source = LocalSource(av1_dataset)
    path = load_meta(source).video_files()[0]
    arrays = read_index_from_source(source, path).to_arrays()
    identity = SourceIdentity.of(source.info(path), None)
    folder = tmp_path / "records"
    folder.mkdir()
    for number in range(300):
        write_record(folder / f"{number}.idx", identity, arrays, "t")
    gc.collect()
    fds_before = _open_fds()
    indexes = [MappedVideoIndex(MappedRecord.open(folder / f"{number}.idx")) for number in range(300)]
    assert _open_fds() == fds_before  # 300 records open, not one descriptor more
    assert all(is_file_mapped(index.keyframes) for index in indexes)  # still shared file pages, no copies
    assert _mappings_of(folder) == 300
    # Records are immutable: deleting one on disk leaves the holder's views readable.
    (folder / "0.idx").unlink()
    assert np.array_equal(indexes[0].pts.astype(np.int64), arrays["pts"])
    with pytest.raises(ValueError):
        indexes[0].pts.flags.writeable = True  # read-only mapping: never made writable
    kept = indexes[1].offsets[1:]  # a view keeps its mapping alive after its index goes
    del indexes
    gc.collect()
    assert _mappings_of(folder) == 1
    assert np.array_equal(kept.astype(np.int64), arrays["offsets"][1:])
    del kept
    gc.collect()
    assert _mappings_of(folder) == 0


def test_cache_open_of_many_files_keeps_descriptors_flat(tmp_path: Path) -> None:
    root = write_files_dataset(tmp_path / "files-400", 400)
    source = LocalSource(root)
    paths = load_meta(source).video_files()
    assert len(paths) == 400
    gc.collect()
    fds_before = _open_fds()
    indexes, report = SidecarCache(tmp_path / "cache").open(source, paths)
    assert len(report.built) == 400 and report.built == sorted(paths)
    assert _open_fds() <= fds_before + 2  # the entry's lock file at most
    reopened, report = SidecarCache(tmp_path / "cache").open(source, paths)
    assert report.reused == sorted(paths) and not report.built
    assert all(np.array_equal(indexes[p].pts, reopened[p].pts) for p in paths[:: 37])
    assert _open_fds() <= fds_before + 2


_CHILD = textwrap.dedent(
    """
    import json, os, resource, sys, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    from lerobot_nodes.dataset import StreamingLeRobotDataset
    started = time.perf_counter()
    dataset = StreamingLeRobotDataset(root=sys.argv[1])
    constructed = time.perf_counter() - started
    fds_after_open = len(os.listdir("/proc/self/fd"))
    samples = iter(dataset)
    episodes = [int(next(samples)["episode_index"]) for _ in range(4)]
    files = sorted({dataset.meta.video_file(e, key) for e in episodes for key in dataset.meta.video_keys})
    print(json.dumps({"limit": resource.getrlimit(resource.RLIMIT_NOFILE), "indexes": len(dataset._indexes),
                      "episodes": episodes, "files": files, "fds_after_open": fds_after_open,
                      "fds_after_samples": len(os.listdir("/proc/self/fd")), "construct_s": constructed}))
    dataset.close()
    """
)


def test_dataset_of_many_video_files_opens_and_streams_under_a_1024_descriptor_limit(tmp_path: Path) -> None:
    root = write_files_dataset(tmp_path / f"files-{MANY_FILES}", MANY_FILES)
    env = {**os.environ, "HF_LEROBOT_HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root)], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["limit"] == [1024, 1024]
    assert report["indexes"] == MANY_FILES  # one rank: every file's index is open in this process
    assert len(set(report["episodes"])) == 4 and len(report["files"]) == 4 * 2  # four episodes, eight files
    assert report["fds_after_open"] < 64 and report["fds_after_samples"] < 128, report
