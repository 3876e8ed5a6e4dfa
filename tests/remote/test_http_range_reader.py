"""The native HTTP range reader against the loopback Hub: exact ranges, cached redirects, faults."""

from __future__ import annotations

import os
import pickle
import time

import pytest

from lerobot_nodes.errors import SourceAuthError, SourceError, SourceFileNotFoundError, SourceUnavailableError
from lerobot_nodes.sources import HttpOptions, HttpRangeReader
from lerobot_nodes.sources.ranges import coalesce, covering, split

REPO = "lerobot-nodes/reader"
PAYLOAD = os.urandom(3 * 1024 * 1024 + 17)


@pytest.fixture
def hub(make_loopback_hub, tmp_path):
    folder = tmp_path / "repo"
    (folder / "videos").mkdir(parents=True)
    (folder / "videos" / "file.mp4").write_bytes(PAYLOAD)
    (folder / "meta.json").write_text('{"small": true}')
    server = make_loopback_hub()
    server.add_dataset(REPO, folder)
    return server


def _url(hub, path="videos/file.mp4"):
    return f"{hub.endpoint}/datasets/{REPO}/resolve/{hub.branch_head(REPO, 'main')}/{path}"


def _reader(**options):
    defaults = {"backoff_s": 0.01, "backoff_max_s": 0.05}
    return HttpRangeReader(HttpOptions(**{**defaults, **options}))


def test_exact_ranges_and_one_redirect_lookup_per_file(hub):
    reader = _reader()
    url = _url(hub)
    ranges = [(0, 10), (1000, 5000), (2_000_000, 2_100_000), (len(PAYLOAD) - 7, len(PAYLOAD))]
    for _ in range(3):
        chunks = reader.read_ranges(url, ranges, size=len(PAYLOAD), name="file.mp4")
        assert chunks == [PAYLOAD[s:e] for s, e in ranges]
    resolves = [r for r in hub.records if r.origin == "hub" and "/resolve/" in r.path]
    assert len(resolves) == 1 and resolves[0].status == 302
    assert reader.stats.redirects == 1
    cdn = [r for r in hub.records if r.origin == "cdn"]
    assert cdn and all(not r.authorization for r in cdn)


def test_nearby_ranges_share_a_request(hub):
    reader = _reader(coalesce_gap=64 * 1024)
    url = _url(hub)
    reader.read_ranges(url, [(0, 100)], size=len(PAYLOAD), name="f")  # learn the redirect
    hub.clear_records()
    chunks = reader.read_ranges(url, [(0, 100), (150, 300), (60_000, 60_010)], size=len(PAYLOAD), name="f")
    assert chunks == [PAYLOAD[0:100], PAYLOAD[150:300], PAYLOAD[60_000:60_010]]
    assert len(hub.range_reads()) == 1


def test_subranges_split_one_large_read(hub):
    reader = _reader(subranges=4, min_subrange=256 * 1024)
    url = _url(hub)
    reader.read_ranges(url, [(0, 10)], size=len(PAYLOAD), name="f")
    hub.clear_records()
    assert reader.read_all(url, size=len(PAYLOAD), name="f") == PAYLOAD
    assert len(hub.range_reads()) == 4


@pytest.mark.parametrize("kind", ["503", "429", "reset", "close", "short", "stall"])
def test_each_fault_kind_is_retried_to_the_exact_bytes(hub, kind):
    hub.fault_every, hub.fault_kinds, hub.stall_s = 2, [kind], 1.0
    reader = _reader(timeout_s=0.3)
    url = _url(hub)
    ranges = [(i * 100_000, i * 100_000 + 50_000) for i in range(8)]
    chunks = [reader.read_ranges(url, [r], size=len(PAYLOAD), name="f")[0] for r in ranges]
    assert chunks == [PAYLOAD[s:e] for s, e in ranges]
    assert reader.stats.retries >= 3


def test_a_short_body_fetches_only_the_missing_remainder(hub):
    reader = _reader(retries=3)
    url = _url(hub)
    reader.read_ranges(url, [(0, 10)], size=len(PAYLOAD), name="f")  # learn the redirect
    hub.clear_records()
    hub.fault_every, hub.fault_kinds = 1, ["short"]
    with pytest.raises(SourceUnavailableError):  # every read is cut: the budget runs out
        reader.read_ranges(url, [(0, 1_000_000)], size=len(PAYLOAD), name="f")
    asked = [r.range for r in hub.range_reads()]
    # Each attempt asks only for what had not arrived yet.
    starts = [int(r.split("=")[1].split("-")[0]) for r in asked if r]
    assert starts == sorted(starts) and len(set(starts)) == len(starts) > 1


def test_the_retry_budget_ends_in_a_clear_error_in_bounded_time(hub):
    hub.fault_every, hub.fault_kinds = 1, ["503"]
    reader = _reader(retries=4)
    started = time.monotonic()
    with pytest.raises(SourceUnavailableError) as caught:
        reader.read_ranges(_url(hub), [(0, 100)], size=len(PAYLOAD), name="videos/file.mp4")
    assert time.monotonic() - started < 10
    assert "videos/file.mp4" in str(caught.value) and "4 times" in str(caught.value) and "HTTP 503" in str(caught.value)
    assert "?" not in str(caught.value)


def test_expired_signed_urls_are_resolved_again_once(hub):
    reader = _reader()
    url = _url(hub)
    reader.read_ranges(url, [(0, 10)], size=len(PAYLOAD), name="f")
    hub.expire_signed_urls()
    assert reader.read_ranges(url, [(10, 20)], size=len(PAYLOAD), name="f") == [PAYLOAD[10:20]]
    assert reader.stats.redirects == 2


def test_missing_files_and_refused_credentials_are_permanent(hub):
    reader = _reader(retries=8)
    started = time.monotonic()
    with pytest.raises(SourceFileNotFoundError, match="answered 404"):
        reader.read_ranges(_url(hub, "videos/absent.mp4"), [(0, 10)], size=None, name="videos/absent.mp4")
    hub.require_token = "hf_secret"
    with pytest.raises(SourceAuthError, match="401"):
        reader.read_ranges(_url(hub), [(0, 10)], size=len(PAYLOAD), name="f")
    assert time.monotonic() - started < 5 and reader.stats.retries == 0


def test_size_changes_and_reads_past_the_end_are_errors(hub):
    reader = _reader()
    with pytest.raises(SourceError, match="listing said"):
        reader.read_ranges(_url(hub), [(0, 10)], size=len(PAYLOAD) + 1, name="f")
    with pytest.raises(SourceError, match="past its end"):
        reader.read_ranges(_url(hub), [(0, len(PAYLOAD) + 1)], size=len(PAYLOAD), name="f")


def test_a_pickled_reader_starts_fresh(hub):
    reader = _reader(connections=3)
    reader.read_ranges(_url(hub), [(0, 10)], size=len(PAYLOAD), name="f")
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.options.connections == 3 and copy.stats.requests == 0 and copy.stats.redirects == 0


def test_range_arithmetic():
    assert coalesce([(10, 20), (0, 5), (22, 30)], gap=2) == [(0, 5), (10, 30)]
    assert coalesce([(0, 10), (5, 8)]) == [(0, 10)]
    assert covering([(0, 5), (12, 15)], [(0, 5), (10, 30)]) == [0, 1]
    assert split((0, 10), 3) == [(0, 3), (3, 6), (6, 10)]
    assert split((0, 10), 4, minimum=5) == [(0, 5), (5, 10)]
    with pytest.raises(ValueError):
        covering([(4, 12)], [(0, 5), (10, 30)])


def test_probe_gives_size_and_validators_through_the_redirect_and_survives_faults(hub):
    reader = _reader()
    url = _url(hub)
    hub.fault_every, hub.fault_kinds = 1, ("503",)  # the first probe attempt of each file fails
    with pytest.raises(SourceUnavailableError):
        _reader(retries=1).probe(url, name="file.mp4")
    hub.fault_every = 2
    found = reader.probe(url, name="file.mp4")
    assert found.size == len(PAYLOAD) and found.etag and found.etag.strip('"') and reader.stats.retries >= 1
    assert reader.stats.redirects == 1 and reader.stats.bytes_received == 1  # one byte, from the CDN
    hub.fault_every = 0
    assert reader.probe(_url(hub, "meta.json"), name="meta.json").size == len('{"small": true}')
