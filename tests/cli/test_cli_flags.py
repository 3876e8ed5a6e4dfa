"""``lerobot-nodes`` flags: both spellings, impossible values named, help derived from the flag table."""

from __future__ import annotations

import json
import subprocess
import typing
import warnings
from dataclasses import fields
from pathlib import Path

import pytest

from lerobot_nodes.cli.flags import (
    DATASET_FLAGS,
    STREAMING_FLAGS,
    TRAINING_FLAGS,
    Flag,
    format_value,
    split_flags,
)
from lerobot_nodes.cli.main import main
from lerobot_nodes.config import StreamingConfig

from .cli_process import assert_one_line_error, run_cli

EVERY_FLAG = (*DATASET_FLAGS, *STREAMING_FLAGS, *TRAINING_FLAGS)
EXAMPLES = {"episodes": "[0, 2]", "delta_timestamps": '{"action": [0.0, 0.1]}', "streaming_sampling_strategy": "round_robin",
            "streaming_rename_map": '{"OWNER/B": {"observation.images.front": "observation.images.top"}}',
            "streaming_weights": "[0.7, 0.3]"}
EXAMPLES_BY_TYPE = {bool: "false", int: "3", float: "0.5", str: "text"}


def _example(flag: Flag) -> str:
    """A valid value of ``flag``, as typed."""
    if flag.key in EXAMPLES:
        return EXAMPLES[flag.key]
    kind = next(option for option in typing.get_args(flag.kind) or (flag.kind,) if option is not type(None))
    return EXAMPLES_BY_TYPE[kind]


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """``main(args)`` in this process, shaped like a finished subprocess."""
    code = main(args)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


@pytest.mark.parametrize("flag", EVERY_FLAG, ids=lambda flag: flag.name)
def test_flag_space_value_equals_flag_equals_value(flag: Flag) -> None:
    value = _example(flag)
    assert split_flags([f"{flag.option}={value}", "--quiet"]) == split_flags([flag.option, value, "--quiet"])
    parsed = split_flags([flag.option, value])
    assert flag.key in {**parsed[0], **parsed[1], **parsed[2]} and parsed[3] == []


def test_stream_runs_with_space_separated_values(tiny_dataset: Path, tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    result = run_cli(
        "stream", "--dataset.root", tiny_dataset, "--steps", "3", "--batch_size", "2", "--num_workers", "0",
        "--dataset.episodes", "[1, 3]", "--window", "none", "--record", record, "--quiet",
    )
    assert result.returncode == 0, result.stderr
    steps = [json.loads(line) for line in record.read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert {episode for s in steps for episode, _ in s["samples"]} <= {1, 3}


@pytest.mark.parametrize(
    "args,message",
    [
        (["--batch_size=0"], "--batch_size must be >= 1, got 0"),
        (["--batch_size=-4"], "--batch_size must be >= 1, got -4"),
        (["--num_workers=-1"], "--num_workers must be >= 0, got -1"),
        (["--steps=-1"], "--steps must be >= 1, got -1"),
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--log_freq=-2"], "--log_freq must be >= 0, got -2"),
        (["--dataset.tolerance_s=-1"], "--dataset.tolerance_s must be >= 0, got -1"),
        (["--dataset.tolerance_s=nan"], "--dataset.tolerance_s must be >= 0, got nan"),
        (["--dataset.episodes=[\"a\"]"], "--dataset.episodes='[\"a\"]' is not a valid list[int]"),
        (["--dataset.delta_timestamps={\"action\": 0.1}"], "--dataset.delta_timestamps="),
        (["--dataset.streaming_episode_pool_size=0"], "--dataset.streaming_episode_pool_size must be >= 1, got 0"),
        (["--dataset.streaming_index_concurrency=0"], "--dataset.streaming_index_concurrency must be >= 1, got 0"),
        (["--dataset.pool=3"], "unknown flag --dataset.pool; the --dataset.* flags are:"),
        (["--dataset.rooot=/data"], "unknown flag --dataset.rooot; did you mean --dataset.root? The --dataset.* flags"),
        (["--steps"], "--steps needs a value: --steps=VALUE or --steps VALUE"),
        (["--batch_size", "--steps=2"], "--batch_size needs a value"),
        (["--checkpoint-every=0", "--save-checkpoint=c.pt"], "argument --checkpoint-every: must be an integer >= 1"),
        (["--checkpoint-every=2"], "--checkpoint-every needs --save-checkpoint=PATH"),
        (["--window=transformer"], "argument --window: invalid choice: 'transformer'"),
        (["--unknown=1"], "unrecognized arguments: --unknown=1"),
    ],
)
def test_impossible_values_are_config_errors_naming_the_flag(
    args: list[str], message: str, tiny_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_main(["stream", f"--dataset.root={tiny_dataset}", *args], capsys)
    assert_one_line_error(result, 2, message)
    assert result.stderr.splitlines()[-1] == "hint: lerobot-nodes stream --help lists every flag"


def test_mistakes_found_when_the_dataset_is_opened_are_config_errors(
    tiny_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Episodes and windows are checked against the dataset: still usage errors, exit code 2."""
    root = f"--dataset.root={tiny_dataset}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, by the error: no warning naming [99] before it
        result = run_main(["stream", root, "--dataset.episodes=[99]", "--steps=1"], capsys)
    assert_one_line_error(result, 2, "no episode selected: [99] has no episode of")
    result = run_main(["stream", root, '--dataset.delta_timestamps={"no.such.key": [0]}', "--steps=1"], capsys)
    assert_one_line_error(result, 2, "delta_timestamps names keys that are not features of")
    result = run_main(["stream", root, '--dataset.delta_timestamps={"action": [0.01]}', "--steps=1"], capsys)
    assert_one_line_error(result, 2, "The following delta_timestamps are found outside of tolerance range.")


def test_resume_from_a_file_that_is_not_a_checkpoint(
    tiny_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    result = run_main(["stream", f"--dataset.root={tiny_dataset}", f"--resume={tmp_path / 'notes.txt'}"], capsys)
    assert_one_line_error(
        result, 2, f"--resume={tmp_path / 'notes.txt'} is neither a checkpoint saved by --save-checkpoint nor LeRobot's training_step.json"
    )


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--help"], ["-h"]):
        result = run_main(args, capsys)
        assert result.returncode == 0
        assert all(f"    {command} " in result.stdout for command in ("stream", "inspect", "demo")), result.stdout
        assert "--debug" in result.stdout


def test_stream_help_lists_every_dataset_flag_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_main(["stream", "--help"], capsys)
    assert result.returncode == 0
    lines = result.stdout.splitlines()

    def line_of(option: str) -> str:
        matching = [line for line in lines if line.startswith(f"  {option} ")]
        assert len(matching) == 1, f"{option} is not listed once in stream --help"
        return matching[0]

    for field in fields(StreamingConfig):
        if field.name != "max_num_shards":
            assert f"default: {format_value(field.default)}" in line_of(f"--dataset.{field.name}")
    for option, default in [
        ("--dataset.root", "the built-in demo dataset"),
        ("--dataset.episodes", "null (all episodes)"),
        ("--dataset.delta_timestamps", "null (from --window)"),
        ("--dataset.tolerance_s", "0.0001"),
        ("--dataset.streaming", "true"),
        ("--batch_size", "8"),
        ("--num_workers", "2"),
        ("--steps", "50"),
        ("--seed", "1000"),
    ]:
        assert f"default: {default}" in line_of(option)
    text = " ".join(result.stdout.split())
    assert "is not given (default: act)" in text
    assert "act: action at frames +0..+49, each camera at frame +0" in text


def test_inspect_rejects_flags_it_does_not_use(tiny_dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = f"--dataset.root={tiny_dataset}"
    assert_one_line_error(run_main(["inspect", root, "--bogus=1"], capsys), 2, "unrecognized arguments: --bogus=1")
    result = run_main(["inspect", root, "--steps", "3", "--dataset.streaming_decode_threads=1"], capsys)
    assert_one_line_error(
        result, 2, "inspect does not take --dataset.streaming_decode_threads, --steps; its flags are --dataset.root"
    )
    result = run_main(["inspect", "--dataset.root", str(tiny_dataset)], capsys)
    assert result.returncode == 0 and "episodes: 4" in result.stdout


def test_demo_takes_the_root_flag_every_other_command_spells(tiny_dataset) -> None:
    spelled = run_cli("demo", "--dataset.root", tiny_dataset, "--samples", "1", timeout=180)
    short = run_cli("demo", "--root", tiny_dataset, "--samples", "1", timeout=180)
    assert spelled.returncode == 0 and short.returncode == 0, spelled.stderr + short.stderr
    samples = [out.rpartition("read 1 sample in")[0] for out in (spelled.stdout, short.stdout)]  # then its time
    assert str(tiny_dataset) in samples[0] and samples[0] == samples[1]
