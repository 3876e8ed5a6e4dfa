"""``lerobot-nodes stream`` on a plain ``http://`` root served by a loopback static server."""

from __future__ import annotations

import pytest

from lerobot_nodes.testing.static_http import StaticHttpServer

from .cli_process import assert_one_line_error, run_cli


@pytest.fixture
def http_root(tiny_dataset):
    with StaticHttpServer(tiny_dataset, mount="/ds") as server:
        yield server


def test_stream_reads_a_plain_http_root(http_root, lerobot_home):
    result = run_cli("stream", f"--dataset.root={http_root.url}", "--steps=2", env={"HF_TOKEN": "hf_not_for_you_123"})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert http_root.records and not any(r.authorization for r in http_root.records)
    # Its metadata and indexes are cached (the server sends ETags), listed and cleared like the others.
    listing = run_cli("cache", "list").stdout
    assert "meta     http root 127.0.0.1--" in listing and "indexes  local folder ds" in listing, listing
    assert "tables   http://127.0.0.1:" in listing, listing  # its parsed meta/episodes, keyed by the ETags
    # metadata, indexes, the parsed episodes table and the disk byte cache of the ranges it read
    assert run_cli("cache", "clear", "--all").stdout.splitlines()[-1].startswith("removed 4 entries (")


def test_a_missing_video_on_a_plain_http_root_is_one_line(http_root, tiny_dataset):
    video = next(p for p in sorted(tiny_dataset.glob("videos/**/*.mp4")))
    path = video.relative_to(tiny_dataset).as_posix()
    http_root.hide(path)
    error = assert_one_line_error(run_cli("stream", f"--dataset.root={http_root.url}", "--steps=2"), 1, "")
    assert path in error and f"{http_root.url}/{path}" in error and "404" in error, error
