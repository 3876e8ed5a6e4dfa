"""Each byte once per epoch, without a disk cache: what the loopback Hub serves for one epoch.

The dataset is LeRobot-like: H.264 GOP 30 with B-frames (x264 defaults), two cameras rolled over
into several MP4s with ``moov`` at the end (no faststart), data Parquet files rewritten with
several row groups, some holding the end of one episode and the start of the next. The real
huggingface_hub client resolves the revision and lists the files; payloads go through the
native range reader. Samples must equal the map-style reader's on the local copy.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.nodes.sharder import rank_worker_split
from lerobot_nodes.sources import open_source
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.hub import LoopbackHub

from .streaming_checks import assert_epoch_matches_local, epoch_samples, streaming

REPO = "lerobot-nodes/bytes-once"
SEED = 3  # streaming_checks.streaming's seed: the worker split below is the one the epoch uses
LENGTHS = [96, 131, 77, 118, 140, 89, 124, 103, 112, 85]


@pytest.fixture(autouse=True)
def hub_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))  # no sidecar or file cache from before
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bytes-once") / "written"
    return write_dataset(
        root, episode_lengths=LENGTHS, codec="h264", gop=30, video_faststart=False, height=96, width=128,
        video_files_size_in_mb=0.12, data_file_size_in_mb=0.06, seed=11,
    )


def _restripe(root: Path, cuts_of) -> None:
    """Rewrite each data Parquet with row groups ending at ``cuts_of(table)`` (same rows and schema)."""
    for path in sorted((root / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        cuts = [c for c in cuts_of(table) if 0 < c < table.num_rows] + [table.num_rows]
        with pq.ParquetWriter(path, table.schema, compression="snappy") as writer:
            start = 0
            for cut in cuts:
                writer.write_table(table.slice(start, cut - start), row_group_size=cut - start)
                start = cut


def _copy(written: Path, target: Path) -> Path:
    shutil.copytree(written, target)
    for path in target.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


@pytest.fixture(scope="module")
def uniform(written, tmp_path_factory) -> Path:
    """Row groups of 150 rows, cut regardless of episodes (as LeRobot's writers cut them)."""
    root = _copy(written, tmp_path_factory.mktemp("bytes-once") / "uniform")
    _restripe(root, lambda table: range(150, table.num_rows, 150))
    return root


@pytest.fixture(scope="module")
def per_worker(written, tmp_path_factory) -> Path:
    """Row groups that each hold consecutive episodes of one DataLoader worker (of two), so
    sharing happens within a worker only and each row group has one reader per epoch."""
    root = _copy(written, tmp_path_factory.mktemp("bytes-once") / "per-worker")
    episodes = list(range(load_meta(open_source(root)).total_episodes))
    split = rank_worker_split(episodes, [LENGTHS[e] for e in episodes], 0, 1, 2, SEED)
    worker_of = {e: w for w, part in enumerate(split) for e in part}

    def cuts(table):
        index = table.column("episode_index").to_pylist()
        return [i for i in range(1, len(index)) if worker_of[index[i]] != worker_of[index[i - 1]]]

    _restripe(root, cuts)
    return root


def _shared_groups(root: Path) -> int:
    """Row groups holding rows of two or more episodes."""
    shared = 0
    for path in (root / "data").rglob("*.parquet"):
        file = pq.ParquetFile(path)
        for group in range(file.num_row_groups):
            column = file.read_row_group(group, columns=["episode_index"]).column(0)
            shared += len(pa.compute.unique(column)) > 1
    return shared


def _files(root: Path, kind: str) -> dict[str, int]:
    folder = {"parquet": "data", "mp4": "videos"}[kind]
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in (root / folder).rglob(f"*.{kind}")}


def _footer_bytes(root: Path) -> int:
    """Footer plus its 8-byte trailer, summed over the data Parquet files."""
    total = 0
    for path in (root / "data").rglob("*.parquet"):
        with path.open("rb") as handle:
            handle.seek(-8, 2)
            total += struct.unpack("<I", handle.read(4))[0] + 8
    return total


def _row_groups_at_cuts(root: Path, worker_of: dict[int, int]) -> int:
    """Compressed bytes of the row groups holding rows of two workers (the ones at the split's cuts)."""
    shared = 0
    for path in (root / "data").rglob("*.parquet"):
        file = pq.ParquetFile(path)
        for group in range(file.num_row_groups):
            column = file.read_row_group(group, columns=["episode_index"]).column(0)
            if len({worker_of[e] for e in pa.compute.unique(column).to_pylist()}) > 1:
                meta = file.metadata.row_group(group)
                shared += sum(meta.column(c).total_compressed_size for c in range(meta.num_columns))
    return shared


def _dataset_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts)


def _served(hub: LoopbackHub, paths) -> int:
    return sum(r.bytes_sent for r in hub.records for p in paths if r.path.endswith(p))


def _epoch(root: Path, num_workers: int, monkeypatch):
    with LoopbackHub() as hub:
        hub.add_dataset(REPO, root)
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        hub.clear_records()
        samples = epoch_samples(streaming(repo_id=REPO), num_workers=num_workers)
        return samples, list(hub.records), hub


def test_the_layouts_share_row_groups_and_roll_files_over(uniform, per_worker):
    for root in (uniform, per_worker):
        assert len(_files(root, "parquet")) >= 2 and len(_files(root, "mp4")) >= 4
        assert _shared_groups(root) >= 2
        assert max(pq.ParquetFile(p).num_row_groups for p in (root / "data").rglob("*.parquet")) >= 2
        for path in (root / "videos").rglob("*.mp4"):
            head = path.read_bytes()[:64]
            assert b"moov" not in head and b"mdat" in head  # moov at the end


@pytest.mark.timeout(300)
def test_one_reader_reads_each_parquet_and_mp4_byte_once(uniform, monkeypatch):
    samples, records, hub = _epoch(uniform, 0, monkeypatch)
    assert_epoch_matches_local(samples, uniform)
    parquet, mp4 = _files(uniform, "parquet"), _files(uniform, "mp4")
    # Every row group once (shared ones included) and the footer once: the file, less its magic.
    assert _served(hub, parquet) <= sum(parquet.values())
    # The clips, plus a 4 KiB head per file for the moov probe: within 5 %.
    assert _served(hub, mp4) <= 1.05 * sum(mp4.values())
    total = sum(r.bytes_sent for r in records)
    assert total <= 1.05 * _dataset_bytes(uniform), (total, _dataset_bytes(uniform))


@pytest.mark.timeout(300)
def test_two_workers_read_each_byte_once_per_epoch(per_worker, monkeypatch):
    samples, records, hub = _epoch(per_worker, 2, monkeypatch)
    assert_epoch_matches_local(samples, per_worker)
    parquet, mp4 = _files(per_worker, "parquet"), _files(per_worker, "mp4")
    # Each row group is read by its worker once, shared or not; each worker reads a footer.
    assert _served(hub, parquet) <= sum(parquet.values()) + _footer_bytes(per_worker)
    assert _served(hub, mp4) <= 1.05 * sum(mp4.values())
    total = sum(r.bytes_sent for r in records)
    assert total <= 1.05 * _dataset_bytes(per_worker), (total, _dataset_bytes(per_worker))


@pytest.mark.timeout(300)
def test_two_workers_share_only_the_row_groups_at_their_cut(uniform, monkeypatch):
    """Row groups cut regardless of episodes: each worker reads a run of consecutive episodes, so
    only the row groups holding the cut between the two runs are read by both."""
    episodes = list(range(load_meta(open_source(uniform)).total_episodes))
    split = rank_worker_split(episodes, [LENGTHS[e] for e in episodes], 0, 1, 2, SEED)
    assert split == [episodes[: len(split[0])], episodes[len(split[0]) :]]
    worker_of = {e: w for w, part in enumerate(split) for e in part}
    at_cut = _row_groups_at_cuts(uniform, worker_of)
    assert 0 < at_cut < 0.5 * sum(_files(uniform, "parquet").values())  # one or two groups of several
    samples, records, hub = _epoch(uniform, 2, monkeypatch)
    assert_epoch_matches_local(samples, uniform)
    parquet = _files(uniform, "parquet")
    assert _served(hub, parquet) <= sum(parquet.values()) + _footer_bytes(uniform) + at_cut
    total = sum(r.bytes_sent for r in records)
    assert total <= 1.05 * _dataset_bytes(uniform), (total, _dataset_bytes(uniform))
