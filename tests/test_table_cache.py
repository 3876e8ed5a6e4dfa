"""The parsed ``meta/episodes`` table is cached per revision (issue 28): a second open, and every
process of the node after the first, maps it and reads no episodes Parquet; changed content is
parsed again; a corrupt cache file is rebuilt with one log line, never an error.

Real Parquet written by the dataset writer, read through a local source that records what it
serves; real processes for the node-sharing case.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_nodes import MapStyleLeRobotDataset, load_meta
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.format.meta import DatasetMeta
from lerobot_nodes.format.table_cache import TABLE_SUFFIX, TableCache
from lerobot_nodes.sources import LocalSource
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.compare import assert_samples_equal

WINDOW = {"action": [0.0, 1 / 30], "observation.images.top": [-1 / 30, 0.0]}


class RecordingSource(LocalSource):
    """A local dataset root that remembers every file it served bytes of."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.read: list[str] = []

    def _read_file(self, path):
        self.read.append(path)
        return super()._read_file(path)

    def _read_ranges(self, path, ranges):
        self.read.append(path)
        return super()._read_ranges(path, ranges)

    def episode_files_read(self) -> set[str]:
        return {p for p in self.read if p.startswith("meta/episodes/")}


def _episode_files(root: Path) -> list[Path]:
    return sorted((root / "meta" / "episodes").rglob("*.parquet"))


@pytest.fixture
def dataset(tmp_path) -> Path:
    """12 episodes whose episode metadata rolled over into several files."""
    root = write_dataset(
        tmp_path / "ds",
        num_episodes=12,
        episode_lengths=[3, 4, 5, 6] * 3,
        height=16,
        width=16,
        data_file_size_in_mb=0.03,
    )
    assert len(_episode_files(root)) > 1, (
        "the fixture should roll the episode metadata over into several files"
    )
    return root


def _tables(cache: TableCache) -> list[Path]:
    return sorted(cache.folder.rglob(f"*{TABLE_SUFFIX}"))


def assert_same_episodes(expected: DatasetMeta, actual: DatasetMeta) -> None:
    a, b = expected.episodes, actual.episodes
    for name in (
        "episode_index",
        "length",
        "dataset_from_index",
        "dataset_to_index",
        "data_chunk_index",
        "data_file_index",
    ):
        assert np.array_equal(getattr(a, name), getattr(b, name)) and getattr(b, name).dtype == np.int64, name
    assert list(a.videos) == list(b.videos)
    for key in a.videos:
        for name in ("chunk_index", "file_index", "from_timestamp", "to_timestamp"):
            x, y = getattr(a.videos[key], name), getattr(b.videos[key], name)
            assert np.array_equal(x, y) and x.dtype == y.dtype, (key, name)
    assert a.tasks.tolist() == b.tasks.tolist()
    assert expected.tasks == actual.tasks


def test_a_second_open_maps_the_cached_table_and_reads_no_episodes_parquet(dataset, tmp_path):
    cache = TableCache(tmp_path / "tables")
    parsed = load_meta(LocalSource(dataset), table_cache=False)

    first = RecordingSource(dataset)
    built = load_meta(first, table_cache=cache)
    assert first.episode_files_read() == {p.relative_to(dataset).as_posix() for p in _episode_files(dataset)}
    [table] = _tables(cache)
    written = table.stat().st_mtime_ns

    second = RecordingSource(dataset)
    warm = load_meta(second, table_cache=cache)
    assert second.episode_files_read() == set()
    assert "meta/info.json" in second.read  # the small files are read as before
    assert table.stat().st_mtime_ns == written and _tables(cache) == [table]
    assert not warm.episodes.length.flags.writeable  # a read-only view of the mapped file
    assert_same_episodes(parsed, built)
    assert_same_episodes(parsed, warm)


def test_a_rewritten_episodes_file_is_parsed_again(dataset, tmp_path, caplog):
    cache = TableCache(tmp_path / "tables")
    before = load_meta(LocalSource(dataset), table_cache=cache)
    [old_table] = _tables(cache)

    # Rewrite the last episodes file: its last episode now lists another task of the dataset.
    path = _episode_files(dataset)[-1]
    table = pq.read_table(path)
    rows = table.num_rows
    current = before.episodes.tasks[len(before.episodes) - 1]
    other = next(t for t in before.tasks if t not in current)
    tasks = table.column("tasks").to_pylist()
    tasks[rows - 1] = [other]
    table = table.set_column(
        table.schema.get_field_index("tasks"), "tasks", pa.array(tasks, table.schema.field("tasks").type)
    )
    pq.write_table(table, path)

    source = RecordingSource(dataset)
    with caplog.at_level(logging.INFO, logger="lerobot_nodes.format"):
        after = load_meta(source, table_cache=cache)
    assert path.relative_to(dataset).as_posix() in source.episode_files_read()
    assert after.episodes.tasks[len(after.episodes) - 1] == [other]
    assert (
        after.episodes.tasks[: len(after.episodes) - 1] == before.episodes.tasks[: len(before.episodes) - 1]
    )
    lines = [r.getMessage() for r in caplog.records if "meta/episodes table" in r.getMessage()]
    assert len(lines) == 1 and "changed since it was cached" in lines[0], lines
    [new_table] = _tables(cache)
    assert new_table != old_table  # the stale file is gone, the new content has its own

    again = RecordingSource(dataset)
    assert load_meta(again, table_cache=cache).episodes.tasks == after.episodes.tasks
    assert again.episode_files_read() == set()


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_a_corrupt_cache_file_is_rebuilt_with_one_log_line(dataset, tmp_path, caplog, damage):
    cache = TableCache(tmp_path / "tables")
    load_meta(
        LocalSource(dataset), table_cache=cache
    )  # not kept: damaging a mapped file in place changes the mapping
    expected = load_meta(LocalSource(dataset), table_cache=False)
    [table] = _tables(cache)
    size = table.stat().st_size
    data = bytearray(table.read_bytes())
    if damage == "truncate":
        data = data[: size // 2]
    elif damage == "flip":
        data[-3] ^= 0xFF  # inside the data: only the checksum can tell
    else:
        data = bytearray()
    table.write_bytes(bytes(data))

    source = RecordingSource(dataset)
    with caplog.at_level(logging.INFO, logger="lerobot_nodes.format"):
        rebuilt = load_meta(source, table_cache=cache)
    assert source.episode_files_read()  # parsed again
    lines = [r for r in caplog.records if "meta/episodes table" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING, [r.getMessage() for r in lines]
    reason = {"truncate": "truncated", "flip": "checksum", "empty": "truncated"}[damage]
    assert "is unusable" in lines[0].getMessage() and reason in lines[0].getMessage()
    assert_same_episodes(expected, rebuilt)
    assert _tables(cache) == [table] and table.stat().st_size == size

    again = RecordingSource(dataset)
    assert_same_episodes(expected, load_meta(again, table_cache=cache))
    assert again.episode_files_read() == set()


def test_a_cache_folder_that_cannot_be_written_is_no_error(dataset, unwritable_home, caplog):
    cache = TableCache(unwritable_home / "tables")
    with caplog.at_level(logging.WARNING, logger="lerobot_nodes.format"):
        first = load_meta(LocalSource(dataset), table_cache=cache)
        second = load_meta(LocalSource(dataset), table_cache=cache)
    assert_same_episodes(first, second)
    assert len([r for r in caplog.records if "cannot write the table cache" in r.getMessage()]) <= 1
    assert not list(unwritable_home.rglob(f"*{TABLE_SUFFIX}"))


OPEN = """
import json, sys
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.format.table_cache import TableCache
from lerobot_nodes.sources import LocalSource

read = set()

class Recording(LocalSource):
    def _read_ranges(self, path, ranges):
        read.add(path)
        return super()._read_ranges(path, ranges)

    def _read_file(self, path):
        read.add(path)
        return super()._read_file(path)

root, folder = sys.argv[1:3]
print("ready", flush=True)
sys.stdin.readline()
meta = load_meta(Recording(root), table_cache=TableCache(folder))
print(json.dumps({"episode_files_read": len([p for p in read if p.startswith("meta/episodes/")]),
                  "lengths": meta.episodes.length.tolist()}), flush=True)
# What is checked is printed; skip the interpreter's teardown, where pyarrow's Parquet threads can abort the
# process ("terminate called without an active exception", apache/arrow#34314; seen once in CI, 0 in 31 runs here).
import os
os._exit(0)
"""


def test_processes_opening_at_once_parse_the_episodes_once(dataset, tmp_path):
    folder = tmp_path / "tables"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN, str(dataset), str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    for process in processes:  # released together: they race for the table
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    results = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    files = len(_episode_files(dataset))
    assert sorted(r["episode_files_read"] for r in results) == [0, 0, files]
    expected = load_meta(LocalSource(dataset), table_cache=False).episodes.length.tolist()
    assert all(r["lengths"] == expected for r in results)


def test_samples_with_the_table_cache_warm_equal_the_map_style_reader(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    config = StreamingConfig(streaming_episode_pool_size=2, streaming_prefetch_episodes=2)
    StreamingLeRobotDataset(root=dataset, delta_timestamps=WINDOW, return_uint8=True, config=config).close()
    tables = list((tmp_path / "home").rglob(f"*{TABLE_SUFFIX}"))
    assert len(tables) == 1
    warm = StreamingLeRobotDataset(root=dataset, delta_timestamps=WINDOW, return_uint8=True, config=config)
    assert not warm.meta.episodes.length.flags.writeable  # mapped from the cache file

    assert not (tmp_path / "other-home").exists()
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "other-home"))  # the reference parses the Parquet
    reference = MapStyleLeRobotDataset(root=dataset, delta_timestamps=WINDOW, return_uint8=True)
    starts = {e: reference.meta.episode_bounds(e)[0] for e in reference.episodes}
    seen = set()
    try:
        for sample in warm:
            episode, frame = int(sample["episode_index"]), int(sample["frame_index"])
            seen.add((episode, frame))
            expected = reference[starts[episode] + frame]
            assert_samples_equal(
                expected, {k: sample[k] for k in expected}, where=f"episode {episode} frame {frame}"
            )
    finally:
        warm.close()
    assert len(seen) == reference.num_frames


def test_index_concurrency_sets_the_files_indexed_at_once(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    default = StreamingLeRobotDataset(root=dataset)
    chosen = StreamingLeRobotDataset(root=dataset, config=StreamingConfig(streaming_index_concurrency=3))
    over_connections = StreamingLeRobotDataset(
        root=dataset,
        config=StreamingConfig(streaming_index_concurrency=2, streaming_native_http_connections=9),
    )
    try:
        assert default._index_build_workers() == 4  # a local folder's default
        assert chosen._index_build_workers() == 3
        assert over_connections._index_build_workers() == 2
    finally:
        for opened in (default, chosen, over_connections):
            opened.close()


def test_a_hub_repo_table_is_keyed_by_its_commit(dataset, tmp_path, monkeypatch):
    import huggingface_hub.constants

    from lerobot_nodes.testing.hub import LoopbackHub

    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True, raising=False)
    hub = LoopbackHub().start()
    try:
        _check_hub_tables(hub, dataset, tmp_path)
    finally:
        hub.stop()


def _check_hub_tables(hub, dataset: Path, tmp_path: Path) -> None:
    from lerobot_nodes.sources import HubRepoSource

    repo = "owner/tables"
    sha = hub.add_dataset(repo, dataset)
    cache = TableCache(tmp_path / "tables")

    def open_at(revision: str) -> DatasetMeta:
        source = HubRepoSource(repo, revision, endpoint=hub.endpoint, cache_root=tmp_path / "meta-cache")
        return load_meta(source, table_cache=cache)

    first = open_at(sha)
    [table] = _tables(cache)
    assert sha in table.parent.name  # one folder per commit
    written = table.stat().st_mtime_ns
    again = open_at(sha)
    assert not again.episodes.length.flags.writeable and table.stat().st_mtime_ns == written
    assert_same_episodes(first, again)

    path = _episode_files(dataset)[-1]
    changed = pq.read_table(path)
    tasks = changed.column("tasks").to_pylist()
    tasks[-1] = [first.tasks[0]] if tasks[-1] != [first.tasks[0]] else [first.tasks[-1]]
    column = pa.array(tasks, changed.schema.field("tasks").type)
    changed = changed.set_column(changed.schema.get_field_index("tasks"), "tasks", column)
    sink = pa.BufferOutputStream()
    pq.write_table(changed, sink)
    newer = hub.commit_files(repo, {path.relative_to(dataset).as_posix(): sink.getvalue().to_pybytes()})
    assert open_at(newer).episodes.tasks[len(first.episodes) - 1] == tasks[-1]
    assert len(_tables(cache)) == 2  # the older commit keeps its table: it is still a valid revision
    assert open_at(sha).episodes.tasks == first.episodes.tasks


def _child_reads_table(episodes, queue) -> None:
    """In a spawned process: what it received (whether its arrays are views of a cache file)."""
    queue.put((str(episodes.mapped.path) if episodes.mapped else None, episodes.length.flags.writeable,
               int(episodes.length.sum()), episodes.tasks.tolist()))


def test_a_cached_table_goes_to_another_process_as_its_file_not_its_arrays(dataset, tmp_path):
    import multiprocessing
    import pickle

    cache = TableCache(tmp_path / "tables")
    built = load_meta(LocalSource(dataset), table_cache=cache)  # the first open maps what it wrote too
    warm = load_meta(LocalSource(dataset), table_cache=cache)
    [table] = _tables(cache)
    for meta in (built, warm):
        assert meta.episodes.mapped is not None and meta.episodes.mapped.path == table
        assert len(pickle.dumps(meta.episodes)) < 2_000  # a path and a key, whatever the episode count
    parsed = load_meta(LocalSource(dataset), table_cache=False)
    assert parsed.episodes.mapped is None
    copy = pickle.loads(pickle.dumps(parsed))  # not cached: the arrays themselves
    assert_same_episodes(parsed, copy)
    assert_same_episodes(parsed, pickle.loads(pickle.dumps(warm)))

    context = multiprocessing.get_context("spawn")  # what a DataLoader worker of a forkserver receives: a pickle
    queue = context.Queue()
    child = context.Process(target=_child_reads_table, args=(warm.episodes, queue))
    child.start()
    path, writeable, frames, tasks = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert path == str(table) and not writeable  # mapped there: the node's pages, not a private copy
    assert frames == int(parsed.episodes.length.sum()) and tasks == parsed.episodes.tasks.tolist()


def test_a_cache_file_removed_before_a_process_maps_it_is_one_clear_error(dataset, tmp_path):
    import pickle

    from lerobot_nodes.errors import MetadataError

    cache = TableCache(tmp_path / "tables")
    warm = load_meta(LocalSource(dataset), table_cache=cache)
    sent = pickle.dumps(warm.episodes)
    [table] = _tables(cache)
    table.unlink()
    assert warm.episodes.length.sum() > 0  # this process keeps reading its mapping
    with pytest.raises(MetadataError, match="is gone or was replaced") as error:
        pickle.loads(sent)
    assert str(table) in str(error.value) and "start the run again" in str(error.value)
