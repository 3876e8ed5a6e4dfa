"""Lookup order, validation, invalidation and generations of the local index cache (one process)."""

from __future__ import annotations

import json
import logging
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.mp4.index import VideoIndex, read_index_from_source
from lerobot_nodes.mp4.plan import plan_clip
from lerobot_nodes.sidecar import (
    MappedVideoIndex,
    SidecarCache,
    build_archive,
    default_cache_root,
    open_video_indexes,
)
from lerobot_nodes.sidecar import cache as cache_module
from lerobot_nodes.sidecar import derived as derived_module
from lerobot_nodes.sidecar.cache import CacheEntry
from lerobot_nodes.sidecar.schema import DEFAULT_ARCHIVE_NAME, PUBLISHED_DIR
from lerobot_nodes.sources import LocalSource

from .sidecar_testkit import copy_dataset

LOGGER = "lerobot_nodes.sidecar"


def _must_not_parse(source: object, path: str) -> dict[str, np.ndarray]:
    raise AssertionError(f"{path} was parsed although a valid index existed")


def _assert_matches_store(indexes: dict[str, VideoIndex], source: LocalSource) -> None:
    for path, index in indexes.items():
        expected = read_index_from_source(source, path).to_arrays()
        for name, value in expected.items():
            assert np.array_equal(index.to_arrays()[name], value), (path, name)


def _replace_with_same_size(path: Path) -> None:
    """Replace a video by different content of the same size (a new object, as an upload makes)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(255 - b for b in data[middle : middle + 16])
    replacement = path.with_name(path.name + ".new")
    replacement.write_bytes(bytes(data))
    os.replace(replacement, path)


def test_first_open_builds_later_opens_reuse(av1_dataset: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = LocalSource(av1_dataset)
    paths = load_meta(source).video_files()
    cache = SidecarCache()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        indexes, report = cache.open(source, paths, dataset_id="o/d")
    assert report.built == paths and not report.reused
    assert all(isinstance(index, MappedVideoIndex) for index in indexes.values())
    assert str(default_cache_root()).startswith(os.environ["HF_LEROBOT_HOME"])
    assert all(str(index.record.path).startswith(str(default_cache_root())) for index in indexes.values())
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("building MP4 sample indexes of 2 video files") for m in messages)
    assert any(m.startswith("built MP4 sample indexes of 2 video files") for m in messages)
    _assert_matches_store(indexes, source)

    again, report = SidecarCache(parser=_must_not_parse).open(source, paths, dataset_id="o/d")
    assert report.reused == paths and not report.built
    assert {p: i.record.path for p, i in again.items()} == {p: i.record.path for p, i in indexes.items()}  # type: ignore[attr-defined]


def test_public_entry_point(av1_dataset: Path, tmp_path: Path) -> None:
    source = LocalSource(av1_dataset)
    meta = load_meta(source)
    indexes = open_video_indexes(source, meta, meta.video_files([0]), cache_dir=tmp_path / "cache", lock_timeout_s=5)
    assert set(indexes) == set(meta.video_files([0]))
    index = indexes[meta.video_file(0, meta.video_keys[0])]
    plan = plan_clip(index, *meta.video_span(0, meta.video_keys[0]))
    assert plan.needed_count == int(meta.episodes.length[0])
    assert index.timescale > 0 and index.codec == "av1" and len(index.codec_config) > 0
    assert (tmp_path / "cache" / "g1").is_dir()


def test_each_rank_builds_only_its_files(h264_many_files: Path) -> None:
    source = LocalSource(h264_many_files)
    meta = load_meta(source)
    rank_files = meta.video_files([0, 1])
    indexes, report = SidecarCache().open(source, rank_files)
    assert sorted(indexes) == rank_files == report.built
    records = list((default_cache_root() / "g1").glob("*/records/*.idx"))
    assert len(records) == len(rank_files) < len(meta.video_files())


def test_published_sidecar_is_converted_without_parsing(av1_dataset: Path, tmp_path: Path) -> None:
    root = copy_dataset(av1_dataset, tmp_path / "dataset")
    source = LocalSource(root)
    paths = load_meta(source).video_files()
    build_archive(source, root / PUBLISHED_DIR / DEFAULT_ARCHIVE_NAME, dataset_id="o/d", show_progress=False)
    indexes, report = SidecarCache(parser=_must_not_parse).open(source, paths, dataset_id="o/d")
    assert report.converted == paths and not report.built
    assert all(index.record.origin.startswith("published:meta/mp4-sidecars/") for index in indexes.values())  # type: ignore[attr-defined]
    _assert_matches_store(indexes, source)


def test_published_entry_of_a_replaced_video_is_rebuilt(av1_dataset: Path, tmp_path: Path) -> None:
    root = copy_dataset(av1_dataset, tmp_path / "dataset")
    source = LocalSource(root)
    paths = load_meta(source).video_files()
    build_archive(source, root / PUBLISHED_DIR / DEFAULT_ARCHIVE_NAME, show_progress=False)
    _replace_with_same_size(root / paths[0])
    _, report = SidecarCache().open(source, paths)
    assert report.built == [paths[0]] and report.converted == paths[1:]


def test_older_schema_is_rebuilt_locally(av1_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = copy_dataset(av1_dataset, tmp_path / "dataset")
    source = LocalSource(root)
    paths = load_meta(source).video_files()
    old = root / PUBLISHED_DIR / "old-sidecar.npz"
    old.parent.mkdir(parents=True)
    with zipfile.ZipFile(old, "w") as archive:
        archive.writestr("meta.json", json.dumps({"format": "lerobot-mp4-sidecar", "schema_version": 2}))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        indexes, report = SidecarCache().open(source, paths)
    assert report.built == paths and not report.converted
    assert any("schema v2" in r.getMessage() and "rebuild it" in r.getMessage() for r in caplog.records)
    _assert_matches_store(indexes, source)


def test_corrupt_published_sidecar_is_ignored(av1_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = copy_dataset(av1_dataset, tmp_path / "dataset")
    source = LocalSource(root)
    target = root / PUBLISHED_DIR / DEFAULT_ARCHIVE_NAME
    build_archive(source, target, show_progress=False)
    target.write_bytes(target.read_bytes()[:-100])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, report = SidecarCache().open(source, load_meta(source).video_files())
    assert report.built and not report.converted
    assert any("ignoring published sidecar" in r.getMessage() for r in caplog.records)


def test_replaced_video_of_same_size_gets_a_new_record_and_old_readers_keep_theirs(
    av1_dataset: Path, tmp_path: Path
) -> None:
    root = copy_dataset(av1_dataset, tmp_path / "dataset")
    source = LocalSource(root)
    path = load_meta(source).video_files()[0]
    before, _ = SidecarCache().open(source, [path])
    old_index = before[path]
    old_offsets = np.array(old_index.offsets)
    size = (root / path).stat().st_size

    _replace_with_same_size(root / path)
    assert (root / path).stat().st_size == size
    after, report = SidecarCache().open(source, [path])
    assert report.built == [path]  # detected although the size is unchanged
    new_record = after[path].record  # type: ignore[attr-defined]
    old_record = old_index.record  # type: ignore[attr-defined]
    assert new_record.path != old_record.path
    assert new_record.identity.fingerprint != old_record.identity.fingerprint
    assert old_record.path.exists()  # the old record is immutable and still there
    assert np.array_equal(old_index.offsets, old_offsets)  # an active reader is not invalidated


def test_store_without_stable_identity_rebuilds_at_every_open(av1_dataset: Path) -> None:
    class UnstableSource(LocalSource):
        has_stable_identity = False

    source = UnstableSource(av1_dataset)
    paths = load_meta(source).video_files()
    for _ in range(2):
        indexes, report = SidecarCache().open(source, paths)
        assert report.in_memory and report.built == paths
        assert all(type(index) is VideoIndex for index in indexes.values())
    assert not default_cache_root().exists()  # nothing cached


def test_corrupt_cached_record_is_replaced(av1_dataset: Path) -> None:
    source = LocalSource(av1_dataset)
    path = load_meta(source).video_files()[0]
    indexes, _ = SidecarCache().open(source, [path])
    record_path = indexes[path].record.path  # type: ignore[attr-defined]
    record_path.write_bytes(record_path.read_bytes()[:50])
    again, report = SidecarCache().open(source, [path])
    assert report.built == [path] and "unusable record" in report.stale[path]
    _assert_matches_store(again, source)


def test_a_new_generation_is_written_beside_the_old_one(
    av1_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = LocalSource(av1_dataset)
    paths = load_meta(source).video_files()
    old_indexes, _ = SidecarCache().open(source, paths)
    old_records = sorted((default_cache_root() / "g1").rglob("*.idx"))
    old_bytes = [p.read_bytes() for p in old_records]

    monkeypatch.setattr(derived_module, "DERIVED_GENERATION", 2)
    monkeypatch.setattr(cache_module, "DERIVED_GENERATION", 2)
    new_indexes, report = SidecarCache().open(source, paths)
    assert report.built == paths  # the new reader converts once ...
    assert all("/g2/" in str(i.record.path) for i in new_indexes.values())  # type: ignore[attr-defined]
    _, report = SidecarCache(parser=_must_not_parse).open(source, paths)
    assert report.reused == paths  # ... and later opens reuse it

    assert [p.read_bytes() for p in old_records] == old_bytes  # old readers keep their format
    monkeypatch.setattr(derived_module, "DERIVED_GENERATION", 1)
    monkeypatch.setattr(cache_module, "DERIVED_GENERATION", 1)
    _, report = SidecarCache(parser=_must_not_parse).open(source, paths)
    assert report.reused == paths
    assert all(np.asarray(i.offsets).size for i in old_indexes.values())


def test_entry_names_the_dataset_and_is_keyed_by_store(av1_dataset: Path, tmp_path: Path) -> None:
    copy = LocalSource(copy_dataset(av1_dataset, tmp_path / "copy"))
    original = LocalSource(av1_dataset)
    key = CacheEntry.key(original, "owner/name")
    assert key.startswith("owner--name@unpinned-")
    assert CacheEntry.key(copy, "owner/name") != key  # unpinned local folders never share entries


def test_mapped_indexes_materialize_and_decode_like_parsed_ones(h264_many_files: Path) -> None:
    from lerobot_nodes.mp4 import decode_clip, materialize_clip, plan_clip

    source = LocalSource(h264_many_files)
    meta = load_meta(source)
    key = meta.video_keys[0]
    episode = 3
    path = meta.video_file(episode, key)
    mapped = open_video_indexes(source, meta, [path])[path]
    from_s, to_s = meta.video_span(episode, key)
    clips = []
    for index in (mapped, read_index_from_source(source, path)):
        plan = plan_clip(index, from_s, to_s)
        clips.append(materialize_clip(plan, source.read_ranges(path, plan.byte_ranges)))
    assert clips[0] == clips[1]
    timestamps = [from_s + i / meta.fps for i in range(0, int(meta.episodes.length[episode]), 7)]
    frames = decode_clip(clips[0], timestamps)
    assert tuple(frames.shape[:2]) == (len(timestamps), 3)
