"""Multi-rank coverage under torchrun, kill-and-resume of the stream command, CLI flags."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lerobot_nodes import MapStyleLeRobotDataset
from lerobot_nodes.cli.flags import split_flags
from lerobot_nodes.cli.main import main as cli_main
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.errors import ConfigError

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.parametrize("strategy", ["remaining", "round_robin"])
def test_torchrun_two_ranks_cover_every_frame_once(small_dataset, tmp_path, strategy):
    output = tmp_path / "gathered.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(SCRIPTS / "torchrun_coverage.py"), str(small_dataset), strategy, str(output),
    ]
    subprocess.run(command, check=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    ranks = json.loads(output.read_text())
    assert [r["world_size"] for r in ranks] == [2, 2]
    per_rank = [{tuple(pair) for pair in r["samples"]} for r in ranks]
    assert all(len(r["samples"]) == len(s) for r, s in zip(ranks, per_rank, strict=True)), "a rank repeated a frame"
    assert per_rank[0] and per_rank[1] and not (per_rank[0] & per_rank[1])
    reference = MapStyleLeRobotDataset(root=small_dataset)
    everything = {reference.locate(i) for i in range(len(reference))}
    assert per_rank[0] | per_rank[1] == everything


def _stream(dataset, *flags, record, **kwargs):
    base = [sys.executable, "-m", "lerobot_nodes.cli.main", "stream", f"--dataset.root={dataset}", "--batch_size=4"]
    return subprocess.Popen([*base, *flags, f"--record={record}", "--quiet"], **kwargs)


def _records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_sigkill_after_a_checkpoint_then_resume_is_exact(small_dataset, tmp_path, num_workers):
    steps = 30
    common = (f"--num_workers={num_workers}", "--seed=7", "--dataset.streaming_episode_pool_size=2")
    reference = tmp_path / "reference.jsonl"
    assert _stream(small_dataset, *common, f"--steps={steps}", record=reference).wait(timeout=300) == 0
    checkpoint = tmp_path / "checkpoint.pt"
    interrupted = tmp_path / "interrupted.jsonl"
    kill_after = random.Random(num_workers).randrange(8, 24)
    process = _stream(
        small_dataset, *common, f"--steps={steps}", "--checkpoint-every=3", f"--save-checkpoint={checkpoint}",
        record=interrupted, start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if interrupted.exists() and len(interrupted.read_text().splitlines()) >= kill_after:
            break
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    import torch

    saved_step = torch.load(checkpoint, weights_only=False)["step"]
    assert 3 <= saved_step < steps
    kept = [r for r in _records(interrupted) if r["step"] <= saved_step]
    resumed = tmp_path / "resumed.jsonl"
    resumed.write_text("".join(json.dumps(r) + "\n" for r in kept))
    assert _stream(small_dataset, *common, f"--steps={steps}", f"--resume={checkpoint}", record=resumed).wait(300) == 0
    assert _records(resumed) == _records(reference), f"killed after step {kill_after}, resumed from {saved_step}"


def test_flags_are_parsed_like_lerobot():
    dataset, streaming, training, rest = split_flags(
        [
            "--dataset.streaming_episode_pool_size=16",
            "--dataset.streaming_sampling_strategy=round_robin",
            "--dataset.streaming_byte_budget_gb=0.5",
            "--dataset.video_decoder_cache_size=null",
            "--dataset.episodes=[0, 2]",
            "--seed=null",
            "--batch_size=32",
            "--other",
        ]
    )
    config = StreamingConfig(**streaming)
    assert config.streaming_episode_pool_size == 16 and config.streaming_sampling_strategy == "round_robin"
    assert config.streaming_byte_budget_gb == 0.5 and config.video_decoder_cache_size is None
    assert dataset == {"episodes": [0, 2]} and training == {"seed": None, "batch_size": 32} and rest == ["--other"]


@pytest.mark.parametrize(
    "flag,message",
    [
        ("--dataset.streaming_episode_pool_size=0", r"streaming_episode_pool_size must be >= 1"),
        ("--dataset.streaming_byte_budget_gb=0", r"streaming_byte_budget_gb must be a finite number > 0"),
        ("--dataset.streaming_sampling_strategy=random", r"must be one of remaining, round_robin"),
        ("--dataset.streaming_decode_threads=two", r"not a valid int"),
        ("--dataset.streaming_pool=3", r"unknown flag --dataset.streaming_pool"),
    ],
)
def test_impossible_values_are_named(flag, message):
    with pytest.raises(ConfigError, match=message):
        StreamingConfig(**split_flags([flag])[1])


def test_stream_and_inspect_commands(small_dataset, capsys):
    assert cli_main(["stream", f"--dataset.root={small_dataset}", "--steps=3", "--batch_size=2", "--num_workers=0"]) == 0
    out = capsys.readouterr().out
    assert "batch wait p95 (ms)" in out and "refill stalls" in out and "MB fetched / planned" in out
    assert cli_main(["inspect", f"--dataset.root={small_dataset}"]) == 0
    out = capsys.readouterr().out
    assert "MP4 sidecar: " in out and "episodes: 7" in out


def test_map_style_reading_prints_the_same_summary_and_report(small_dataset, capsys):
    flags = [f"--dataset.root={small_dataset}", "--steps=3", "--batch_size=2", "--num_workers=0"]
    assert cli_main(["stream", *flags, "--dataset.streaming=false"]) == 0
    out = capsys.readouterr().out
    assert "episodes: 7" in out and "map-style" in out
    assert "end of run" in out and "batch wait p95 (ms)" in out and re.search(r"\nbatches +3\n", out)
