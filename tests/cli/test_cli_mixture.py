"""``lerobot-nodes stream`` over a mixture: LeRobot's list flags, the record, the report, exact resume.

Two generated datasets (AV1 with cameras ``top``/``wrist``, H.264 whose top camera is named ``front``
and the rename map aligns), each streamed in a new process as the console script runs it.
"""

from __future__ import annotations

import collections
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

from lerobot_nodes.cli.flags import split_flags, split_streaming_flags
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.testing import write_dataset

from .cli_process import assert_one_line_error, run_cli

NAMES = ["local/mix-av1", "local/mix-h264"]
RENAME = {"local/mix-h264": {"observation.images.front": "observation.images.top"}}
LENGTHS = ([12, 9, 8], [10, 7, 11, 6])
STEPS = 8


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("cli-mixture")
    return [
        write_dataset(folder / "av1", episode_lengths=LENGTHS[0], seed=1),
        write_dataset(
            folder / "h264",
            episode_lengths=LENGTHS[1],
            codec="h264",
            cameras=("observation.images.front", "observation.images.wrist"),
            seed=2,
        ),
    ]


def _stream(roots: list[Path], record: Path, *flags: str):
    return run_cli(
        "stream",
        f"--dataset.repo_id={json.dumps(NAMES)}",
        f"--dataset.root={json.dumps([str(root) for root in roots])}",
        f"--dataset.streaming_rename_map={json.dumps(RENAME)}",
        "--batch_size=4",
        "--num_workers=2",
        "--seed=7",
        "--window=none",
        "--dataset.streaming_episode_pool_size=2",
        f"--record={record}",
        *flags,
    )


def _samples(path: Path) -> list[list[int]]:
    return [sample for line in path.read_text().splitlines() for sample in json.loads(line)["samples"]]


def test_an_epoch_records_each_frame_of_each_dataset_once_and_reports_samples_per_dataset(roots, tmp_path):
    record = tmp_path / "epoch.jsonl"
    total = sum(map(sum, LENGTHS))
    # 63 frames: two workers' batches of 4 (each worker's last one shorter) make at least 16 batches an epoch.
    result = _stream(roots, record, "--steps=15")
    assert result.returncode == 0, result.stderr[-3000:]
    samples = _samples(record)
    assert all(len(sample) == 3 for sample in samples)  # [dataset_index, episode, frame]
    assert len(samples) == len(set(map(tuple, samples)))
    every = {(d, e, f) for d, lengths in enumerate(LENGTHS) for e, n in enumerate(lengths) for f in range(n)}
    assert set(map(tuple, samples)) <= every and len(samples) >= total - 2 * 4
    counts = collections.Counter(sample[0] for sample in samples)
    assert "Mixture of 2 LeRobot datasets" in result.stdout
    for index, name in enumerate(NAMES):
        assert re.search(rf"samples from \[{index}\] {re.escape(name)} +{counts[index]}\n", result.stdout), (
            result.stdout
        )


def test_resume_of_a_mixture_checkpoint_continues_sample_for_sample(roots, tmp_path):
    whole = tmp_path / "whole.jsonl"
    assert _stream(roots, whole, f"--steps={STEPS}", "--quiet").returncode == 0
    checkpoint = tmp_path / "checkpoint.pt"
    parts = tmp_path / "parts.jsonl"
    first = _stream(roots, parts, "--steps=3", f"--save-checkpoint={checkpoint}", "--quiet")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = _stream(roots, parts, f"--steps={STEPS}", f"--resume={checkpoint}", "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _samples(parts) == _samples(whole)
    assert {sample[0] for sample in _samples(whole)} == {0, 1}


def test_a_checkpoint_of_another_mixture_is_refused(roots, tmp_path):
    checkpoint = tmp_path / "checkpoint.pt"
    saved = _stream(roots, tmp_path / "a.jsonl", "--steps=2", f"--save-checkpoint={checkpoint}", "--quiet")
    assert saved.returncode == 0, saved.stderr[-3000:]
    result = run_cli(
        "stream",
        f"--dataset.root={roots[0]}",
        "--batch_size=4",
        "--num_workers=2",
        "--steps=4",
        "--dataset.streaming_episode_pool_size=2",
        f"--resume={checkpoint}",
    )
    assert_one_line_error(result, 2, "cannot resume: the checkpoint was taken on another dataset")


def test_a_list_flag_is_json_and_bad_json_is_one_line_naming_the_flag(roots):
    dataset, _, _, rest = split_flags(
        [
            '--dataset.repo_id=["OWNER/A","OWNER/B"]',
            "--dataset.root",
            '["/a", "/b"]',
            '--dataset.revision=[null,"v3.0"]',
            '--dataset.streaming_rename_map={"OWNER/B": {"observation.images.front": "observation.images.top"}}',
        ]
    )
    assert dataset == {
        "repo_id": ["OWNER/A", "OWNER/B"],
        "root": ["/a", "/b"],
        "revision": [None, "v3.0"],
        "streaming_rename_map": {"OWNER/B": {"observation.images.front": "observation.images.top"}},
    }
    assert rest == []
    assert split_flags(["--dataset.repo_id=OWNER/A"])[0] == {"repo_id": "OWNER/A"}
    with pytest.raises(ConfigError, match=r"^--dataset.repo_id='\[\"OWNER/A\",' is not a valid JSON list: "):
        split_flags(['--dataset.repo_id=["OWNER/A",'])
    with pytest.raises(ConfigError, match=r"^--dataset.root='\[1, 2\]' must be a JSON list of strings"):
        split_flags(["--dataset.root=[1, 2]"])
    with pytest.raises(ConfigError, match=r"^--dataset.streaming_rename_map="):
        split_flags(['--dataset.streaming_rename_map={"OWNER/B": ["x"]}'])
    # The trainer's command line: the rename map is taken out, LeRobot's own list spelling stays for LeRobot.
    taken, rest = split_streaming_flags(
        ['--dataset.repo_id=["A","B"]', '--dataset.streaming_rename_map={"B": {}}']
    )
    assert taken == {"streaming_rename_map": {"B": {}}} and rest == ['--dataset.repo_id=["A","B"]']
    result = run_cli("stream", f'--dataset.root=["{roots[0]}", {roots[1]}]', "--steps=1")
    assert_one_line_error(result, 2, "--dataset.root=")


def test_a_rename_map_without_a_mixture_and_a_map_style_mixture_are_one_line(roots):
    result = run_cli(
        "stream", f"--dataset.root={roots[0]}", "--steps=1", '--dataset.streaming_rename_map={"a": {}}'
    )
    assert_one_line_error(result, 2, "rename_map applies to a mixture")
    result = run_cli(
        "stream",
        f"--dataset.root={json.dumps([str(root) for root in roots])}",
        "--steps=1",
        "--dataset.streaming=false",
    )
    assert_one_line_error(result, 2, "--dataset.streaming=false reads one dataset map-style")


def _weighted(roots: list[Path], record: Path, *flags: str, **popen: object) -> subprocess.Popen[bytes]:
    """``stream`` of the weighted mixture [0.7, 0.3] as a console-script process (killable)."""
    return subprocess.Popen(
        [
            sys.executable, "-m", "lerobot_nodes.cli.main", "stream",
            f"--dataset.repo_id={json.dumps(NAMES)}",
            f"--dataset.root={json.dumps([str(root) for root in roots])}",
            f"--dataset.streaming_rename_map={json.dumps(RENAME)}",
            "--dataset.streaming_weights=[0.7,0.3]",
            "--batch_size=4", "--num_workers=2", "--seed=7", "--window=none",
            "--dataset.streaming_episode_pool_size=2", f"--record={record}", "--quiet", *flags,
        ],
        **popen,  # type: ignore[call-overload]
    )


def _steps(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sigkill_of_a_weighted_mixture_then_resume_continues_identically(roots, tmp_path):
    steps = 40  # 160 samples: the 63-frame union streams past its size (each dataset in its own epochs)
    reference = tmp_path / "reference.jsonl"
    assert _weighted(roots, reference, f"--steps={steps}").wait(timeout=300) == 0
    counts = collections.Counter(sample[0] for sample in _samples(reference))
    assert abs(counts[0] / (steps * 4) - 0.7) < 0.05  # the weights, not the frames' shares (35 / 63)
    checkpoint = tmp_path / "checkpoint.pt"
    interrupted = tmp_path / "interrupted.jsonl"
    kill_after = random.Random(3).randrange(10, 30)
    process = _weighted(
        roots, interrupted, f"--steps={steps}", "--checkpoint-every=4", f"--save-checkpoint={checkpoint}",
        start_new_session=True,
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
    assert 4 <= saved_step < steps
    resumed = tmp_path / "resumed.jsonl"
    resumed.write_text("".join(json.dumps(r) + "\n" for r in _steps(interrupted) if r["step"] <= saved_step))
    again = _weighted(roots, resumed, f"--steps={steps}", f"--resume={checkpoint}")
    assert again.wait(timeout=300) == 0
    assert _steps(resumed) == _steps(reference), f"killed after step {kill_after}, resumed from {saved_step}"
    other = run_cli(
        "stream", f"--dataset.repo_id={json.dumps(NAMES)}", f"--dataset.root={json.dumps([str(r) for r in roots])}",
        f"--dataset.streaming_rename_map={json.dumps(RENAME)}", "--dataset.streaming_weights=[0.5,0.5]",
        "--batch_size=4", "--num_workers=2", "--seed=7", "--window=none", "--dataset.streaming_episode_pool_size=2",
        f"--steps={steps}", f"--resume={checkpoint}",
    )
    assert_one_line_error(other, 2, "cannot resume: the checkpoint was taken on another dataset")
    assert "--dataset.streaming_weights" in other.stderr


def test_bad_weights_are_one_line_naming_the_flag(roots):
    mixture = [f"--dataset.root={json.dumps([str(root) for root in roots])}", "--steps=1"]
    for value, message in (
        ("[0.7,0.2,0.1]", "--dataset.streaming_weights has 3 weight(s) but the mixture has 2"),
        ("[1,-1]", "--dataset.streaming_weights must be a JSON list of positive finite numbers"),
        ("[0.7,", "--dataset.streaming_weights='[0.7,' is not a valid"),
    ):
        assert_one_line_error(run_cli("stream", *mixture, f"--dataset.streaming_weights={value}"), 2, message)
    single = run_cli("stream", f"--dataset.root={roots[0]}", "--steps=1", "--dataset.streaming_weights=[1,1]")
    assert_one_line_error(single, 2, "--dataset.streaming_weights (weights=) weighs the datasets of a mixture")
