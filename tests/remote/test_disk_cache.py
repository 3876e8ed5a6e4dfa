"""The node-local disk byte cache (``lerobot_nodes.sources.range_cache``) over real stores and processes.

A loopback Hub (the real huggingface_hub client for revisions and listings, the native range
reader for payloads) and a moto S3 server serve the datasets; every request is counted at the
server. Cache folders are real folders, a full and a read-only disk are real (tiny) tmpfs mounts
where the test may mount (root), else a ``chmod 0500`` folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.resume.identity import check_identity, dataset_identity
from lerobot_nodes.sources import ByteRangeCache, HubBucketSource, HubRepoSource, LocalSource, open_source
from lerobot_nodes.sources.range_cache import byte_cache_from_options, scan_blocks
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.hub import LoopbackHub

from .streaming_checks import CONFIG, assert_epoch_matches_local, epoch_samples, streaming

REPO = "lerobot-nodes/cached"
BUCKET = "lerobot-nodes/cached-bucket"
S3_BUCKET = "lerobot-disk-cache"
needs_buckets = pytest.mark.skipif(
    not hasattr(__import__("huggingface_hub").HfApi, "list_bucket_tree"), reason="Hub buckets need huggingface_hub >= 1.0"
)
ENV = {"HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


@pytest.fixture(autouse=True)
def hub_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


@pytest.fixture(scope="module")
def dataset_root(tmp_path_factory) -> Path:
    """Six episodes, two AV1 cameras rolled over into several MP4s, two data files."""
    root = tmp_path_factory.mktemp("disk-cache") / "dataset"
    return write_dataset(root, episode_lengths=[14, 21, 9, 17, 12, 16], video_files_size_in_mb=0.03,
                         data_file_size_in_mb=0.01, seed=8)


@pytest.fixture
def hub(dataset_root, monkeypatch):
    with LoopbackHub() as server:
        server.add_dataset(REPO, dataset_root)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def _payload(records) -> list:
    """Payload reads: resolve requests of the Hub and every CDN request (revision and listing calls excluded)."""
    return [r for r in records if r.origin == "cdn" or "/resolve/" in r.path]


def _payload_after(hub: LoopbackHub, action) -> list:
    hub.clear_records()
    action()
    return _payload(hub.records)


def _cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "bytes"


def _config(folder: Path, gb: float | None = None) -> StreamingConfig:
    return StreamingConfig(**{**CONFIG.as_dict(), "streaming_disk_cache_dir": str(folder), "streaming_disk_cache_gb": gb})


def _blocks(folder: Path) -> list[tuple[float, int, str]]:
    return scan_blocks(folder)[0]


# -- epochs and restarts -------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_second_epoch_and_a_restart_send_no_payload_request(hub, dataset_root, tmp_path):
    dataset = streaming(repo_id=REPO, config=_config(_cache_dir(tmp_path)))
    epochs = []
    first = _payload_after(hub, lambda: epochs.append(epoch_samples(dataset, num_workers=2)))
    assert first and _blocks(_cache_dir(tmp_path))
    second = _payload_after(hub, lambda: epochs.append(epoch_samples(dataset, num_workers=2)))
    assert second == [], [(r.origin, r.path, r.range) for r in second]
    report = dataset.metrics.report()
    assert report.disk_cache_hits > 0 and report.disk_cache_misses == 0 and report.disk_cache_bytes_served > 0
    assert "disk cache hits/misses" in report.line() and "disk cache blocks evicted" in report.table()

    def restart():
        again = streaming(repo_id=REPO, config=_config(_cache_dir(tmp_path)))
        epochs.append(epoch_samples(again, num_workers=2))

    hub.clear_records()
    restart()
    assert _payload(hub.records) == []  # the revision check and nothing else of the store
    assert hub.records and not hub.write_requests()
    for samples in epochs:
        assert_epoch_matches_local(samples, dataset_root)


@pytest.mark.timeout(300)
def test_samples_equal_the_map_style_reader_cold_warm_and_half_evicted(hub, dataset_root, tmp_path):
    folder = _cache_dir(tmp_path)
    dataset = streaming(repo_id=REPO, config=_config(folder))
    assert_epoch_matches_local(epoch_samples(dataset), dataset_root)  # cold
    assert_epoch_matches_local(epoch_samples(dataset), dataset_root)  # warm
    blocks, held, _ = scan_blocks(folder)
    usage = ByteRangeCache(folder, max_bytes=held // 2).evict()  # the real eviction: oldest first
    assert usage is not None and 0 < usage.blocks < len(blocks)
    payload = _payload_after(hub, lambda: assert_epoch_matches_local(epoch_samples(dataset), dataset_root))
    assert payload  # the evicted blocks were fetched again, the others read from disk
    assert len(_blocks(folder)) == len(blocks)


def test_cache_options_are_not_part_of_the_resume_identity(hub, tmp_path):
    on = streaming(repo_id=REPO, config=_config(_cache_dir(tmp_path), gb=2.0))
    off = streaming(repo_id=REPO, config=_config(_cache_dir(tmp_path), gb=0))
    assert on.source.byte_cache is not None and off.source.byte_cache is None
    assert on.identity == off.identity
    check_identity(on.identity, off.identity)
    assert dataset_identity("x", None, on.meta, on.episodes, _config(tmp_path / "a", 1.0)) == dataset_identity(
        "x", None, on.meta, on.episodes, _config(tmp_path / "b", None)
    )


# -- processes sharing one cache -----------------------------------------------------------

READER = """
import hashlib, json, os, sys, time
from lerobot_nodes.sources import ByteRangeCache, HubRepoSource
from lerobot_nodes.sources.http_range import HttpOptions
endpoint, repo, sha, folder, block, go, ranges = sys.argv[1:8]
# No coalescing across gaps: with blocks smaller than the reader's 64 KiB gap, two runs of missing
# blocks would go out as one request carrying the blocks between them (blocks another process fetches).
source = HubRepoSource(repo, sha, endpoint=endpoint, http=HttpOptions(coalesce_gap=0))
source.use_byte_cache(ByteRangeCache(folder, block_size=int(block)))
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
out = {}
for path, spans in json.loads(ranges).items():
    out[path] = [hashlib.sha256(b).hexdigest() for b in source.read_ranges(path, [tuple(s) for s in spans])]
print(json.dumps({"digests": out, "stats": source.byte_cache.stats.as_dict()}), flush=True)
"""


def _reader(hub, sha, folder, block, go, ranges) -> subprocess.Popen:
    import json

    env = {**os.environ, **ENV}
    return subprocess.Popen(
        [sys.executable, "-c", READER, hub.endpoint, REPO, sha, str(folder), str(block), str(go), json.dumps(ranges)],
        stdout=subprocess.PIPE, text=True, env=env,
    )


def _served_spans(records, path: str) -> list[tuple[int, int]]:
    spans = []
    for record in records:
        if record.origin == "cdn" and record.path.endswith(path) and record.bytes_sent and record.range:
            first, last = record.range.removeprefix("bytes=").split("-")
            spans.append((int(first), int(last) + 1))
    return spans


@pytest.mark.timeout(300)
def test_four_processes_sharing_a_cache_fetch_each_block_once(hub, dataset_root, tmp_path):
    import json

    sha = hub.branch_head(REPO, "main")
    videos = sorted(p.relative_to(dataset_root).as_posix() for p in dataset_root.glob("videos/**/*.mp4"))[:3]
    block = 4096
    rng = random.Random(5)
    ranges = {}
    for path in videos:
        size = (dataset_root / path).stat().st_size
        starts = sorted(rng.randrange(0, size - 1) for _ in range(12))
        ranges[path] = [(s, min(size, s + rng.randrange(1, 6 * block))) for s in starts] + [(0, size)]
    go = tmp_path / "go"
    folder = _cache_dir(tmp_path)
    readers = [_reader(hub, sha, folder, block, go, ranges) for _ in range(4)]
    try:
        for reader in readers:
            assert reader.stdout is not None and reader.stdout.readline() == "ready\n"
        hub.clear_records()
        go.touch()
        results = [json.loads(reader.communicate(timeout=120)[0]) for reader in readers]
    finally:
        for reader in readers:
            reader.kill()
            reader.wait()
    for path, spans in ranges.items():
        local = (dataset_root / path).read_bytes()
        expected = [hashlib.sha256(local[s:e]).hexdigest() for s, e in spans]
        assert all(result["digests"][path] == expected for result in results)
        served = _served_spans(hub.records, path)
        assert served, path
        covered = bytearray(len(local))
        for start, end in served:
            for i in range(start, end):
                covered[i] += 1
        assert min(covered) >= 1  # (0, size) asks for the whole file
        # Each block is fetched by one process of the four: every byte is served once.
        assert sum(covered) == len(local), f"{path}: {sum(covered)} bytes served for {len(local)}"
    misses = sum(result["stats"]["misses"] for result in results)  # each block fetched once over the 4
    assert misses == sum(-(-(dataset_root / p).stat().st_size // block) for p in videos)
    assert sum(result["stats"]["hits"] for result in results) > 0


# -- a writer killed at random points ------------------------------------------------------

WRITER = """
import sys
from lerobot_nodes.sources import ByteRangeCache, HubRepoSource
endpoint, repo, sha, folder, block = sys.argv[1:6]
paths = sys.argv[6:]
source = HubRepoSource(repo, sha, endpoint=endpoint)
source.use_byte_cache(ByteRangeCache(folder, block_size=int(block)))
print("ready", flush=True)
for _ in range(100):
    for path in paths:
        size = source.info(path).size
        for start in range(0, size, 3 * int(block) + 17):
            source.read_range(path, start, min(size, start + 5 * int(block)))
"""


@pytest.mark.timeout(400)
def test_sigkill_during_cache_writes_never_yields_a_wrong_byte(hub, dataset_root, tmp_path):
    sha = hub.branch_head(REPO, "main")
    paths = sorted(p.relative_to(dataset_root).as_posix() for p in dataset_root.glob("**/*.mp4"))[:2]
    paths += sorted(p.relative_to(dataset_root).as_posix() for p in dataset_root.glob("data/**/*.parquet"))[:1]
    local = {p: (dataset_root / p).read_bytes() for p in paths}
    folder, block = _cache_dir(tmp_path), 1024
    rng = random.Random(7)
    env = {**os.environ, **ENV}
    killed_with_partials = 0
    for _ in range(20):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, hub.endpoint, REPO, sha, str(folder), str(block), *paths],
                                  stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
            time.sleep(rng.uniform(0.0, 0.4))
            os.kill(writer.pid, signal.SIGKILL)
        finally:
            writer.kill()
            writer.wait()
        killed_with_partials += any(".partial" in name for _, _, names in os.walk(folder) for name in names)
        # Every installed block holds the file's bytes at its place.
        for top in folder.glob("blocks-*/*/*"):
            for entry in top.iterdir():
                if entry.suffix == ".lock" or entry.name.startswith("."):
                    continue
                index, length = map(int, entry.name.split("-"))
                data = entry.read_bytes()
                assert len(data) == length
                assert any(content[index * block: index * block + length] == data for content in local.values())
        # And reads through the cache equal the store's bytes.
        source = HubRepoSource(REPO, sha, endpoint=hub.endpoint)
        source.use_byte_cache(ByteRangeCache(folder, block_size=block))
        for path, content in local.items():
            start = rng.randrange(0, len(content) - 1)
            end = rng.randrange(start + 1, len(content) + 1)
            assert source.read_range(path, start, end) == content[start:end]
            assert source.read_file(path) == content
        # Make room for the next writer: drop a random half of the blocks.
        for _, _, path in _blocks(folder):
            if rng.random() < 0.5:
                os.unlink(path)
    usage = ByteRangeCache(folder, block_size=block).evict()  # a scan removes what killed writers left
    assert usage is not None
    assert not [n for _, _, names in os.walk(folder) for n in names if n.endswith(".partial")]
    print(f"{killed_with_partials} of 20 kills left a temporary block file")


# -- a full, read-only or too small cache --------------------------------------------------


@contextlib.contextmanager
def _tmpfs(where: Path, size: str, read_only: bool = False):
    where.mkdir(parents=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        assert os.geteuid() != 0, f"root could not mount a tmpfs: {mounted.stderr.decode(errors='replace')}"
        yield None  # not root: the caller takes a folder without write permission instead
        return
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _one_warning(caplog, folder: Path) -> None:
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and str(folder) in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="a full disk is a tiny tmpfs, and mounting one needs root")
def test_a_full_cache_disk_streams_correctly_with_one_warning(hub, dataset_root, tmp_path, caplog):
    with _tmpfs(tmp_path / "full", "16k") as disk:
        assert disk is not None
        with caplog.at_level(logging.WARNING, logger="lerobot_nodes.sources"):
            dataset = streaming(repo_id=REPO, config=_config(disk, gb=1.0))  # bound above the disk's 16 KiB
            assert dataset.source.byte_cache is not None  # writable at open: the disk fills up later
            assert_epoch_matches_local(epoch_samples(dataset), dataset_root)
            assert_epoch_matches_local(epoch_samples(dataset), dataset_root)
        _one_warning(caplog, disk)
        assert "No space left" in next(r.getMessage() for r in caplog.records if str(disk) in r.getMessage())
        assert not [n for _, _, names in os.walk(disk) for n in names if n.endswith(".partial")]


@pytest.mark.timeout(300)
def test_a_read_only_cache_dir_streams_correctly_with_one_warning(hub, dataset_root, tmp_path, caplog):
    with _tmpfs(tmp_path / "ro", "1m", read_only=True) as disk:
        folder = disk
        if disk is None:  # not root (_tmpfs fails as root): permission bits bind this user
            folder = tmp_path / "ro"
            folder.chmod(0o500)
        with caplog.at_level(logging.WARNING, logger="lerobot_nodes.sources"):
            dataset = streaming(repo_id=REPO, config=_config(folder / "cache"))
            assert dataset.source.byte_cache is None
            assert_epoch_matches_local(epoch_samples(dataset, num_workers=2), dataset_root)
        _one_warning(caplog, folder / "cache")


def test_a_bound_smaller_than_one_block_streams_uncached_with_one_warning(hub, dataset_root, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="lerobot_nodes.sources"):
        dataset = streaming(repo_id=REPO, config=_config(_cache_dir(tmp_path), gb=0.0005))  # 0.5 MB < 1 MiB
        assert dataset.source.byte_cache is None
        assert_epoch_matches_local(epoch_samples(dataset), dataset_root)
    _one_warning(caplog, _cache_dir(tmp_path))
    assert not _blocks(_cache_dir(tmp_path))


# -- identity --------------------------------------------------------------------------------


@needs_buckets
def test_a_file_replaced_in_a_bucket_with_the_same_size_is_never_served_from_old_bytes(hub, dataset_root, tmp_path):
    hub.add_bucket(BUCKET, dataset_root)
    folder = _cache_dir(tmp_path)
    path = sorted(p.relative_to(dataset_root).as_posix() for p in dataset_root.glob("videos/**/*.mp4"))[0]
    old = (dataset_root / path).read_bytes()
    spans = [(0, len(old)), (100, 5000), (len(old) - 300, len(old))]

    def read():
        source = HubBucketSource(BUCKET, endpoint=hub.endpoint)
        source.use_byte_cache(ByteRangeCache(folder))
        return source, source.read_ranges(path, spans)

    before, first = read()
    assert first == [old[s:e] for s, e in spans]
    assert _payload_after(hub, read) == []  # cached
    new = bytes(reversed(old))
    hub.put_bucket_object(BUCKET, path, new)
    after, second = read()
    assert after.info(path).size == before.info(path).size
    assert after.info(path).fingerprint != before.info(path).fingerprint
    assert second == [new[s:e] for s, e in spans]


def test_a_local_folder_is_never_cached(dataset_root, tmp_path):
    dataset = streaming(dataset_root, config=_config(_cache_dir(tmp_path), gb=1.0))
    assert isinstance(dataset.source, LocalSource) and dataset.source.byte_cache is None
    dataset.source.use_byte_cache(ByteRangeCache(_cache_dir(tmp_path)))
    assert dataset.source.byte_cache is None
    assert not _cache_dir(tmp_path).exists()


# -- eviction --------------------------------------------------------------------------------


def test_eviction_keeps_the_cache_under_its_bound_least_recently_used_first(hub, dataset_root, tmp_path):
    sha = hub.branch_head(REPO, "main")
    folder, block = _cache_dir(tmp_path), 1024
    bound = 10 * block
    source = HubRepoSource(REPO, sha, endpoint=hub.endpoint)
    cache = ByteRangeCache(folder, max_bytes=bound, block_size=block)
    source.use_byte_cache(cache)
    videos = sorted(p.relative_to(dataset_root).as_posix() for p in dataset_root.glob("videos/**/*.mp4"))
    data = sorted(p.relative_to(dataset_root).as_posix() for p in dataset_root.glob("data/**/*.parquet"))
    keep, old, other = videos[0], data[0], videos[1]
    source.read_range(keep, 0, 2 * block)
    kept = [p for _, _, p in _blocks(folder)]
    source.read_range(old, 0, 2 * block)
    dropped = [p for _, _, p in _blocks(folder) if p not in kept]
    for _, _, path in _blocks(folder):  # both used ten minutes ago ...
        os.utime(path, (time.time() - 600, time.time() - 600))
    source.read_range(keep, 0, 2 * block)  # ... and one of them again now: the hit touches it
    assert source.read_range(other, 0, 7 * block) == (dataset_root / other).read_bytes()[: 7 * block]  # 11 blocks > 10
    assert cache.stats.evictions == 2 and scan_blocks(folder)[1] <= bound
    assert all(os.path.exists(p) for p in kept) and not any(os.path.exists(p) for p in dropped)
    for path in [*videos, *data]:  # much more than the bound: it holds after every read, give or take
        assert source.read_file(path) == (dataset_root / path).read_bytes()  # the bytes written since a scan
        assert scan_blocks(folder)[1] <= bound + cache.scan_every
    assert cache.stats.evictions > 10


# -- S3 (moto) -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_dataset(dataset_root):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    previous = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        fs.mkdir(S3_BUCKET)  # moto keeps buckets per process: a name of its own, removed after
        fs.put(str(dataset_root), f"{S3_BUCKET}/datasets/cached", recursive=True)
        yield f"s3://{S3_BUCKET}/datasets/cached"
        fs.rm(S3_BUCKET, recursive=True)
    finally:
        server.stop()
        with contextlib.suppress(ImportError):
            import s3fs

            s3fs.S3FileSystem.clear_instance_cache()  # cached instances would keep this server's endpoint
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.mark.timeout(300)
def test_s3_second_epoch_reads_nothing_from_the_store(s3_dataset, dataset_root, tmp_path):
    dataset = streaming(s3_dataset, config=_config(_cache_dir(tmp_path)))
    assert dataset.source.byte_cache is not None
    assert_epoch_matches_local(epoch_samples(dataset), dataset_root)
    requests = dataset.source.stats.requests
    assert_epoch_matches_local(epoch_samples(dataset), dataset_root)
    assert dataset.source.stats.requests == requests
    assert _blocks(_cache_dir(tmp_path))


# -- options and pickling --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"streaming_disk_cache_gb": -1}, r"^--dataset.streaming_disk_cache_gb must be a number of GB >= 0 .*got -1$"),
        ({"streaming_disk_cache_gb": "big"}, r"streaming_disk_cache_gb .*got 'big'"),
        ({"streaming_disk_cache_gb": float("nan")}, r"streaming_disk_cache_gb .*got nan"),
        ({"streaming_disk_cache_dir": ""}, r"^--dataset.streaming_disk_cache_dir must be a folder path or unset"),
    ],
)
def test_invalid_cache_options_are_one_clear_line(options, message):
    with pytest.raises(ConfigError, match=message) as error:
        StreamingConfig(**options)
    assert "\n" not in str(error.value)


def test_the_cache_pickles_as_its_folder_and_bound(tmp_path):
    cache = byte_cache_from_options(2.5, str(tmp_path / "c"))
    assert cache is not None and cache.max_bytes == 2_500_000_000 and byte_cache_from_options(0, None) is None
    cache.stats.hits = 3
    copy = pickle.loads(pickle.dumps(cache))
    assert (copy.folder, copy.max_bytes, copy.block_size) == (cache.folder, cache.max_bytes, cache.block_size)
    assert copy.stats.hits == 0 and len(pickle.dumps(cache)) < 400
    default = byte_cache_from_options(None, None)
    assert default is not None and default.folder == Path(os.environ["HF_LEROBOT_HOME"]) / "streaming-bytes"
    assert 0 < default.bound() <= 50_000_000_000


def test_open_source_attaches_nothing_by_itself(hub):
    assert open_source(repo_id=REPO).byte_cache is None  # only the dataset (its options) attaches a cache
