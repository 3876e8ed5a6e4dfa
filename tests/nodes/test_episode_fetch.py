"""EpisodeFetcher: one plan per episode, the rows and every camera read concurrently, errors in order."""

from __future__ import annotations

import threading

import pytest

from lerobot_nodes import load_meta, open_source
from lerobot_nodes.errors import EpisodeFetchError
from lerobot_nodes.fetch import EpisodeFetcher, direct_index_provider

from .helpers import lerobot_threads


class _MeetingSource:
    """A real local source whose range reads wait until ``parties`` of them are in flight at once."""

    def __init__(self, source, parties: int, fail_path_part: str | None = None) -> None:
        self._source = source
        self._barrier = threading.Barrier(parties, timeout=20)
        self._fail = fail_path_part

    def read_ranges(self, path, ranges):
        self._barrier.wait()  # BrokenBarrierError (a failed test) if the reads run one after another
        if self._fail and self._fail in path:
            raise OSError(f"injected failure reading {path}")
        return self._source.read_ranges(path, ranges)

    def __getattr__(self, name):
        return getattr(self._source, name)


@pytest.mark.timeout(60)
def test_rows_and_every_camera_are_read_at_the_same_time(av1_dataset):
    source = open_source(av1_dataset)
    meta = load_meta(source)
    cameras = len(meta.video_keys)
    assert cameras >= 2
    plain = EpisodeFetcher(source, meta, index_provider=direct_index_provider(source)).fetch(1)
    meeting = _MeetingSource(source, parties=1 + cameras)
    fetcher = EpisodeFetcher(meeting, meta, index_provider=direct_index_provider(source))  # type: ignore[arg-type]
    payload = fetcher.fetch(1)
    assert {key: clip.data for key, clip in payload.clips.items()} == {key: clip.data for key, clip in plain.clips.items()}
    assert payload.fetched_bytes == plain.fetched_bytes
    assert lerobot_threads() == []  # the read threads are joined before fetch returns


@pytest.mark.timeout(60)
def test_a_failed_camera_read_names_the_episode_and_the_camera(av1_dataset):
    source = open_source(av1_dataset)
    meta = load_meta(source)
    key = meta.video_keys[-1]
    meeting = _MeetingSource(source, parties=1 + len(meta.video_keys), fail_path_part=key)
    fetcher = EpisodeFetcher(meeting, meta, index_provider=direct_index_provider(source))  # type: ignore[arg-type]
    with pytest.raises(EpisodeFetchError, match=rf"episode 2: reading the {key} clip .*injected failure"):
        fetcher.fetch(2)
    assert lerobot_threads() == []


def test_an_episode_is_planned_once(av1_dataset):
    source = open_source(av1_dataset)
    meta = load_meta(source)
    fetcher = EpisodeFetcher(source, meta, index_provider=direct_index_provider(source))
    first = fetcher.clip_requests(0)
    fetcher.cost(0)
    fetcher.gop_starts(0)
    assert fetcher.clip_requests(0) is first  # priced, run-planned and fetched from the same plans
