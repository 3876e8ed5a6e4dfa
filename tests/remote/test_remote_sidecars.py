"""Sidecars with remote stores: index builds read only ``moov`` bytes, ``--push`` publishes where
training looks (verified before use), and training itself never writes."""

from __future__ import annotations

import collections
import subprocess
import sys

import pytest

from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.mp4.boxes import HEAD_WINDOW, iter_boxes
from lerobot_nodes.sidecar import SidecarCache
from lerobot_nodes.sources import HubRepoSource, open_source
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.hub import LoopbackHub

from .streaming_checks import assert_epoch_matches_local, epoch_samples, streaming

REPO = "lerobot-nodes/sidecars"
LARGER = "lerobot-nodes/larger"
BUCKET = "lerobot-nodes/sidecar-bucket"


@pytest.fixture(scope="module")
def larger_dataset(tmp_path_factory):
    """One video file of ~350 KB, so an index read is visibly smaller than the file."""
    root = tmp_path_factory.mktemp("sidecars") / "larger"
    return write_dataset(root, episode_lengths=[250, 150], cameras=("observation.images.top",), height=240,
                         width=320, codec="h264", seed=5)


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("sidecars") / "small"
    return write_dataset(root, episode_lengths=[14, 21, 9, 17], video_files_size_in_mb=0.03, seed=6)


@pytest.fixture
def hub(small_dataset, larger_dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with LoopbackHub(latency_s=0.02) as server:
        server.add_dataset(REPO, small_dataset)
        server.add_dataset(LARGER, larger_dataset)
        server.add_bucket(BUCKET, small_dataset)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def test_index_build_reads_only_the_head_and_the_moov_in_at_most_two_round_trips(hub, larger_dataset):
    source = HubRepoSource(LARGER)
    paths = load_meta(source).video_files()
    hub.clear_records()
    round_trips_before = source.stats.requests
    _, report = SidecarCache().open(source, paths)
    assert report.built == sorted(paths)
    assert source.stats.requests - round_trips_before <= 2 * len(paths)
    sent = collections.Counter()
    for record in hub.records:
        for path in paths:
            if record.path.endswith(path):
                sent[path] += record.bytes_sent
    for path in paths:
        data = (larger_dataset / path).read_bytes()
        moov = next(box.size for box in iter_boxes(data, 0, len(data), path) if box.type == "moov")
        # The head read and exactly the moov, nothing of the payload.
        assert len(data) > 300_000 and sent[path] <= HEAD_WINDOW + moov, (path, sent[path], len(data))


def _build(*flags, env=None):
    command = [sys.executable, "-m", "lerobot_nodes.cli.build_sidecar", *flags, "--quiet"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def test_push_publishes_on_the_sidecar_branch_and_training_converts_it_without_writing(hub, small_dataset, tmp_path):
    import os

    main_before = hub.branch_head(REPO, "main")
    source = HubRepoSource(REPO)
    archive = tmp_path / "sidecar.npz"
    result = _build(f"--repo-id={REPO}", f"--revision={source.sha}", f"--output={archive}", "--push",
                    env={**os.environ})
    assert result.returncode == 0, result.stderr
    assert f"lerobot-sidecars/meta/mp4-sidecars/mp4-sidecar-{source.sha}.npz" in result.stdout
    assert hub.branch_head(REPO, "main") == main_before  # the source branch is untouched
    branch = HubRepoSource(REPO, "lerobot-sidecars")
    assert branch.info(f"meta/mp4-sidecars/mp4-sidecar-{source.sha}.npz").size == archive.stat().st_size
    # A fresh cache: training finds the published sidecar, verifies it and converts it.
    os.environ["HF_LEROBOT_HOME"] = str(tmp_path / "fresh-home")
    hub.clear_records()
    fresh = HubRepoSource(REPO)
    paths = load_meta(fresh).video_files()
    _, report = SidecarCache().open(fresh, paths)
    assert report.converted == sorted(paths) and not report.built
    dataset = streaming(repo_id=REPO)
    assert_epoch_matches_local(epoch_samples(dataset, num_workers=0), small_dataset)
    assert not hub.write_requests()


def test_published_sidecar_of_another_commit_is_not_used(hub, small_dataset, tmp_path):
    import os

    old = HubRepoSource(REPO)
    assert _build(f"--repo-id={REPO}", f"--revision={old.sha}", f"--output={tmp_path / 'a.npz'}", "--push",
                  env={**os.environ}).returncode == 0
    video = load_meta(old).video_files()[0]
    data = (small_dataset / video).read_bytes()
    new_sha = hub.commit_files(REPO, {video: data[:-4] + bytes(4)})
    hub.tag(REPO, "v3.0", new_sha)
    os.environ["HF_LEROBOT_HOME"] = str(tmp_path / "fresh-home")
    fresh = HubRepoSource(REPO)
    assert fresh.sha == new_sha
    _, report = SidecarCache().open(fresh, load_meta(fresh).video_files())
    assert report.built and not report.converted  # bound to the old commit: rebuilt, never trusted


def test_push_of_a_subset_or_a_local_folder_is_refused(hub, small_dataset, tmp_path):
    subset = _build(f"--repo-id={REPO}", f"--output={tmp_path / 'x.npz'}", "--episodes=0", "--push")
    assert subset.returncode == 2 and "subset" in subset.stderr
    local = _build(f"--data-root={small_dataset}", f"--output={tmp_path / 'y.npz'}", "--push")
    assert local.returncode == 2 and "Hub dataset repo or bucket" in local.stderr
    assert not (tmp_path / "y.npz").exists()  # refused before building
    assert not hub.write_requests()


def test_bucket_push_reaches_the_upload_call_and_fails_clearly_without_xet(hub, tmp_path):
    # Bucket writes need Xet, which the loopback Hub cannot accept: everything up to the upload
    # call runs, the failure is one clear line, and the verified archive stays on disk.
    import os

    archive = tmp_path / "bucket.npz"
    result = _build(f"--data-root=hf://buckets/{BUCKET}", f"--output={archive}", "--push", env={**os.environ})
    assert result.returncode == 1 and "publishing failed" in result.stderr and str(archive) in result.stderr
    assert archive.exists() and "Traceback" not in result.stderr
    assert hub.write_requests()


def test_open_source_names_every_published_location(hub):
    assert open_source(f"hf://buckets/{BUCKET}").published_sidecar_source() is not None
    assert HubRepoSource(REPO).published_sidecar_source() is None  # no sidecar branch yet
