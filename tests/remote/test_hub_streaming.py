"""Streaming from a Hub dataset repo and a Hub bucket served by the loopback Hub over real HTTP.

The loopback Hub injects latency and faults; the real huggingface_hub client talks to it for
revisions and listings, the native range reader for payloads.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest

from lerobot_nodes.errors import EpisodeFetchError, SourceAuthError, SourceError, SourceFileNotFoundError
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sidecar import SidecarCache
from lerobot_nodes.sources import HubBucketSource, HubRepoSource, open_source
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.hub import LoopbackHub

from .streaming_checks import CONFIG, assert_epoch_matches_local, epoch_samples, streaming

REPO = "lerobot-nodes/small"
BUCKET = "lerobot-nodes/bucket"
needs_buckets = pytest.mark.skipif(
    not hasattr(__import__("huggingface_hub").HfApi, "list_bucket_tree"),
    reason="Hub buckets need huggingface_hub >= 1.0 (the package says so; its floor is 0.30)",
)
TOKEN = "hf_loopback_secret_token_123"


@pytest.fixture(autouse=True)
def hub_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


@pytest.fixture(scope="module")
def hub_dataset(tmp_path_factory):
    """Five episodes, two AV1 cameras rolled over into several files, data too."""
    root = tmp_path_factory.mktemp("hub") / "dataset"
    return write_dataset(root, episode_lengths=[14, 21, 9, 17, 12], video_files_size_in_mb=0.03, seed=8)


@pytest.fixture
def hub(hub_dataset, monkeypatch):
    with LoopbackHub(latency_s=0.02) as server:
        server.add_dataset(REPO, hub_dataset)
        server.add_bucket(BUCKET, hub_dataset)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def _payload_requests(hub):
    return [r for r in hub.records if "/resolve/" in r.path]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_hub_repo_epoch_equals_local_and_every_read_is_pinned_to_the_sha(hub, hub_dataset, num_workers):
    sha = hub.branch_head(REPO, "main")
    dataset = streaming(repo_id=REPO)
    assert isinstance(dataset.source, HubRepoSource) and dataset.source.sha == sha
    assert dataset.source.url == f"hf://datasets/{REPO}@{sha}"
    assert_epoch_matches_local(epoch_samples(dataset, num_workers=num_workers), hub_dataset)
    resolves = [r for r in hub.records if r.origin == "hub" and "/resolve/" in r.path]
    assert resolves and all(r.repo_revision == sha for r in resolves)
    assert not hub.write_requests()


@needs_buckets
def test_bucket_epoch_equals_local(hub, hub_dataset):
    dataset = streaming(f"hf://buckets/{BUCKET}")
    assert isinstance(dataset.source, HubBucketSource)
    assert_epoch_matches_local(epoch_samples(dataset, num_workers=2), hub_dataset)
    same = streaming(repo_id=BUCKET, repo_type="bucket")
    assert same.source.url == dataset.source.url
    assert not hub.write_requests()


def test_every_fifth_range_read_failing_gives_exactly_the_fault_free_epoch(hub, hub_dataset):
    hub.fault_every = 5
    hub.stall_s = 2.0
    # The store's fault paths: without the disk cache every range goes to the server.
    config = CONFIG.__class__(**{**CONFIG.as_dict(), "streaming_http_timeout_s": 0.5, "streaming_disk_cache_gb": 0})
    dataset = streaming(repo_id=REPO, config=config)
    samples = epoch_samples(dataset, num_workers=0)
    kinds = {"503", "reset", "close", "short", "stall"}
    # A stalled answer is recorded when the server gives up on it, after the client moved on.
    deadline = time.monotonic() + 10
    while not kinds <= {r.fault for r in hub.records} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kinds <= {r.fault for r in hub.records}
    assert_epoch_matches_local(samples, hub_dataset)
    assert dataset.metrics.report().http_retries >= len([r for r in hub.records if r.fault]) - 1


def test_a_file_that_vanishes_mid_epoch_is_a_clear_error_in_bounded_time(hub, hub_dataset):
    # Without the disk cache: with it, the blocks the index build fetched at open would still serve the file.
    dataset = streaming(repo_id=REPO, config=CONFIG.__class__(**{**CONFIG.as_dict(), "streaming_disk_cache_gb": 0}))
    video = dataset.meta.video_files()[-1]
    dataset_iter = iter(epoch_iterator(dataset))
    next(dataset_iter)
    hub.hide(video)
    started = time.monotonic()
    try:
        with pytest.raises(EpisodeFetchError) as caught:
            for _ in dataset_iter:
                pass
    finally:
        dataset.close()  # the failed graph's threads end here, not in a later test
    assert time.monotonic() - started < 60
    message = str(caught.value)
    assert isinstance(caught.value.__cause__, SourceFileNotFoundError)
    assert video in message and "answered 404" in message and "?" not in message


def epoch_iterator(dataset):
    from lerobot_nodes.loader import streaming_dataloader

    return streaming_dataloader(dataset, batch_size=2, num_workers=0)


@needs_buckets
def test_bucket_object_replaced_with_same_size_content_invalidates_its_index(hub, hub_dataset):
    source = open_source(f"hf://buckets/{BUCKET}")
    meta = load_meta(source)
    video = meta.video_files()[0]
    _, first = SidecarCache().open(source, meta.video_files())
    assert video in first.built
    original = (hub_dataset / video).read_bytes()
    hub.put_bucket_object(BUCKET, video, original[:-4] + bytes(4))  # same size, new content
    _, second = SidecarCache().open(open_source(f"hf://buckets/{BUCKET}"), meta.video_files())
    # The record name holds the content identity: the new content gets a new record.
    assert second.built == [video] and set(second.reused) == set(meta.video_files()) - {video}


def test_revision_rules_follow_lerobot(hub, hub_dataset):
    main_sha = hub.branch_head(REPO, "main")
    newer = hub.commit_files(REPO, {"README.md": b"newer commit, not tagged"})
    assert HubRepoSource(REPO).sha == main_sha  # no revision: the v3.0 tag, not the branch head
    assert HubRepoSource(REPO, "main").sha == newer
    assert HubRepoSource(REPO, main_sha).sha == main_sha
    assert open_source(f"hf://datasets/{REPO}@main").revision == newer
    hub.add_dataset("lerobot-nodes/untagged", hub_dataset, tags=())
    with pytest.raises(SourceError, match="create_tag"):
        HubRepoSource("lerobot-nodes/untagged")
    with pytest.raises(SourceFileNotFoundError, match="revision"):
        HubRepoSource(REPO, "no-such-branch")
    with pytest.raises(SourceFileNotFoundError, match="lerobot-nodes/absent"):
        HubRepoSource("lerobot-nodes/absent")


def test_metadata_is_read_once_per_commit(hub):
    streaming(repo_id=REPO)
    hub.clear_records()
    streaming(repo_id=REPO)
    reads = [r.path for r in hub.records if "/resolve/" in r.path]
    assert not [p for p in reads if "/meta/" in p], reads
    assert not [r for r in hub.records if "/tree/" in r.path]


def test_offline_uses_a_local_copy_and_says_so(hub, hub_dataset, tmp_path, monkeypatch, caplog):
    import shutil

    shutil.copytree(hub_dataset, tmp_path / "home" / REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with caplog.at_level("WARNING", logger="lerobot_nodes.sources"):
        source = open_source(repo_id=REPO)
    assert "HF_HUB_OFFLINE" in caplog.text and str(tmp_path / "home" / REPO) in source.url
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert isinstance(open_source(repo_id=REPO), HubRepoSource)  # not silently preferred online


def test_token_reaches_workers_and_appears_nowhere(hub, hub_dataset, tmp_path, caplog):
    hub.require_token = TOKEN
    with pytest.raises(SourceAuthError) as caught:
        HubRepoSource(REPO, token=False)
    assert "token" in str(caught.value).lower() or "401" in str(caught.value)
    with caplog.at_level("DEBUG"):
        dataset = streaming(repo_id=REPO, token=TOKEN)
        samples = epoch_samples(dataset, num_workers=2)
    assert_epoch_matches_local(samples, hub_dataset)
    blob = pickle.dumps(dataset)
    assert TOKEN.encode() not in blob
    assert TOKEN not in repr(dataset.source) and TOKEN not in caplog.text
    assert TOKEN not in dataset.metrics.report().table()
    home = tmp_path / "home"
    for path in home.rglob("*"):
        assert TOKEN not in str(path)
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    assert not [r for r in hub.records if r.origin == "cdn" and r.authorization]


def test_sigkill_and_resume_over_the_hub_is_identical(hub, tmp_path):
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint}
    base = [sys.executable, "-m", "lerobot_nodes.cli.main", "stream", f"--dataset.repo_id={REPO}", "--batch_size=2",
            "--num_workers=2", "--steps=24", "--seed=7", "--quiet", "--dataset.streaming_episode_pool_size=2"]
    reference = tmp_path / "reference.jsonl"
    subprocess.run([*base, f"--record={reference}"], check=True, timeout=300, env=env)
    checkpoint = tmp_path / "checkpoint.pt"
    interrupted = tmp_path / "interrupted.jsonl"
    process = subprocess.Popen(
        [*base, f"--record={interrupted}", f"--save-checkpoint={checkpoint}", "--checkpoint-every=4"],
        env=env, start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None and len(_records(interrupted)) < 13:
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    import torch

    saved_step = torch.load(checkpoint, weights_only=False)["step"]
    kept = [r for r in _records(interrupted) if r["step"] <= saved_step]
    resumed = tmp_path / "resumed.jsonl"
    resumed.write_text("".join(json.dumps(r) + "\n" for r in kept))
    subprocess.run([*base, f"--record={resumed}", f"--resume={checkpoint}"], check=True, timeout=300, env=env)
    assert _records(resumed) == _records(reference), f"resumed from step {saved_step}"


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_two_ranks_of_two_workers_cover_every_frame_once_over_the_hub(hub, hub_dataset):
    seen = {}
    for rank in range(2):
        dataset = streaming(repo_id=REPO, rank=rank, world_size=2)
        seen[rank] = [(int(s["episode_index"]), int(s["frame_index"])) for s in epoch_samples(dataset, num_workers=2)]
    reference = load_meta(open_source(hub_dataset))
    everything = seen[0] + seen[1]
    assert len(everything) == len(set(everything)) == reference.total_frames
    assert not {e for e, _ in seen[0]} & {e for e, _ in seen[1]}  # whole episodes per rank
