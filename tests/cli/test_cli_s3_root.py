"""``lerobot-nodes stream`` on an ``s3://`` root of a loopback S3-compatible server (moto), read natively."""

from __future__ import annotations

import pytest

from lerobot_nodes.testing.s3 import LoopbackS3

from .cli_process import assert_one_line_error, run_cli

ROOT = "s3://cli/tiny"


@pytest.fixture
def s3_env(tiny_dataset, tmp_path):
    with LoopbackS3() as server:
        server.upload(tiny_dataset, ROOT)
        yield {
            **server.environment(),
            "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
        }


def test_stream_reads_an_s3_root_and_its_caches_are_listed_and_cleared(s3_env):
    result = run_cli("stream", f"--dataset.root={ROOT}", "--steps=2", "--num_workers=2", env=s3_env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    listing = run_cli("cache", "list").stdout
    assert "meta     s3 root 127.0.0.1" in listing, listing  # meta/ cached by ETag
    assert "tables   s3://cli/tiny" in listing, listing
    # metadata, indexes, the parsed episodes table and the disk byte cache of the ranges it read
    assert run_cli("cache", "clear", "--all").stdout.splitlines()[-1].startswith("removed 4 entries (")


def test_a_missing_s3_prefix_is_one_line(s3_env):
    error = assert_one_line_error(run_cli("stream", "--dataset.root=s3://cli/nothing", "--steps=2", env=s3_env), 1, "")
    assert "s3://cli/nothing holds no files" in error, error
