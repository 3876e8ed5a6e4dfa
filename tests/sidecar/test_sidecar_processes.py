"""Real processes: SIGKILLed builders, concurrent opens, lock timeouts, shared pages."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from lerobot_nodes.errors import SidecarLockTimeoutError
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sidecar import SidecarCache, open_video_indexes
from lerobot_nodes.sidecar.schema import SourceIdentity
from lerobot_nodes.sources import LocalSource

from .sidecar_kill_trials import archive_kill_trials, cache_kill_trials
from .sidecar_testkit import Zygote, copy_dataset, mapping_stats, read_result

KILL_TRIALS = 20


def test_sigkilled_archive_builds_never_damage_the_previous_sidecar(
    zygote: Zygote, h264_many_files: Path, tmp_path: Path
) -> None:
    outcomes = archive_kill_trials(zygote, h264_many_files, tmp_path, KILL_TRIALS)
    print(f"archive kill trials: {dict(outcomes)}")
    assert outcomes["killed"] + outcomes["finished"] == KILL_TRIALS
    assert outcomes["killed"] >= KILL_TRIALS // 2, outcomes


def test_sigkilled_cache_builds_leave_valid_records_and_the_next_open_completes(
    zygote: Zygote, h264_many_files: Path, tmp_path: Path
) -> None:
    outcomes = cache_kill_trials(zygote, h264_many_files, tmp_path, KILL_TRIALS)
    print(f"cache kill trials: {dict(outcomes)}")
    assert outcomes["killed"] + outcomes["finished"] == KILL_TRIALS
    assert outcomes["killed"] >= KILL_TRIALS // 2, outcomes


def test_four_processes_opening_at_once_build_exactly_once(
    zygote: Zygote, h264_many_files: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    start_at = time.time() + 0.5
    paths = load_meta(LocalSource(h264_many_files)).video_files()
    children = [zygote.fork("open_indexes", root=str(h264_many_files), paths=paths, cache=str(cache),
                            start_at=start_at) for _ in range(4)]
    results = []
    for pid, result, log in children:
        assert zygote.wait(pid) == 0, read_result(result)
        results.append((read_result(result), log.read_text()))
    builders = [r for r, _ in results if r["built"]]
    assert len(builders) == 1, [r["built"] for r, _ in results]
    assert sum("building MP4 sample indexes" in log for _, log in results) == 1
    assert sorted(builders[0]["built"]) == paths
    assert all(sorted(r["reused"]) == paths for r, _ in results if not r["built"])
    assert len({tuple(sorted(r["digests"].items())) for r, _ in results}) == 1  # identical indexes
    assert len({tuple(r["records"]) for r, _ in results}) == 1  # the same files
    assert len(list(cache.rglob("records/*.idx"))) == len(paths)


def test_lock_timeout_names_the_lock_file(zygote: Zygote, av1_dataset: Path, tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "cache"
    source = LocalSource(av1_dataset)
    meta = load_meta(source)
    holder, result, _ = zygote.fork("hold_lock", root=str(av1_dataset), cache=str(cache), hold_s=60)
    lock_path = read_result(result)["lock"]
    try:
        with caplog.at_level("INFO", logger="lerobot_nodes.sidecar"), pytest.raises(SidecarLockTimeoutError) as raised:
            open_video_indexes(source, meta, meta.video_files(), cache_dir=cache, lock_timeout_s=0.3,
                               dataset_id="test/sidecar")
        message = str(raised.value)
        assert lock_path in message and f"pid {holder}" in message
        assert "healthy" in message and "streaming_sidecar_lock_timeout_s" in message
        assert any("waiting" in r.getMessage() and lock_path in r.getMessage() for r in caplog.records)
    finally:
        assert zygote.kill(holder) == -9
    # The holder was killed: the OS released its lock, the lock file left behind does not block.
    assert Path(lock_path).exists()
    indexes = open_video_indexes(source, meta, meta.video_files(), cache_dir=cache, lock_timeout_s=5,
                                 dataset_id="test/sidecar")
    assert len(indexes) == len(meta.video_files())


def test_processes_mapping_the_same_index_share_its_pages(
    zygote: Zygote, lerobot_av1: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    source = LocalSource(lerobot_av1)
    paths = load_meta(source).video_files()
    indexes, _ = SidecarCache(cache, show_progress=False).open(source, paths, dataset_id="test/sidecar")
    record_path = indexes[paths[0]].record.path  # type: ignore[attr-defined]
    children = [zygote.fork("open_indexes", root=str(lerobot_av1), cache=str(cache), touch_and_hold=60)
                for _ in range(2)]
    try:
        for _, result, _ in children:
            assert "touched" in read_result(result), read_result(result)
        stats = [mapping_stats(pid, record_path) for pid, _, _ in children]
    finally:
        for pid, _, _ in children:
            zygote.kill(pid)
    record_kb = record_path.stat().st_size // 1024
    assert record_kb >= 8, "the record spans several pages"
    for numbers in stats:
        assert numbers.get("Rss", 0) >= record_kb, numbers  # the columns were really read from the mapping
        assert numbers.get("Shared_Clean", 0) >= record_kb, numbers  # ... from pages shared between them
        assert numbers.get("Private_Dirty", 0) == 0, numbers
        assert numbers["Pss"] < numbers["Rss"], numbers


def test_a_copy_with_other_content_is_never_mistaken_for_the_original(av1_dataset: Path, tmp_path: Path) -> None:
    copy = LocalSource(copy_dataset(av1_dataset, tmp_path / "copy"))
    path = load_meta(copy).video_files()[0]
    original = SourceIdentity.of(LocalSource(av1_dataset).info(path), None)
    assert original.mismatch(SourceIdentity.of(copy.info(path), None)) is not None  # new inode/mtime
    digest = hashlib.sha256((av1_dataset / path).read_bytes()).hexdigest()
    assert digest == hashlib.sha256((tmp_path / "copy" / path).read_bytes()).hexdigest()
