"""S3 on a real S3-compatible server (moto), read natively (``S3Source``) and through fsspec + s3fs
(``FsspecSource``, what ``s3://`` roots with s3fs's own options get); and ``memory://``."""

from __future__ import annotations

import os
import pickle

import fsspec
import fsspec.config
import pytest

from lerobot_nodes.errors import SourceFileNotFoundError
from lerobot_nodes.sidecar import SidecarCache
from lerobot_nodes.sources import FsspecSource, open_source
from lerobot_nodes.sources.s3 import S3Source
from lerobot_nodes.sources.s3_session import s3fs_options, shared_session
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.s3 import LoopbackS3

from .streaming_checks import assert_epoch_matches_local, epoch_samples, streaming


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsspec") / "dataset"
    return write_dataset(root, episode_lengths=[14, 21, 9, 17, 12], video_files_size_in_mb=0.03, seed=4)


@pytest.fixture(scope="module")
def s3_server(local_dataset):
    """A moto S3 server on 127.0.0.1 holding the dataset under s3://lerobot/datasets/small, this
    process's environment pointing s3fs at it."""
    with LoopbackS3() as server:
        previous = {key: os.environ.get(key) for key in server.environment()}
        os.environ.update(server.environment())
        try:
            server.upload(local_dataset, "s3://lerobot/datasets/small")
            yield server
        finally:
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@pytest.fixture
def s3_endpoint(s3_server):
    return s3_server.endpoint


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))


S3_URL = "s3://lerobot/datasets/small"
S3FS_OPTION = {"default_block_size": 5 << 20}
"""One of s3fs's own options: the root then goes to fsspec."""


@pytest.fixture(params=["native", "s3fs"])
def s3_root(request, s3_endpoint):
    """The dataset's S3 root as each path reads it: the URL alone (native), or an s3fs source."""
    if request.param == "native":
        return S3_URL
    return open_source(S3_URL, storage_options=S3FS_OPTION)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_s3_epoch_equals_the_map_style_reader_on_the_local_copy(s3_root, local_dataset, num_workers):
    dataset = streaming(s3_root)
    expected = S3Source if isinstance(s3_root, str) else FsspecSource
    assert type(dataset.source) is expected and dataset.source.has_stable_identity
    assert_epoch_matches_local(epoch_samples(dataset, num_workers=num_workers), local_dataset)


def test_both_s3_paths_list_the_same_files_with_the_same_identities(s3_endpoint):
    native, s3fs = open_source(S3_URL), open_source(S3_URL, storage_options=S3FS_OPTION)
    assert isinstance(native, S3Source) and isinstance(s3fs, FsspecSource)
    assert native.list_files() == s3fs.list_files()  # ETags alike: indexes cached by one serve the other
    for info in native.list_files():
        assert native.read_ranges(info.path, [(0, min(info.size, 100)), (info.size // 2, info.size)]) == (
            s3fs.read_ranges(info.path, [(0, min(info.size, 100)), (info.size // 2, info.size)])
        )


def test_s3_identity_is_the_etag_and_indexes_are_cached(s3_endpoint, local_dataset):
    source = open_source(S3_URL)
    video = next(f for f in source.list_files("videos/"))
    assert video.fingerprint is not None and video.fingerprint.startswith("ETag:")
    from lerobot_nodes.format.meta import load_meta

    meta = load_meta(source)
    _, first = SidecarCache().open(source, meta.video_files())
    _, second = SidecarCache().open(open_source(S3_URL, storage_options=S3FS_OPTION), meta.video_files())
    assert first.built and not second.built and second.reused == sorted(meta.video_files())
    assert b"testing" not in pickle.dumps(source)  # credentials come from the environment, not the pickle
    copy = pickle.loads(pickle.dumps(source))
    assert copy.read_file("meta/info.json") == source.read_file("meta/info.json")


def test_an_s3fs_source_sent_to_another_process_opens_its_file_system_with_that_processs_session(s3_endpoint):
    source = open_source(S3_URL, storage_options=S3FS_OPTION)
    assert source.fs.session is shared_session()
    copy = pickle.loads(pickle.dumps(source))
    assert copy.fs.session is shared_session()  # this process's: a worker's is the one it inherited
    path = "meta/info.json"
    assert copy.read_file(path) == source.read_file(path)


def test_s3_options_that_choose_a_session_or_a_listings_cache_keep_it(monkeypatch):
    assert s3fs_options("s3://bucket/data", {"anon": True}) == {
        "anon": True, "session": shared_session(), "use_listings_cache": False,
    }  # fmt: skip
    mine = object()
    assert s3fs_options("s3://bucket/data", {"session": mine})["session"] is mine
    assert "session" not in s3fs_options("s3://bucket/data", {"profile": "robot-lab"})
    assert s3fs_options("s3://bucket/data", {"use_listings_cache": True})["use_listings_cache"] is True
    monkeypatch.setitem(fsspec.config.conf, "s3", {"profile": "robot-lab"})  # FSSPEC_S3_PROFILE
    assert "session" not in s3fs_options("s3://bucket/data", {})
    assert s3fs_options("memory://data", {}) == {}


def test_an_s3fs_source_keeps_no_listing_in_fsspecs_cache(s3_endpoint):
    source = open_source(S3_URL, storage_options=S3FS_OPTION)
    assert len(source.list_files()) > 5
    assert len(source.fs.dircache) == 0


@pytest.mark.parametrize("options", [None, S3FS_OPTION])
def test_s3_missing_prefix_is_a_clear_error(s3_endpoint, options):
    with pytest.raises(SourceFileNotFoundError, match="s3://lerobot/datasets/nothing-here"):
        open_source("s3://lerobot/datasets/nothing-here", storage_options=options)


def test_memory_store_has_no_stable_identity_and_rebuilds_indexes_every_open(local_dataset, caplog):
    fs = fsspec.filesystem("memory")
    fs.put(str(local_dataset), "/lerobot-small", recursive=True)
    try:
        with caplog.at_level("INFO", logger="lerobot_nodes.sidecar"):  # the open indexes the videos
            dataset = streaming("memory://lerobot-small")
            samples = epoch_samples(dataset, num_workers=0)
        assert not dataset.source.has_stable_identity
        assert any("no stable file identities" in r.getMessage() for r in caplog.records)
        assert_epoch_matches_local(samples, local_dataset)
        from lerobot_nodes.format.meta import load_meta

        meta = load_meta(dataset.source)
        _, report = SidecarCache().open(open_source("memory://lerobot-small"), meta.video_files())
        assert report.in_memory and report.built == sorted(meta.video_files())
    finally:
        fs.rm("/lerobot-small", recursive=True)
