"""What the console scripts print besides errors: warnings, counts, help text, a stop by signal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from lerobot_nodes.cli.console import one_line_warnings, plural
from lerobot_nodes.cli.flags import DATASET_FLAGS
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.static_http import StaticHttpServer

from .cli_process import MODULES, run_cli


def _lines(stderr: str) -> list[str]:
    return [line for line in re.split(r"[\r\n]", stderr) if line.strip()]


def test_python_warnings_print_as_one_warning_line_each(tiny_dataset: Path) -> None:
    result = run_cli(
        "stream", f"--dataset.root={tiny_dataset}", "--dataset.episodes=[0,999]", "--num_workers=3", "--steps=1",
        "--batch_size=2",
    )
    assert result.returncode == 0, result.stderr
    lines = _lines(result.stderr)
    assert [line for line in lines if "999" in line] == [
        f"warning: episodes [999] are not in {tiny_dataset} (4 episodes); they are ignored"
    ], result.stderr
    clamped = [line for line in lines if "--num_workers=3" in line]
    assert len(clamped) == 1 and clamped[0].startswith("warning: --num_workers=3 is more than rank 0 can feed"), lines
    assert "UserWarning" not in result.stderr and ".py:" not in result.stderr, result.stderr
    assert "streaming 1 episode, 12 frames:" in result.stdout, result.stdout


def test_debug_keeps_pythons_warning_format(tiny_dataset: Path) -> None:
    result = run_cli("stream", "--debug", f"--dataset.root={tiny_dataset}", "--dataset.episodes=[0,999]", "--steps=1",
                     "--num_workers=0", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "UserWarning: episodes [999] are not in" in result.stderr, result.stderr


def test_one_line_warnings_leave_recorded_warnings_alone() -> None:
    """pytest.warns and catch_warnings(record=True) still see the warnings; the format comes back after."""
    before = warnings.formatwarning
    with one_line_warnings():
        assert warnings.formatwarning("episodes [9] are gone\n  again", UserWarning, "x.py", 1) == (
            "warning: episodes [9] are gone again\n"
        )
        assert warnings.formatwarning("episodes [9] are gone again", UserWarning, "y.py", 2) == ""  # once
        assert warnings.formatwarning("old", DeprecationWarning, "z.py", 3) == "warning: old (DeprecationWarning)\n"
        with pytest.warns(UserWarning, match="recorded"):
            warnings.warn("recorded", stacklevel=1)
    assert warnings.formatwarning is before


def test_counts_are_singular_for_one() -> None:
    assert [plural(1, "episode"), plural(2, "episode"), plural(0, "frame"), plural(1, "video file")] == [
        "1 episode", "2 episodes", "0 frames", "1 video file",
    ]


def test_inspect_counts_in_words(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "one", episode_lengths=[6], cameras=("observation.images.top",))
    result = run_cli("inspect", f"--dataset.root={dataset}")
    assert result.returncode == 0, result.stderr
    assert "MP4 sidecar: 1 video file, 6 samples" in result.stdout, result.stdout
    assert "the camera info of 1 camera and the video spans of 1 episode agree" in result.stdout, result.stdout


def test_help_says_what_a_repo_id_without_root_does() -> None:
    """The code streams the Hub repo; the local copy under $HF_LEROBOT_HOME is read only with HF_HUB_OFFLINE=1."""
    repo_id = next(flag for flag in DATASET_FLAGS if flag.name == "dataset.repo_id").describe_default()
    assert "Hub dataset repo" in repo_id and "only with HF_HUB_OFFLINE=1" in repo_id, repo_id
    wide = {"COLUMNS": "400"}  # argparse wraps help text to the terminal
    stream = " ".join(run_cli("stream", "--help", env=wide).stdout.split())
    assert "the Hub dataset repo streamed (the local copy $HF_LEROBOT_HOME/<repo_id> is read instead only with " \
        "HF_HUB_OFFLINE=1)" in stream, stream
    sidecar = " ".join(run_cli("--help", command="lerobot-build-mp4-sidecar", env=wide).stdout.split())
    assert "without --data-root, the Hub dataset repo that is indexed (read from its local copy " \
        "$HF_LEROBOT_HOME/OWNER/DATASET instead only with HF_HUB_OFFLINE=1)" in sidecar, sidecar


@pytest.fixture
def slow_http_root(tmp_path: Path):
    """A dataset with 4 MP4 files behind a static server that waits 1 s before every answer."""
    dataset = write_dataset(
        tmp_path / "dataset", episode_lengths=[6, 6], cameras=("observation.images.a", "observation.images.b",
                                                             "observation.images.c", "observation.images.d"),
    )
    with StaticHttpServer(dataset, mount="/ds", latency_s=1.0) as server:
        yield server


def test_sigterm_during_a_sidecar_build_prints_one_line_and_exits_143(slow_http_root: StaticHttpServer, tmp_path: Path) -> None:
    output = tmp_path / "sidecar.npz"
    output.write_bytes(b"the previous archive")
    process = subprocess.Popen(
        [sys.executable, "-m", MODULES["lerobot-build-mp4-sidecar"], f"--data-root={slow_http_root.url}",
         f"--output={output}", "--repo-id=owner/slow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ},
    )
    try:
        deadline = time.monotonic() + 120
        while not any(r.path.endswith(".mp4") for r in slow_http_root.records):  # the build reads its first video
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the build never read a video"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr, stderr
    assert _lines(stderr)[-1] == (
        f"lerobot-build-mp4-sidecar: stopped by SIGTERM before the archive was complete; {output} was left as it was"
    ), stderr
    assert output.read_bytes() == b"the previous archive"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".sidecar.npz")], list(tmp_path.iterdir())
