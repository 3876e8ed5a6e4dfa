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
MODES = ("plain", "thread", "codec", "dataset", "thread-after-dataset")


@pytest.fixture(scope="module")
def runs(small_dataset, tmp_path_factory):
    results = {}
    for mode in MODES:
        out = tmp_path_factory.mktemp(mode)
        done = subprocess.run(
            [sys.executable, str(SCRIPT), str(small_dataset), str(out), mode],
            capture_output=True, text=True, timeout=300, env={**os.environ, "HF_LEROBOT_HOME": str(out / "home")},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        results[mode] = {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}
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


@pytest.mark.parametrize("mode", ["plain", "dataset", "thread"])
def test_what_a_forked_server_shares_the_trainers_collector_leaves_alone(runs, mode):
    # Objects alive at the fork are frozen in the training process: its full collections would
    # write into each of them and copy the pages the server and workers share (35-48 MB over S3).
    # A new interpreter shares nothing, and the training process's collector is left as it was.
    assert runs[mode]["frozen_at_fork"] is (mode != "thread")


@pytest.mark.parametrize("mode", ["dataset", "thread-after-dataset"])
def test_building_the_dataset_forks_the_server_before_later_threads(runs, mode):
    # No start_worker_context() call: the dataset forked the server before anything started a
    # thread, so workers need no new interpreter even when a thread runs by the DataLoader's start.
    run = runs[mode]
    assert run["forked"] and "multiprocessing.forkserver" not in run["command"]
    assert str(SCRIPT) in run["command"]


def test_the_training_process_knows_whether_workers_run_the_main_script_again(runs):
    # Only a copy that kept this process's modules spares its workers a second run of the script
    # (what the main-guard check relies on, lerobot_nodes.workers.main_guard).
    assert {mode: runs[mode]["shares_main"] for mode in MODES} == {
        "plain": True, "thread": False, "codec": False, "dataset": True, "thread-after-dataset": True,
    }  # fmt: skip


def test_the_batches_do_not_depend_on_how_the_server_started(runs):
    assert len({runs[mode]["digest"] for mode in MODES}) == 1


@pytest.mark.parametrize("mode", MODES)
def test_workers_do_not_inherit_the_trainers_signal_or_logging_handlers(runs, mode):
    workers = runs[mode]["workers"]
    assert len(workers) == 2
    handlers = [{key: w[key] for key in ("sigterm_default", "sigint_default", "root_handlers")} for w in workers]
    assert handlers == [{"sigterm_default": True, "sigint_default": True, "root_handlers": 0}] * 2, workers


@pytest.mark.parametrize("mode", MODES)
def test_workers_dump_their_stacks_on_sigusr2_however_the_server_started(runs, mode):
    # The trainer registered the dump (dump_stacks_on); a worker from a new interpreter registers
    # it again at its start, or SIGUSR2's default action would have ended it.
    assert [w["survived_sigusr2"] for w in runs[mode]["workers"]] == [True, True]
    assert runs[mode]["stderr"].count("Current thread") + runs[mode]["stderr"].count("Thread 0x") >= 2


def test_codec_contexts_are_counted_as_the_full_object_list_counts_them(small_dataset):
    # The server's copy counts them from the classes' referrers (no write to every object's page);
    # the count must be the one a walk of every object gives, with contexts open, decoding, and gone.
    import gc

    import av
    from av.codec.context import CodecContext

    from lerobot_nodes.workers.server import open_codec_contexts

    def listed() -> int:
        return sum(1 for obj in gc.get_objects() if issubclass(type(obj), CodecContext))

    gc.collect()
    before = listed()
    assert open_codec_contexts() == before
    created = av.CodecContext.create("h264", "r")
    container = av.open(str(next(Path(small_dataset, "videos").rglob("*.mp4"))))
    next(container.decode(video=0))
    held = [created, container]
    assert open_codec_contexts() == listed() >= before + 2
    container.close()
    del held, created, container
    gc.collect()
    assert open_codec_contexts() == listed() == before
