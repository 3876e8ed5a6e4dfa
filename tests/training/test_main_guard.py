"""A training script without ``if __name__ == "__main__":`` and DataLoader workers works, or ends with
one line saying to add the guard (``lerobot_nodes.workers.main_guard``), never with only
``DataLoader worker (pid(s) ...) exited unexpectedly``.

Each case runs ``scripts/unguarded_script.py`` in its own process over a local root and over an
``s3://`` root on a real S3-compatible server (moto; read natively: s3fs's event-loop thread used to
rule out a forked workers' server, which ``scripts/worker_server_run.py`` still checks with a thread
of its own).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import S3_ROOT

SCRIPT = Path(__file__).parent / "scripts" / "unguarded_script.py"
GUARD = 'if __name__ == "__main__":'


@pytest.fixture(params=["local", "s3"])
def root_and_env(request, small_dataset):
    if request.param == "local":
        return str(small_dataset), {}
    return S3_ROOT, request.getfixturevalue("s3_env")


def run_script(root: str, env: dict[str, str], mode: str, **extra: str) -> subprocess.CompletedProcess[str]:
    environ = {key: value for key, value in os.environ.items() if key != "LEROBOT_NODES_DEBUG"}
    environ.update(env, **extra)
    return subprocess.run(
        [sys.executable, str(SCRIPT), root, mode], capture_output=True, text=True, timeout=300, env=environ
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_an_unguarded_script_streams_with_workers(root_and_env):
    # The dataset forks the workers' server before any thread starts: workers are copies of the
    # script's process and never run the script again.
    root, env = root_and_env
    done = run_script(root, env, "plain")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("batch ") == 2, done.stdout
    assert "Traceback" not in done.stderr and not error_lines(done.stderr), done.stderr[-3000:]


def test_workers_that_would_run_the_script_again_end_it_with_one_line(root_and_env):
    # A thread running before the dataset rules the fork out: each worker would run the script
    # again, so streaming_dataloader ends the script before any worker starts.
    root, env = root_and_env
    done = run_script(root, env, "thread")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "exited unexpectedly" not in done.stderr, done.stderr[-3000:]
    [line] = error_lines(done.stderr)
    assert f"{SCRIPT}:" in line and GUARD in line and "runs the script again" in line, line
    assert "batch " not in done.stdout


def test_the_debug_switch_shows_the_traceback(small_dataset):
    done = run_script(str(small_dataset), {}, "thread", LEROBOT_NODES_DEBUG="1")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "ConfigError" in done.stderr and GUARD in done.stderr, done.stderr[
        -3000:
    ]


def test_a_plain_dataloader_worker_running_the_script_again_says_why_it_ends(small_dataset):
    # No streaming_dataloader to check first: the stdlib forkserver's workers run the script again
    # and each one ends at the dataset's construction with the line, before anything else.
    done = run_script(str(small_dataset), {}, "stateful")
    assert done.returncode != 0
    lines = error_lines(done.stderr)
    assert lines and all(GUARD in line and f"{SCRIPT}:" in line for line in lines), done.stderr[-3000:]
    assert "daemonic processes are not allowed" not in done.stderr, done.stderr[-3000:]
