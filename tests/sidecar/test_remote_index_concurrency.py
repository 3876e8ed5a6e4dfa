"""Indexing many MP4s over HTTP is latency-bound: many files in flight, the ``moov`` only (issue 28).

Each file costs two range reads at most (the head window, then the exact ``moov``; its size comes
from the listing, no HEAD). A remote store is indexed with ``REMOTE_BUILD_WORKERS`` (32) files in
flight, and the dataset's reader gets one connection per file in flight while it indexes. With a
published sidecar the open reads no MP4 byte at all.
"""

from __future__ import annotations

import threading
from pathlib import Path

import huggingface_hub.constants
import pytest

from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sidecar import SidecarCache, build_archive
from lerobot_nodes.sidecar.cache import REMOTE_BUILD_WORKERS, default_build_workers
from lerobot_nodes.sources import HubRepoSource, LocalSource
from lerobot_nodes.testing import write_files_dataset
from lerobot_nodes.testing.hub import LoopbackHub

REPO = Path(__file__).resolve().parents[2]
DATASET = "lerobot-nodes/many-files"
FILES = 192
LATENCY_S = 0.05


@pytest.fixture(scope="module")
def files_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """96 episodes, one ~7 KB MP4 per episode and camera (past the 4 KiB head window: two reads each)."""
    return write_files_dataset(tmp_path_factory.mktemp("remote-index") / "files", FILES, frames=30, size=64)


@pytest.fixture
def hub(files_dataset: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True, raising=False)
    with LoopbackHub() as server:
        server.add_dataset(DATASET, files_dataset)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def test_remote_files_are_indexed_many_at_once_reading_the_moov_only(hub: LoopbackHub) -> None:
    source = HubRepoSource(DATASET)
    paths = load_meta(source).video_files()
    assert len(paths) == FILES and default_build_workers(source) == REMOTE_BUILD_WORKERS >= 32
    assert default_build_workers(LocalSource(REPO)) == 4
    in_flight, peak, lock = 0, 0, threading.Lock()
    read_ranges = source.read_ranges

    def counting(path, ranges):  # type: ignore[no-untyped-def]
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        try:
            return read_ranges(path, ranges)
        finally:
            with lock:
                in_flight -= 1

    source.read_ranges = counting  # type: ignore[method-assign]
    hub.clear_records()
    hub.latency_s = LATENCY_S
    requests_before = source.stats.requests
    _, report = SidecarCache().open(source, paths)
    assert report.built == sorted(paths)
    assert peak >= 32  # files in flight, not 4
    # Seen from the server too: requests waiting out the latency at once (4 files at once: at most 4).
    assert hub.peak_answering >= 16, hub.peak_answering
    assert source.stats.requests - requests_before <= 2 * FILES  # head window + moov at most, no HEAD


def test_dataset_open_indexes_over_the_hub_concurrently(hub: LoopbackHub) -> None:
    hub.latency_s = LATENCY_S
    hub.clear_records()
    dataset = StreamingLeRobotDataset(repo_id=DATASET)
    assert len(dataset._indexes or {}) == FILES
    # The 192 files' reads (each the Hub's 302, then the CDN) overlap: far more than the 4 of a local build.
    assert hub.peak_answering >= 16, hub.peak_answering
    assert int(next(iter(dataset))["episode_index"]) in dataset.episodes
    dataset.close()


def test_a_published_sidecar_means_no_mp4_request_at_open(hub: LoopbackHub, files_dataset: Path,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = HubRepoSource(DATASET)
    archive = tmp_path / "publish" / "meta" / "mp4-sidecars" / f"mp4-sidecar-{source.sha}.npz"
    archive.parent.mkdir(parents=True)
    build_archive(source, archive, dataset_id=DATASET, revision=source.sha, workers=8)
    hub.add_dataset(DATASET, tmp_path / "publish", branch="lerobot-sidecars", tags=())
    assert source.published_sidecar_source() is not None
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "fresh-home"))
    hub.clear_records()
    dataset = StreamingLeRobotDataset(repo_id=DATASET)
    assert len(dataset._indexes or {}) == FILES
    assert not [record.path for record in hub.records if record.path.endswith(".mp4")]
    dataset.close()
