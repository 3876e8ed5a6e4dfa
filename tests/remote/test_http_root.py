"""Plain ``http://`` dataset roots: a real static file server on 127.0.0.1 (Range, ETag or not,
Last-Modified or not, latency and faults), read by the native range reader."""

from __future__ import annotations

import collections
import logging
import pickle
import shutil
import socket
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lerobot_nodes.errors import (
    EpisodeFetchError,
    SourceAuthError,
    SourceError,
    SourceFileNotFoundError,
    SourceUnavailableError,
)
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sidecar import SidecarCache
from lerobot_nodes.sources import HttpOptions, HttpRootSource, open_source
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.static_http import StaticHttpServer

from .streaming_checks import CONFIG, assert_epoch_matches_local, epoch_samples, streaming

TOKEN = "hf_must_never_leave_for_other_hosts_123"
FAST_FAIL = HttpOptions(retries=2, backoff_s=0.01, timeout_s=2.0, connect_timeout_s=1.0)


@pytest.fixture(autouse=True)
def environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # present, and never sent to a plain HTTP host


@pytest.fixture(scope="module")
def http_dataset(tmp_path_factory):
    """Five episodes; data, videos and episode metadata each rolled over into several files and chunks."""
    root = tmp_path_factory.mktemp("http") / "dataset"
    return write_dataset(
        root, episode_lengths=[14, 21, 9, 17, 12], video_files_size_in_mb=0.01, data_file_size_in_mb=0.001,
        chunks_size=2, seed=4,
    )


@pytest.fixture
def serve():
    """Start static servers; each is stopped, with all its threads, after the test."""
    servers: list[StaticHttpServer] = []

    def start(folder, **settings) -> StaticHttpServer:
        server = StaticHttpServer(folder, **settings).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
    deadline = time.monotonic() + 5
    while any(t.name.startswith("loopback-hub-static") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [t for t in threading.enumerate() if t.name.startswith("loopback-hub-static")]


def test_the_listing_comes_from_the_metadata(serve, http_dataset):
    server = serve(http_dataset)
    source = open_source(server.url)
    assert isinstance(source, HttpRootSource) and source.has_stable_identity
    on_disk = sorted(p.relative_to(http_dataset).as_posix() for p in http_dataset.rglob("*") if p.is_file())
    listed = source.list_files()
    assert [f.path for f in listed] == on_disk
    assert any(p.startswith("meta/episodes/chunk-001/") for p in on_disk)  # the chunk rollover was followed
    assert all(f.size == (http_dataset / f.path).stat().st_size and f.fingerprint.startswith("etag:") for f in listed)
    assert not any(r.authorization for r in server.records)
    assert TOKEN.encode() not in pickle.dumps(source)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_epoch_over_http_equals_the_local_epoch(serve, http_dataset, num_workers):
    server = serve(http_dataset, latency_s=0.005)
    dataset = streaming(server.url)
    assert isinstance(dataset.source, HttpRootSource)
    assert_epoch_matches_local(epoch_samples(dataset, num_workers=num_workers), http_dataset)
    assert not any(r.authorization for r in server.records)
    assert {r.method for r in server.records} == {"GET"} and all(r.range for r in server.records)


def test_redirected_files_are_resolved_once_per_reader(serve, http_dataset):
    server = serve(http_dataset, redirect=True)
    dataset = streaming(server.url)
    assert_epoch_matches_local(epoch_samples(dataset, num_workers=0), http_dataset)
    mounted = collections.Counter(r.path for r in server.records if r.path.startswith("/ds/"))
    assert all(r.status == 302 for r in server.records if r.path.startswith("/ds/"))
    # Metadata: resolved once, at open. Payload files: again by the reader the epoch's graph sets
    # up (and by concurrent first reads of one file), then every read goes straight to the target.
    assert mounted and all(n == 1 for path, n in mounted.items() if path.startswith("/ds/meta/")), mounted
    objects = collections.Counter(r.path for r in server.records if r.path.startswith("/_objects/"))
    assert sum(objects.values()) > sum(mounted.values()), (objects, mounted)


@pytest.mark.parametrize("etag", ["strong", "weak"])
def test_stable_identities_reuse_indexes_and_metadata_on_the_second_open(serve, http_dataset, etag):
    server = serve(http_dataset, etag=etag, last_modified=True)
    source = open_source(server.url)
    assert source.has_stable_identity
    kind = "etag:" if etag == "strong" else "last-modified:"  # a weak ETag names no content
    assert all(f.fingerprint.startswith(kind) for f in source.list_files())
    meta = load_meta(source)
    _, first = SidecarCache().open(source, meta.video_files())
    assert first.built == sorted(meta.video_files())
    server.clear_records()
    again = open_source(server.url)
    load_meta(again)
    _, second = SidecarCache().open(again, meta.video_files())
    assert not second.built and second.reused == sorted(meta.video_files())
    # The second open only probes: every metadata body comes from the local cache.
    assert all(r.range == "bytes=0-0" for r in server.records), [(r.path, r.range) for r in server.records]


@pytest.mark.parametrize("etag", ["none", "weak"])
def test_without_identity_indexes_are_rebuilt_at_every_open(serve, http_dataset, etag, caplog):
    server = serve(http_dataset, etag=etag, last_modified=False)
    with caplog.at_level(logging.INFO):
        source = open_source(server.url)
        again = open_source(server.url)
        meta = load_meta(again)
        _, report = SidecarCache().open(again, meta.video_files())
    assert not source.has_stable_identity and all(f.fingerprint is None for f in source.list_files())
    warnings = [r for r in caplog.records if "neither a strong ETag nor Last-Modified" in r.getMessage()]
    assert len(warnings) <= 1  # once per URL and process (another test may have said it already)
    assert report.in_memory and report.built == sorted(meta.video_files())
    assert any("no stable file identities" in r.getMessage() for r in caplog.records)
    # Nothing cached: the metadata bodies are read again.
    assert len([r for r in server.records if r.path.endswith("info.json") and r.range != "bytes=0-0"]) == 2


def test_a_video_replaced_with_same_size_content_and_a_new_etag_is_indexed_again(serve, http_dataset, tmp_path):
    folder = shutil.copytree(http_dataset, tmp_path / "copy")
    server = serve(folder)
    source = open_source(server.url)
    meta = load_meta(source)
    _, first = SidecarCache().open(source, meta.video_files())
    video = meta.video_files()[0]
    original = (folder / video).read_bytes()
    time.sleep(0.01)
    (folder / video).write_bytes(original[:-4] + bytes(4))  # same size, new mtime: a new ETag
    changed = open_source(server.url)
    assert changed.info(video).fingerprint != source.info(video).fingerprint
    _, second = SidecarCache().open(changed, meta.video_files())
    assert second.built == [video] and set(second.reused) == set(meta.video_files()) - {video}


def test_a_missing_video_is_one_clear_error(serve, http_dataset):
    server = serve(http_dataset)
    video = load_meta(open_source(server.url)).video_files()[-1]
    server.hide(video)
    with pytest.raises(SourceFileNotFoundError) as caught:
        open_source(server.url)
    message = str(caught.value)
    assert video in message and server.url in message and "404" in message and "\n" not in message


def test_a_video_vanishing_mid_epoch_is_a_clear_error(serve, http_dataset):
    from lerobot_nodes.loader import streaming_dataloader

    server = serve(http_dataset)
    # Without the disk cache: with it, the blocks the index build fetched at open would still serve the file.
    dataset = streaming(server.url, config=CONFIG.__class__(**{**CONFIG.as_dict(), "streaming_disk_cache_gb": 0}))
    video = dataset.meta.video_files()[-1]
    batches = iter(streaming_dataloader(dataset, batch_size=2, num_workers=0))
    next(batches)
    server.hide(video)
    try:
        with pytest.raises(EpisodeFetchError) as caught:
            for _ in batches:
                pass
    finally:
        dataset.close()  # the failed graph's threads end here, not in a later test
    assert isinstance(caught.value.__cause__, SourceFileNotFoundError)
    assert video in str(caught.value) and "answered 404" in str(caught.value)


def test_refusals_and_unreachable_hosts_are_clear_errors(serve, http_dataset):
    server = serve(http_dataset)
    server.forbid("meta/info.json")
    with pytest.raises(SourceAuthError, match=r"meta/info\.json.*403"):
        HttpRootSource(server.url, http=FAST_FAIL)
    with pytest.raises(SourceFileNotFoundError, match=r"meta/info\.json"):
        HttpRootSource(server.url.replace("/ds", "/elsewhere"), http=FAST_FAIL)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(SourceUnavailableError, match=f"127.0.0.1:{port}/ds/meta/info.json"):
        HttpRootSource(f"http://127.0.0.1:{port}/ds", http=FAST_FAIL)
    assert time.monotonic() - started < 10


def test_injected_faults_are_retried_to_the_exact_epoch(serve, http_dataset):
    server = serve(http_dataset, fault_every=4, stall_s=1.0, fault_kinds=("503", "reset", "close", "short", "stall"))
    config = CONFIG.__class__(**{**CONFIG.as_dict(), "streaming_http_timeout_s": 0.4})
    dataset = streaming(server.url, config=config)
    samples = epoch_samples(dataset, num_workers=0)
    assert_epoch_matches_local(samples, http_dataset)
    deadline = time.monotonic() + 5  # a stall is recorded when the server gives up on it
    while not {"503", "reset", "close", "short", "stall"} <= {r.fault for r in server.records}:
        assert time.monotonic() < deadline, {r.fault for r in server.records}
        time.sleep(0.05)


class _QuietFileHandler(SimpleHTTPRequestHandler):
    """Python's own file server: GET and HEAD, no Range support."""

    def log_message(self, format, *args):
        pass


def test_a_server_without_range_support_is_a_clear_error(http_dataset):
    handler = partial(_QuietFileHandler, directory=str(http_dataset.parent))
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/{http_dataset.name}"
            with pytest.raises(SourceError, match="does not serve byte ranges"):
                open_source(url, http=FAST_FAIL)
        finally:
            server.shutdown()
            thread.join(5)


def test_urls_with_credentials_or_queries_are_refused():
    from lerobot_nodes.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        open_source("https://user:secret@example.invalid/ds")
    assert "secret" not in str(caught.value)
    with pytest.raises(ConfigError):
        open_source("https://example.invalid/ds?X-Amz-Signature=abc")
    with pytest.raises(ConfigError, match="storage_options"):
        open_source("https://example.invalid/ds", storage_options={"headers": {"Authorization": "x"}})


def test_the_static_server_command_serves_until_sigterm(http_dataset):
    import os
    import re
    import signal
    import subprocess
    import sys
    import urllib.request

    command = [sys.executable, "-m", "lerobot_nodes.testing.static_http", str(http_dataset), "--etag", "weak"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(60)
        match = re.search(r"at (http://127\.0\.0\.1:\d+/ds);", lines[0] if lines else "")
        assert match, lines
        request = urllib.request.Request(f"{match[1]}/meta/info.json", headers={"Range": "bytes=0-0"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 206 and answer.headers["ETag"].startswith('W/"') and len(answer.read()) == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
