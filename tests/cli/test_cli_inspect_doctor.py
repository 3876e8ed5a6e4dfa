"""``lerobot-nodes inspect`` as the dataset doctor: real datasets, damaged for real, checked by the real CLI.

Each case copies a dataset written by ``lerobot_nodes.testing.write_dataset`` (six episodes, one
data Parquet per episode, one MP4 per camera), damages the copy the way a half-finished upload
or a careless converter does, and runs ``lerobot-nodes inspect`` in a subprocess.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.static_http import StaticHttpServer

from .cli_process import run_cli

LENGTHS = [120, 130, 110, 140, 125, 135]
TOP = "observation.images.top"
WRIST = "observation.images.wrist"
DATA = "data/chunk-000/file-{:03d}.parquet"
TOP_MP4 = f"videos/{TOP}/chunk-000/file-000.mp4"
WRIST_MP4 = f"videos/{WRIST}/chunk-000/file-000.mp4"
EPISODES = "meta/episodes/chunk-000/file-{:03d}.parquet"
HEALTHY = "dataset files: every data Parquet footer, row count and range, MP4 frame count, stats and file agree"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_dataset(
        tmp_path_factory.mktemp("doctor") / "dataset", episode_lengths=LENGTHS, seed=5, data_file_size_in_mb=0.005
    )
    assert sorted(p.name for p in (root / "data/chunk-000").iterdir()) == [f"file-{i:03d}.parquet" for i in range(6)]
    return root


@pytest.fixture
def dataset(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "dataset"))


def inspect(root: Path | str, *flags: str) -> tuple[int, list[str]]:
    result = run_cli("inspect", f"--dataset.root={root}", *flags)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout.splitlines()


def findings(lines: list[str]) -> list[str]:
    """The dataset doctor's block: from its head line to the video metadata line."""
    start = next(i for i, line in enumerate(lines) if line.startswith("dataset files: "))
    end = next(i for i, line in enumerate(lines) if line.startswith("video metadata: "))
    return lines[start:end]


def truncate_to_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def rewrite(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    table = pq.read_table(path)
    pq.write_table(edit(table), path)


def test_a_healthy_dataset_passes(dataset: Path) -> None:
    code, lines = inspect(dataset)
    assert code == 0, lines
    assert lines[-2:] == [
        HEALTHY,
        "video metadata: the camera info of 2 cameras and the video spans of 6 episodes agree with the MP4 streams",
    ]


def test_a_parquet_cut_to_half_fails_as_stream_does(dataset: Path) -> None:
    truncate_to_half(dataset / DATA.format(0))
    code, lines = inspect(dataset)
    assert code == 1, lines
    assert findings(lines) == [
        "dataset files: 1 error, 0 warnings",
        "  error: data file unreadable (1)",
        f"    {DATA.format(0)} is not a Parquet file (no PAR1 magic at its end) [episode 0]",
    ]
    stream = run_cli("stream", f"--dataset.root={dataset}", "--steps=2", "--num_workers=0", "--quiet")
    # stream stops with the same error, exit 1 (it used to crash now and then at exit: an index
    # mapping was unmapped by an exit handler while a decode thread still read it)
    assert stream.returncode == 1 and "no PAR1 magic at its end" in stream.stderr, (stream.returncode, stream.stderr)


def test_a_parquet_with_100_rows_removed_fails(dataset: Path) -> None:
    path = dataset / DATA.format(1)
    rewrite(path, lambda t: pa.concat_tables([t.slice(0, 10), t.slice(110)]))
    assert pq.ParquetFile(path).metadata.num_rows == LENGTHS[1] - 100
    code, lines = inspect(dataset)
    assert code == 1, lines
    assert findings(lines) == [
        "dataset files: 1 error, 0 warnings",
        "  error: data row count (1)",
        f"    {DATA.format(1)} holds 30 rows; meta/episodes places 130 rows (the length of its episodes) in it "
        "[episode 1]",
    ]


def test_index_episode_and_timestamp_ranges_come_from_the_footer(dataset: Path) -> None:
    def shift_index(table: pa.Table) -> pa.Table:
        column = table.schema.get_field_index("index")
        return table.set_column(column, "index", pc.add(table.column("index"), 1000))

    def wrong_episode(table: pa.Table) -> pa.Table:
        column = table.schema.get_field_index("episode_index")
        return table.set_column(column, "episode_index", pc.add(table.column("episode_index"), 1))

    def slow_clock(table: pa.Table) -> pa.Table:
        column = table.schema.get_field_index("timestamp")
        doubled = pc.cast(pc.multiply(table.column("timestamp"), 2), table.schema.field("timestamp").type)
        return table.set_column(column, "timestamp", doubled)

    rewrite(dataset / DATA.format(2), shift_index)
    rewrite(dataset / DATA.format(3), wrong_episode)
    rewrite(dataset / DATA.format(4), slow_clock)
    code, lines = inspect(dataset)
    assert code == 1, lines
    assert findings(lines) == [
        "dataset files: 3 errors, 0 warnings",
        "  error: data index range (1)",
        f"    {DATA.format(2)}: index spans [1250, 1359]; meta/episodes says [250, 359] [episode 2]",
        "  error: data episode_index range (1)",
        f"    {DATA.format(3)}: episode_index spans [4, 4]; meta/episodes says [3, 3] [episode 3]",
        "  error: data timestamp range (1)",
        f"    {DATA.format(4)}: timestamp spans [0.000000, 8.266666] s; meta/episodes says [0.000000, 4.133333] s "
        "[episode 4]",
    ]


def test_a_deleted_mp4_names_every_episode_it_holds(dataset: Path) -> None:
    (dataset / WRIST_MP4).unlink()
    code, lines = inspect(dataset)
    assert code == 1, lines
    assert findings(lines) == [
        "dataset files: 1 error, 0 warnings",
        "  error: video file missing (1)",
        f"    {WRIST_MP4} is not in {dataset} [episodes 0-5 (6 episodes)]",
    ]
    assert lines[-3:] == [
        "video metadata: not checked (no episode has all its MP4s indexed; see above)",
        "--dataset.streaming_bad_episodes=skip leaves out 6 episodes of 6:",
        f"  video file missing: episodes 0, 1, 2, 3, 4, ... (6 episodes): {WRIST_MP4} is not in {dataset}",
    ]


def test_a_span_holding_too_few_frames(dataset: Path) -> None:
    """Episode 2's span of the top camera ends 10 frames early: inside the file, but 10 frames short."""
    column = f"videos/{TOP}/to_timestamp"

    def shorten(table: pa.Table) -> pa.Table:
        values = table.column(column).to_pylist()
        values[0] -= 10 / 30
        return table.set_column(table.schema.get_field_index(column), column, pa.array(values, pa.float64()))

    rewrite(dataset / EPISODES.format(2), shorten)  # one episode per meta/episodes file
    code, lines = inspect(dataset)
    assert code == 1, lines
    block = findings(lines)
    assert block[:2] == ["dataset files: 1 error, 0 warnings", "  error: video frame count (1)"], block
    assert block[2].startswith(f"    episode 2 (camera {TOP}): [8.333333, 11.666667) s of {TOP_MP4} holds 100 frames; "
                               "meta/episodes says length 110 [episode 2]"), block  # fmt: skip


def test_files_no_episode_refers_to_are_warnings_capped_per_kind(dataset: Path) -> None:
    for i in range(25):
        shutil.copy(dataset / DATA.format(0), dataset / DATA.format(100 + i))
    code, lines = inspect(dataset)
    assert code == 0, lines
    block = findings(lines)
    assert block[:2] == ["dataset files: 0 errors, 25 warnings", "  warning: files no episode refers to (25)"]
    assert block[2] == f"    {DATA.format(100)} ({(dataset / DATA.format(0)).stat().st_size} bytes)"
    assert len(block) == 2 + 20 + 1 and block[-1] == "    ... and 5 more", block


def test_missing_stats_is_a_warning(dataset: Path) -> None:
    (dataset / "meta/stats.json").unlink()
    code, lines = inspect(dataset)
    assert code == 0, lines
    assert findings(lines) == [
        "dataset files: 0 errors, 1 warning",
        "  warning: stats (1)",
        "    meta/stats.json is missing (LeRobot training normalises with it)",
    ]


def test_every_problem_is_listed_with_its_episodes_grouped(dataset: Path) -> None:
    truncate_to_half(dataset / DATA.format(0))
    truncate_to_half(dataset / DATA.format(5))
    rewrite(dataset / DATA.format(1), lambda t: pa.concat_tables([t.slice(0, 10), t.slice(110)]))
    (dataset / WRIST_MP4).unlink()
    shutil.copy(dataset / DATA.format(2), dataset / DATA.format(9))
    code, lines = inspect(dataset)
    assert code == 1, lines
    assert findings(lines) == [
        "dataset files: 4 errors, 1 warning",
        "  error: data file unreadable (2)",
        f"    {DATA.format(0)} is not a Parquet file (no PAR1 magic at its end) [episode 0]",
        f"    {DATA.format(5)} is not a Parquet file (no PAR1 magic at its end) [episode 5]",
        "  error: data row count (1)",
        f"    {DATA.format(1)} holds 30 rows; meta/episodes places 130 rows (the length of its episodes) in it "
        "[episode 1]",
        "  error: video file missing (1)",
        f"    {WRIST_MP4} is not in {dataset} [episodes 0-5 (6 episodes)]",
        "  warning: files no episode refers to (1)",
        f"    {DATA.format(9)} ({(dataset / DATA.format(2)).stat().st_size} bytes)",
    ]


def test_a_selection_is_checked_only_for_the_files_it_uses(dataset: Path) -> None:
    truncate_to_half(dataset / DATA.format(0))
    shutil.copy(dataset / DATA.format(2), dataset / DATA.format(9))  # orphans are looked for only without a selection
    code, lines = inspect(dataset, "--dataset.episodes=[2,3]")
    assert code == 0, lines
    assert "  checking 2 selected episodes and the files they use" in lines
    assert lines[-2:] == [
        HEALTHY,
        "video metadata: the camera info of 2 cameras and the video spans of 2 episodes agree with the MP4 streams",
    ]
    code, lines = inspect(dataset, "--dataset.episodes=[3,0]")
    assert code == 1, lines
    assert findings(lines)[1:] == [
        "  error: data file unreadable (1)",
        f"    {DATA.format(0)} is not a Parquet file (no PAR1 magic at its end) [episode 0]",
    ]


def test_decode_reports_what_only_the_decoder_sees(dataset: Path) -> None:
    """Noise in the middle of an MP4's payload: the index is intact, so only --decode finds it."""
    path = dataset / TOP_MP4
    data = bytearray(path.read_bytes())
    middle = len(data) // 3
    data[middle : middle + 40_000] = os.urandom(40_000)
    path.write_bytes(bytes(data))
    code, lines = inspect(dataset)
    assert code == 0, lines
    code, lines = inspect(dataset, "--decode")
    assert code == 1, lines
    block = findings(lines)
    assert block[1].startswith("  error: decode error ("), block
    assert all(" frame " in line and line.endswith("]") and TOP_MP4 in line for line in block[2:]), block
    assert any(line.startswith("decode: read ") and "of 6 episodes" in line for line in lines), lines


def test_decode_of_a_healthy_selection(dataset: Path) -> None:
    code, lines = inspect(dataset, "--decode", "--dataset.episodes=[1]")
    assert code == 0, lines
    assert any(line.startswith("decode: read 130 samples of 1 episode in ") for line in lines), lines
    assert lines[-2] == HEALTHY


def test_a_remote_root_costs_one_footer_read_per_data_file(dataset: Path) -> None:
    truncate_to_half(dataset / DATA.format(0))
    with StaticHttpServer(dataset, mount="/ds") as server:
        code, lines = inspect(server.url)
        # bytes=0-0: the plain HTTP source's size probe when it lists a root (no listing API), not a read
        data_reads = [r for r in server.records if "/data/" in r.path and r.method == "GET" and r.range != "bytes=0-0"]
    assert code == 1, lines
    assert findings(lines)[1:] == [
        "  error: data file unreadable (1)",
        f"    {DATA.format(0)} is not a Parquet file (no PAR1 magic at its end) [episode 0]",
    ]
    per_file: dict[str, int] = {}
    for record in data_reads:
        per_file[record.path] = per_file.get(record.path, 0) + 1
    assert len(per_file) == 6 and all(count == 1 for count in per_file.values()), per_file
    assert all(r.range is not None and r.status == 206 for r in data_reads), data_reads


def test_a_deleted_data_file_and_a_selection_without_it(dataset: Path) -> None:
    (dataset / DATA.format(0)).unlink()
    code, lines = inspect(dataset)
    assert code == 1, lines
    assert findings(lines)[1:] == ["  error: data file missing (1)", f"    {DATA.format(0)} is not in {dataset} [episode 0]"]
    # The map-style reader checks every file at open, so --decode of other episodes is skipped, as a warning.
    code, lines = inspect(dataset, "--dataset.episodes=[2]", "--decode")
    assert code == 0, lines
    block = findings(lines)
    assert block[:2] == ["dataset files: 0 errors, 1 warning", "  warning: decode skipped (1)"], block
    assert block[2].startswith("    the map-style reader does not open: episode 0 needs data/chunk-000/file-000.parquet")
