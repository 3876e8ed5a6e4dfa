"""Workers' server (``lerobot_nodes.workers.server``): forked from the training process only when
that is safe, a new interpreter otherwise, and the same batches either way.

Each case is a real training script in its own process, since how the server starts is
decided once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "worker_server_run.py"


@pytest.fixture(scope="module")
def runs(small_dataset, tmp_path_factory):
    results = {}
    for mode in ("plain", "thread", "codec"):
        out = tmp_path_factory.mktemp(mode)
        done = subprocess.run(
            [sys.executable, str(SCRIPT), str(small_dataset), str(out), mode],
            capture_output=True, text=True, timeout=300, env={**os.environ, "HF_LEROBOT_HOME": str(out / "home")},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def test_a_plain_training_process_is_forked_into_the_server(runs):
    plain = runs["plain"]
    assert plain["forked"] and "multiprocessing.forkserver" not in plain["command"]
    assert str(SCRIPT) in plain["command"]  # a copy of the training script's process


def test_a_process_running_other_threads_gets_a_new_interpreter(runs):
    thread = runs["thread"]
    assert not thread["forked"] and "multiprocessing.forkserver" in thread["command"]


def test_a_copy_holding_an_open_codec_becomes_a_new_interpreter(runs):
    codec = runs["codec"]
    assert codec["forked"]  # forked, then it replaced itself
    assert "multiprocessing.forkserver" in codec["command"]


def test_the_batches_do_not_depend_on_how_the_server_started(runs):
    assert runs["plain"]["digest"] == runs["thread"]["digest"] == runs["codec"]["digest"]


@pytest.mark.parametrize("mode", ["plain", "thread", "codec"])
def test_workers_do_not_inherit_the_trainers_signal_or_logging_handlers(runs, mode):
    workers = runs[mode]["workers"]
    assert len(workers) == 2
    assert all(w == {"sigterm_default": True, "sigint_default": True, "root_handlers": 0} for w in workers), (
        workers
    )
