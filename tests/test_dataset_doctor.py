"""``lerobot_nodes.dataset_doctor``: footer reads, grouping and capping, and its cost at scale.

The command-line cases (real damaged datasets through ``lerobot-nodes inspect``) are in
``tests/cli/test_cli_inspect_doctor.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_nodes.dataset_doctor import (
    ERROR,
    FOOTER_TAIL,
    LINES_PER_KIND,
    WARNING,
    Finding,
    Findings,
    check_data_files,
    describe_episodes,
    listing,
    read_footer_facts,
)
from lerobot_nodes.format.meta import DatasetMeta, EpisodeTable, EpisodeTasks
from lerobot_nodes.sources import LocalSource


class CountingSource:
    """Reads a local folder and counts range reads per file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.reads: list[tuple[str, int, int]] = []

    def read_range(self, path: str, start: int, end: int) -> bytes:
        self.reads.append((path, start, end))
        with open(self.root / path, "rb") as handle:
            handle.seek(start)
            return handle.read(end - start)


def test_episodes_are_described_as_runs() -> None:
    assert describe_episodes(np.array([4])) == "episode 4"
    assert describe_episodes(np.array([3, 0, 1, 2, 7])) == "episodes 0-3, 7 (5 episodes)"
    many = np.arange(0, 40, 2)
    assert describe_episodes(many) == "episodes 0, 2, 4, 6, 8, 10, ... (20 episodes)"


def test_findings_are_grouped_by_kind_and_capped() -> None:
    findings = Findings()
    for i in range(LINES_PER_KIND + 7):
        findings.add(Finding(ERROR, "data row count", f"file {i}", np.array([i])))
    findings.add(Finding(WARNING, "stats", "meta/stats.json is missing"))
    findings.add_counted(ERROR, "data row count", 3)
    assert (findings.errors, findings.warnings) == (LINES_PER_KIND + 10, 1)
    lines = findings.lines()
    assert lines[0] == f"  error: data row count ({LINES_PER_KIND + 10})"
    assert lines[1] == "    file 0 [episode 0]"
    assert lines[LINES_PER_KIND + 1] == "    ... and 10 more"
    assert lines[LINES_PER_KIND + 2 :] == ["  warning: stats (1)", "    meta/stats.json is missing"]


@pytest.mark.parametrize("row_groups", [1, 400])
def test_a_footer_is_one_read_unless_longer_than_the_tail(tmp_path: Path, row_groups: int) -> None:
    table = pa.table({"index": np.arange(4000), "episode_index": np.arange(4000) // 10})
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=4000 // row_groups)
    size = (tmp_path / "f.parquet").stat().st_size
    footer = pq.ParquetFile(tmp_path / "f.parquet").metadata.serialized_size
    source = CountingSource(tmp_path)
    facts = read_footer_facts(source, "f.parquet", size)  # type: ignore[arg-type]
    assert facts.num_rows == 4000
    assert facts.ranges == {"index": (0.0, 3999.0), "episode_index": (0.0, 399.0)}
    assert len(source.reads) == (1 if footer + 8 <= FOOTER_TAIL else 2), (footer, source.reads)
    assert source.reads[0] == ("f.parquet", max(0, size - FOOTER_TAIL), size)
    if row_groups == 400:
        assert footer + 8 > FOOTER_TAIL and source.reads[1][2] == source.reads[0][1]  # only what the tail missed


def test_a_damaged_footer_says_what_is_wrong(tmp_path: Path) -> None:
    pq.write_table(pa.table({"index": np.arange(100)}), tmp_path / "f.parquet")
    data = (tmp_path / "f.parquet").read_bytes()
    (tmp_path / "half.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "bad.parquet").write_bytes(data[:-12] + b"\xff" * 4 + data[-8:])
    source = CountingSource(tmp_path)
    with pytest.raises(ValueError, match=r"^half.parquet is not a Parquet file \(no PAR1 magic at its end\)$"):
        read_footer_facts(source, "half.parquet", len(data) // 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^bad.parquet: malformed Parquet footer: "):
        read_footer_facts(source, "bad.parquet", len(data))  # type: ignore[arg-type]


def synthetic_meta(root: Path, episodes: int, files: int, length: int, fps: int = 30) -> DatasetMeta:
    """``episodes`` episodes of ``length`` rows over ``files`` data files (just the columns the checks read)."""
    per_file = episodes // files
    for f in range(files):
        first = f * per_file
        index = np.arange(first * length, (first + per_file) * length)
        frame = np.tile(np.arange(length), per_file)
        table = pa.table({
            "timestamp": pa.array(frame / fps, pa.float32()), "frame_index": frame,
            "episode_index": index // length, "index": index,
        })  # fmt: skip
        path = root / f"data/chunk-000/file-{f:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=1 << 20)
    starts = np.arange(episodes, dtype=np.int64) * length
    table = EpisodeTable(
        episode_index=np.arange(episodes, dtype=np.int64),
        length=np.full(episodes, length, dtype=np.int64),
        dataset_from_index=starts,
        dataset_to_index=starts + length,
        data_chunk_index=np.zeros(episodes, dtype=np.int64),
        data_file_index=np.arange(episodes, dtype=np.int64) // per_file,
        tasks=EpisodeTasks(np.zeros(episodes + 1, dtype=np.int64), np.zeros(0, dtype=np.int32), []),
        videos={},
    )
    info = {"fps": fps, "features": {}, "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"}
    return DatasetMeta(source=LocalSource(root), info=info, episodes=table, tasks=[], stats=None)


def test_a_million_rows_are_checked_from_footers(tmp_path: Path) -> None:
    meta = synthetic_meta(tmp_path, episodes=200_000, files=4, length=5)
    # Damage: file 2 loses its last 100 rows (its last 20 episodes).
    path = tmp_path / "data/chunk-000/file-002.parquet"
    pq.write_table(pq.read_table(path).slice(0, 50_000 * 5 - 100), path)
    findings = Findings()
    bad = check_data_files(meta, np.arange(200_000), listing(meta.source, False), 1e-4, findings)
    kinds = {kind: [f.line() for f in kept] for kind, (_, kept, _) in findings.kinds.items()}
    assert kinds == {
        "data row count": [
            "data/chunk-000/file-002.parquet holds 249900 rows; meta/episodes places 250000 rows (the length of its "
            "episodes) in it [episodes 100000-149999 (50000 episodes)]"
        ],
        "data index range": [
            "data/chunk-000/file-002.parquet: index spans [500000, 749899]; meta/episodes says [500000, 749999] "
            "[episodes 100000-149999 (50000 episodes)]"
        ],
        "data episode_index range": [
            "data/chunk-000/file-002.parquet: episode_index spans [100000, 149979]; meta/episodes says "
            "[100000, 149999] [episodes 100000-149999 (50000 episodes)]"
        ],
    }
    assert np.array_equal(bad, np.arange(100_000, 150_000))
