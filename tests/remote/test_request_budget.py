"""The Hub request budget: what a node sends to open a dataset, how 429s are waited out, how long
signed URLs are reused, and the counts by the Hub's rate-limit classes in the metrics report.

Real processes share one ``$HF_LEROBOT_HOME`` against one loopback Hub (real HTTP, the real
huggingface_hub client, payloads behind 302s to the CDN origin).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import time

import pytest

from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sources import HubRepoSource
from lerobot_nodes.sources.http_range import location_expiry_wall
from lerobot_nodes.sources.rate_limit import parse_rate_limit, rate_limit_wait
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.hub import LoopbackHub

from .streaming_checks import CONFIG, assert_epoch_matches_local, epoch_samples, streaming

REPO = "lerobot-nodes/budget"
RATE_LIMIT_LOG = "rate limit"


@pytest.fixture(autouse=True)
def hub_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    for name in ("LEROBOT_NODES_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def budget_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget") / "dataset"
    return write_dataset(root, episode_lengths=[14, 21, 9, 17, 12], video_files_size_in_mb=0.03, seed=8)


@pytest.fixture
def hub(budget_dataset, monkeypatch):
    with LoopbackHub(latency_s=0.01) as server:
        server.add_dataset(REPO, budget_dataset)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def _kind(record) -> str:
    if record.origin == "cdn":
        return "cdn"
    if record.path.startswith("/api/"):
        return "api"
    return "resolver" if "/resolve/" in record.path else "other"


OPEN = r"""
import json, os, sys, time
from pathlib import Path
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sources import HubRepoSource
go = Path(sys.argv[1])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.005)
source = HubRepoSource(sys.argv[2])
meta = load_meta(source)
video = meta.video_files()[0]
data = source.read_range(video, 0, 64)
print(json.dumps({"sha": source.sha, "files": len(source.list_files()), "head": data.hex()}), flush=True)
"""


def test_processes_sharing_a_home_send_the_revision_listing_and_metadata_requests_once(hub, budget_dataset, tmp_path):
    go = tmp_path / "go"
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "budget-job"}  # the ranks of one job, as torchrun starts them
    processes = [
        subprocess.Popen([sys.executable, "-c", OPEN, str(go), REPO], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(4)
    ]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline() == "ready\n"
        hub.clear_records()
        go.touch()
        results = [json.loads(process.communicate(timeout=120)[0]) for process in processes]
    finally:
        for process in processes:
            process.kill()
            process.wait()
    assert {r["sha"] for r in results} == {hub.branch_head(REPO, "main")}
    assert len({r["head"] for r in results}) == 1
    api = collections.Counter(r.path for r in hub.records if _kind(r) == "api")
    assert api == collections.Counter(
        {f"/api/datasets/{REPO}/refs": 1, f"/api/datasets/{REPO}/revision/v3.0": 1,
         f"/api/datasets/{REPO}/tree/{hub.branch_head(REPO, 'main')}": 1}
    ), api
    resolves = collections.Counter(r.path for r in hub.records if _kind(r) == "resolver")
    assert resolves and max(resolves.values()) == 1, resolves  # meta/ files and the video: once per node
    assert not [r for r in hub.records if r.status == 403]


def test_a_pinned_commit_is_resolved_once_and_a_moving_ref_again_outside_a_job(hub, monkeypatch):
    sha = hub.branch_head(REPO, "main")
    HubRepoSource(REPO, sha)
    hub.clear_records()
    assert HubRepoSource(REPO, sha).sha == sha
    assert not [r for r in hub.records if _kind(r) == "api"]  # a sha pins everything: nothing to ask
    HubRepoSource(REPO, "main")
    hub.clear_records()
    newer = hub.commit_files(REPO, {"README.md": b"a newer commit"})
    assert HubRepoSource(REPO, "main").sha == newer  # no job: a new open asks again
    monkeypatch.setenv("LEROBOT_NODES_JOB_ID", "one-job")
    assert HubRepoSource(REPO, "main").sha == newer
    hub.commit_files(REPO, {"README.md": b"newest"})
    hub.clear_records()
    assert HubRepoSource(REPO, "main").sha == newer  # within one job: the commit the job resolved
    assert not [r for r in hub.records if "/revision/" in r.path]


def test_a_429_with_ratelimit_headers_is_waited_out_logged_once_and_the_epoch_is_exact(hub, budget_dataset, caplog):
    hub.rate_limits = {"api": (1, 2.0), "resolvers": (2, 2.0)}
    config = CONFIG.__class__(**{**CONFIG.as_dict(), "streaming_http_retries": 12})
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="lerobot_nodes.sources"):
        dataset = streaming(repo_id=REPO, config=config)
        samples = epoch_samples(dataset, num_workers=0)
    assert_epoch_matches_local(samples, budget_dataset)
    limited = hub.rate_limited()
    assert {_kind(r) for r in limited} == {"api", "resolver"}, limited
    ours = [r.getMessage() for r in caplog.records if RATE_LIMIT_LOG in r.getMessage()]
    assert len([m for m in ours if "'api'" in m]) == 1, ours
    assert len([m for m in ours if "'resolvers'" in m]) == 1, ours
    assert "requests per 2 s" in ours[0] and "waiting" in ours[0]
    report = dataset.metrics.report()
    assert report.hub_rate_limited >= 1
    assert time.monotonic() - started < 120


def test_a_signed_url_past_its_expiry_is_not_reused(hub):
    hub.signed_url_ttl_s = 3.0
    source = HubRepoSource(REPO)
    video = load_meta(source).video_files()[0]

    def read(reader_source: HubRepoSource) -> collections.Counter:
        hub.clear_records()
        reader_source.read_range(video, 0, 128)
        return collections.Counter(_kind(r) for r in hub.records)

    assert read(source) == {"resolver": 1, "cdn": 1}
    assert read(source) == {"cdn": 1}  # reused while valid
    assert read(HubRepoSource(REPO)) == {"cdn": 1}  # another reader of the node: the shared target
    time.sleep(3.2)
    assert read(source) == {"resolver": 1, "cdn": 1}  # expired: resolved again, never sent
    assert read(HubRepoSource(REPO)) == {"cdn": 1}  # the fresh target is shared again
    assert not [r for r in hub.records if r.status == 403]


def test_counts_by_class_appear_in_the_metrics_report(hub, budget_dataset):
    hub.clear_records()
    dataset = streaming(repo_id=REPO)
    assert_epoch_matches_local(epoch_samples(dataset, num_workers=0), budget_dataset)
    report = dataset.metrics.report()
    sent = collections.Counter(_kind(r) for r in hub.records)
    # With no workers the graph's source is the dataset's: its open is counted too. The published
    # sidecar lookup (another source, the lerobot-sidecars branch) is the only API call it does not see.
    assert report.hub_resolver_requests == sent["resolver"] > 0
    assert report.hub_cdn_requests == sent["cdn"] > 0
    assert 1 <= report.hub_api_requests <= sent["api"]
    assert f"hub api/resolver/cdn {report.hub_api_requests}/{report.hub_resolver_requests}" in report.line()
    assert "Hub requests: API / resolver / CDN" in report.table()


def test_workers_report_their_requests_by_class(hub, budget_dataset):
    dataset = streaming(repo_id=REPO, config=CONFIG.__class__(**{**CONFIG.as_dict(), "streaming_disk_cache_gb": 0}))
    assert_epoch_matches_local(epoch_samples(dataset, num_workers=2), budget_dataset)
    report = dataset.metrics.report()
    assert report.hub_cdn_requests > 0 and report.hub_cdn_requests + report.hub_resolver_requests == report.http_requests


def test_rate_limit_headers_and_signed_url_expiry_are_read_as_the_hub_sends_them():
    headers = {"RateLimit": '"api";r=0;t=55', "RateLimit-Policy": '"fixed window";"api";q=1000;w=300'}
    limit = parse_rate_limit(headers)
    assert limit is not None and (limit.kind, limit.remaining, limit.reset_s, limit.quota, limit.window_s) == (
        "api", 0, 55, 1000, 300)
    assert 55 <= rate_limit_wait(headers) <= 56
    assert rate_limit_wait({"Retry-After": "7"}) == 7
    assert rate_limit_wait({"RateLimit": '"resolvers";r=3;t=20'}) is None  # quota left: no reset to wait for
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    s3 = location_expiry_wall(f"https://cas-bridge.example/x?X-Amz-Date={stamp}&X-Amz-Expires=3600&X-Amz-Signature=s")
    assert now + 3600 - 61 <= s3 <= now + 3600 - 59
    cloudfront = location_expiry_wall(f"https://cdn.example/x?Expires={int(now) + 30}&Signature=s")
    assert now + 26 <= cloudfront <= now + 30  # a tenth of a short lifetime as the margin
