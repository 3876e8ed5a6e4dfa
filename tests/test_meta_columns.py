"""``meta/episodes`` is read column-pruned: only the columns the package uses, never the
per-episode ``stats/...`` columns (issue 28), checked on real Parquet files through a source
that records every byte range it serves."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_nodes import MetadataError, load_meta
from lerobot_nodes.format.meta import (
    EpisodeTasks,
    _EpisodeFileColumns,
    _merge_tasks,
    _task_lists,
    episode_columns,
    load_episode_columns,
)
from lerobot_nodes.format.parquet_columns import read_columns
from lerobot_nodes.sources import LocalSource
from lerobot_nodes.testing import write_dataset

TAIL_GUESS = 64 * 1024  # the first footer read: the file's last 64 KiB
EXTRA_STATS = 60  # stats/... columns added to every episodes file, on top of the writer's
EXTRA_WIDTH = 400  # doubles per extra stats value


class RecordingSource(LocalSource):
    """A local dataset root that remembers what it served: whole files and byte ranges."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.whole: list[str] = []
        self.ranges: list[tuple[str, int, int]] = []

    def _read_file(self, path):
        self.whole.append(path)
        return super()._read_file(path)

    def _read_ranges(self, path, ranges):
        self.ranges.extend((path, start, end) for start, end in ranges)
        return super()._read_ranges(path, ranges)

    def served(self, path: str) -> list[tuple[int, int]]:
        return [(start, end) for p, start, end in self.ranges if p == path]


def _chunk_range(metadata: pq.FileMetaData, group: int, column: int) -> tuple[int, int]:
    chunk = metadata.row_group(group).column(column)
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset:
        start = min(start, chunk.dictionary_page_offset)
    return start, start + chunk.total_compressed_size


def _top_level_name(metadata: pq.FileMetaData, column: int) -> str:
    """The top-level field a leaf belongs to (names hold dots, so match against the schema)."""
    path = metadata.schema.column(column).path
    names = metadata.schema.to_arrow_schema().names
    return max((n for n in names if path == n or path.startswith(n + ".")), key=len)


def _overlap(ranges: list[tuple[int, int]], targets: list[tuple[int, int]]) -> int:
    total = 0
    for start, end in ranges:
        for t_start, t_end in targets:
            total += max(0, min(end, t_end) - max(start, t_start))
    return total


def _add_stats_columns(path, count: int = EXTRA_STATS, width: int = EXTRA_WIDTH) -> None:
    """Append ``count`` wide ``stats/extra_i/mean`` columns to an episodes file, keeping its
    row groups of 10 rows (as LeRobot writes them)."""
    table = pq.read_table(path)
    rng = np.random.default_rng(0)
    rows = table.num_rows
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * width)
    for i in range(count):
        values = pa.ListArray.from_arrays(offsets, pa.array(rng.standard_normal(rows * width)))
        table = table.append_column(f"stats/extra_{i}/mean", values)
    pq.write_table(table, path, row_group_size=10, compression="snappy")


def _episode_files(root) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in (root / "meta" / "episodes").rglob("*.parquet"))


@pytest.fixture(scope="module")
def wide_dataset(tmp_path_factory):
    """12 episodes whose metadata rolled over into several files, each with ~150 stats columns."""
    root = write_dataset(
        tmp_path_factory.mktemp("wide") / "ds",
        num_episodes=12,
        episode_lengths=[3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6],
        height=16,
        width=16,
        data_file_size_in_mb=0.03,
    )
    expected = load_meta(LocalSource(root))
    for path in _episode_files(root):
        _add_stats_columns(root / path)
    return root, expected


def test_opening_reads_no_stats_column(wide_dataset):
    root, expected = wide_dataset
    files = _episode_files(root)
    assert len(files) > 1, "the fixture should roll the episode metadata over into several files"
    source = RecordingSource(root)
    meta = load_meta(source)

    assert not [p for p in source.whole if p.startswith("meta/episodes/")]
    needed = set(episode_columns(meta.info))
    stats_total = 0
    for path in files:
        metadata = pq.read_metadata(root / path)
        stats, wanted = [], []
        for column in range(metadata.num_columns):
            name = _top_level_name(metadata, column)
            ranges = [_chunk_range(metadata, g, column) for g in range(metadata.num_row_groups)]
            if name.startswith("stats/"):
                stats += ranges
            elif name in needed:
                wanted += ranges
        served = source.served(path)
        stats_bytes = sum(end - start for start, end in stats)
        stats_total += stats_bytes
        # Stats bytes are fetched only where they sit inside the first footer read (the last 64 KiB).
        assert _overlap(served, stats) <= TAIL_GUESS, path
        assert _overlap(served, wanted) == sum(end - start for start, end in wanted), path
    assert stats_total > 4 * TAIL_GUESS * len(files)  # the check above has bytes to miss
    read = sum(end - start for p, start, end in source.ranges if p.startswith("meta/episodes/"))
    on_disk = sum((root / p).stat().st_size for p in files)
    assert read < on_disk / 3

    # Same metadata as before the stats columns were added.
    for name in ("episode_index", "length", "dataset_from_index", "dataset_to_index", "data_chunk_index", "data_file_index"):
        np.testing.assert_array_equal(getattr(meta.episodes, name), getattr(expected.episodes, name))
    assert meta.episodes.videos.keys() == expected.episodes.videos.keys()
    for key, spans in meta.episodes.videos.items():
        for field in ("chunk_index", "file_index", "from_timestamp", "to_timestamp"):
            np.testing.assert_array_equal(getattr(spans, field), getattr(expected.episodes.videos[key], field))
    whole = pa.concat_tables([pq.read_table(root / p, columns=["tasks"]) for p in files])
    assert list(meta.episodes.tasks) == whole.column("tasks").to_pylist() == list(expected.episodes.tasks)
    assert meta.tasks == expected.tasks and meta.data_files() == expected.data_files()
    assert meta.video_files() == expected.video_files()


def test_episode_arrays_are_numpy_and_tasks_compact(wide_dataset):
    root, _ = wide_dataset
    episodes = load_meta(LocalSource(root)).episodes
    for name in ("episode_index", "length", "dataset_from_index", "dataset_to_index", "data_chunk_index", "data_file_index"):
        array = getattr(episodes, name)
        assert isinstance(array, np.ndarray) and array.dtype == np.int64
    for spans in episodes.videos.values():
        assert spans.from_timestamp.dtype == spans.to_timestamp.dtype == np.float64
    tasks = episodes.tasks
    assert isinstance(tasks, EpisodeTasks) and isinstance(tasks.ids, np.ndarray)
    assert len(tasks.names) == len(set(tasks.names)) <= 3  # one string per distinct task
    assert len(tasks.offsets) == len(episodes) + 1


def test_stats_columns_are_read_when_asked(wide_dataset):
    root, _ = wide_dataset
    files = _episode_files(root)
    source = RecordingSource(root)
    meta = load_meta(source)
    before = len(source.ranges)
    asked = ["stats/action/mean", "stats/extra_3/mean"]
    table = meta.read_episode_columns(asked)
    assert len(source.ranges) > before
    whole = pa.concat_tables([pq.read_table(root / p, columns=asked) for p in files])
    assert table.column_names == asked and table.num_rows == len(meta.episodes)
    assert table.to_pylist() == whole.to_pylist()
    with pytest.raises(MetadataError, match=r"no column 'stats/absent/mean'"):
        load_episode_columns(source, ["stats/absent/mean"])


def test_a_column_only_some_files_have_is_null_in_the_others(wide_dataset, tmp_path):
    import shutil

    root, _ = wide_dataset
    copy = tmp_path / "ds"
    shutil.copytree(root, copy)
    first = copy / _episode_files(copy)[0]
    table = pq.read_table(first)
    pq.write_table(table.drop_columns(["stats/extra_0/mean"]), first, row_group_size=10)
    column = load_episode_columns(LocalSource(copy), ["stats/extra_0/mean"]).column(0)
    assert column.null_count == table.num_rows and len(column) == len(load_meta(LocalSource(copy)).episodes)


def test_a_dataset_without_the_optional_columns_still_opens(dataset_copy):
    expected = load_meta(LocalSource(dataset_copy))
    path = dataset_copy / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    optional = [n for n in table.column_names if n == "tasks" or n.startswith(("stats/", "meta/episodes/"))]
    assert "tasks" in optional and len(optional) > 10
    pq.write_table(table.drop_columns(optional), path)
    meta = load_meta(LocalSource(dataset_copy))
    assert list(meta.episodes.tasks) == [[] for _ in range(len(meta.episodes))]
    np.testing.assert_array_equal(meta.episodes.length, expected.episodes.length)
    assert meta.video_files() == expected.video_files()


def test_a_missing_required_column_is_named(dataset_copy):
    path = dataset_copy / "meta/episodes/chunk-000/file-000.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["videos/observation.images.top/from_timestamp"]), path)
    with pytest.raises(MetadataError, match=r"file-000\.parquet: required column 'videos/observation\.images\.top/from_timestamp'"):
        load_meta(LocalSource(dataset_copy))


def test_read_columns_with_a_footer_longer_than_the_first_read(tmp_path):
    """Many row groups make a footer of more than 64 KiB: read exactly, in a second read."""
    rng = np.random.default_rng(1)
    rows = 2000
    columns = {"keep.a/x": pa.array(np.arange(rows)), "tasks": pa.array([["t"]] * rows)}
    for i in range(40):
        columns[f"stats/f.{i}/mean"] = pa.array(rng.standard_normal(rows))
    columns["keep_last"] = pa.array(np.arange(rows) * 2.0)
    pq.write_table(pa.table(columns), tmp_path / "t.parquet", row_group_size=10)
    metadata = pq.read_metadata(tmp_path / "t.parquet")
    assert metadata.serialized_size > TAIL_GUESS
    source = RecordingSource(tmp_path)
    wanted = ["keep_last", "tasks", "keep.a/x", "absent"]
    read = read_columns(source, "t.parquet", wanted)
    assert read.table.column_names == ["keep.a/x", "tasks", "keep_last"]  # file order, absent left out
    assert read.table.equals(pq.read_table(tmp_path / "t.parquet", columns=["keep.a/x", "tasks", "keep_last"]))
    size = (tmp_path / "t.parquet").stat().st_size
    footer_start = size - 8 - metadata.serialized_size
    # The tail first, then exactly the part of the footer it missed: no byte of the footer read twice.
    assert source.served("t.parquet")[:2] == [(size - TAIL_GUESS, size), (footer_start, size - TAIL_GUESS)]
    assert read.bytes_fetched < size / 2
    whole = read_columns(source, "t.parquet", wanted, whole_file=True)
    assert whole.table.equals(read.table) and source.whole == ["t.parquet"]


def test_episode_tasks_behave_like_lists():
    lists = [["a"], [], ["b", "a"], [None], ["a"]]
    tasks = EpisodeTasks.from_lists(lists)
    assert len(tasks) == 5 and list(tasks) == lists and tasks == lists and tasks.tolist() == lists
    assert tasks[-1] == ["a"] and tasks[1:3] == [[], ["b", "a"]] and tasks[np.int64(2)] == ["b", "a"]
    assert tasks.names == ["a", "b", None]
    with pytest.raises(IndexError):
        tasks[5]
    assert tasks != [["a"]]


def test_reading_columns_leaves_no_reference_cycle(wide_dataset):
    """A parsed footer is large (MBs for DROID-sized files): it must be freed when the read
    returns, not at some later garbage collection (``FileMetaData.schema`` makes a cycle)."""
    import gc

    root, _ = wide_dataset
    path = _episode_files(root)[0]
    source = LocalSource(root)
    while gc.collect():  # earlier tests' garbage can take more than one pass (a finalizer frees more)
        pass
    gc.disable()
    try:
        read_columns(source, path, ["length", "tasks"])
        read_columns(source, path, ["length", "tasks"], whole_file=True)
        assert gc.collect() == 0
    finally:
        gc.enable()


class AdvisedSource(LocalSource):
    """A local dataset root that remembers what it was advised to read ahead, and when."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.events: list[tuple[str, str, list[tuple[int, int]]]] = []

    def advise(self, path, ranges):
        self.events.append(("advised", path, list(ranges)))
        super().advise(path, ranges)

    def _read_ranges(self, path, ranges):
        self.events.append(("read", path, list(ranges)))
        return super()._read_ranges(path, ranges)


def test_each_episodes_file_advises_the_tail_of_the_next_before_it_is_parsed(wide_dataset):
    """While a reader parses one ``meta/episodes`` file, the disk reads the next one's footer (a cold 1M-episode
    open waited for the disk on every file: RESULTS 13)."""
    root, expected = wide_dataset
    files = _episode_files(root)
    source = AdvisedSource(root)  # few files: read by threads of this process, so the events are seen here
    meta = load_meta(source, table_cache=False)
    np.testing.assert_array_equal(meta.episodes.length, expected.episodes.length)
    advised = [(path, ranges) for kind, path, ranges in source.events if kind == "advised"]
    assert [path for path, _ in advised] == files[1:]
    for before, (path, ranges) in zip(files, advised, strict=False):
        # The tail fetched of the file before it: its last 64 KiB, or its whole footer if longer.
        before_size = (root / before).stat().st_size
        footer_start = before_size - 8 - pq.read_metadata(root / before).serialized_size
        before_tail = before_size - min(max(0, before_size - TAIL_GUESS), footer_start)
        size = (root / path).stat().st_size
        assert ranges == [(max(0, size - before_tail), size)], path
    # Advised after its own footer was fetched, before its chunks were (the parse runs in between).
    for index, path in enumerate(files[:-1]):
        events = [(kind, p) for kind, p, _ in source.events if p in (path, files[index + 1])]
        first_advice = events.index(("advised", files[index + 1]))
        assert ("read", path) in events[:first_advice]


def test_advising_a_local_source_never_fails_nor_changes_what_is_read(tmp_path):
    data = bytes(range(256)) * 64
    (tmp_path / "f.bin").write_bytes(data)
    source = LocalSource(tmp_path)
    for path, ranges in [("f.bin", [(0, 10), (100, 50_000)]), ("absent.bin", [(0, 1)]), ("../outside", [(0, 1)]),
                         ("f.bin", [(5, 5), (-3, 2)])]:
        source.advise(path, ranges)  # past the end, empty, negative, missing, outside the root: ignored
    assert source.stats.requests == 0 and source.stats.bytes_read == 0
    ranges = [(0, 10), (4000, 4100), (16000, 16384)]
    assert source.read_ranges("f.bin", ranges) == [data[s:e] for s, e in ranges]


_TASK_LISTS = st.lists(st.lists(st.sampled_from(["pick", "place", "push the red block", None]), max_size=3), max_size=12)


@settings(max_examples=60, deadline=None)
@given(files=st.lists(_TASK_LISTS, min_size=1, max_size=5))
def test_tasks_merged_across_files_are_the_tasks_of_every_episode_in_order(files):
    """Each file's tasks are encoded against its own vocabulary; merged, every episode has its own tasks again, and the
    vocabulary holds each name once (a missing task too), the names of earlier files first."""
    parts = []
    for episodes in files:
        table = pa.table({"tasks": pa.array(episodes, pa.list_(pa.string()))})
        lengths, ids, names = _task_lists(table)
        parts.append(_EpisodeFileColumns(table.num_rows, {}, lengths, ids, names))
    merged = _merge_tasks(parts)
    every_episode = [episode for episodes in files for episode in episodes]
    assert list(merged) == every_episode
    assert len(set(merged.names)) == len(merged.names)
    assert set(merged.names) == {name for episode in every_episode for name in episode}
    first_file = list(dict.fromkeys(name for episode in files[0] for name in episode if name is not None))
    assert merged.names[: len(first_file)] == first_file
