"""What DataLoader workers log reaches the terminal of ``lerobot-nodes stream``, tagged with the worker."""

from __future__ import annotations

import re

from lerobot_nodes.testing import write_dataset

from .cli_process import run_cli


def test_worker_log_lines_print_in_the_training_process(tmp_path, unwritable_home):
    # With a cache nobody can write, each worker indexes its videos again and says so (INFO):
    # lines a spawned worker used to drop, having no logging configuration of its own.
    dataset = write_dataset(tmp_path / "dataset", episode_lengths=[9, 12, 7, 10], seed=2)
    result = run_cli(
        "stream", f"--dataset.root={dataset}", "--num_workers=2", "--steps=2", "--batch_size=2",
        env={"HF_LEROBOT_HOME": str(unwritable_home)},
    )
    assert result.returncode == 0, result.stderr
    # (the progress bar redraws with carriage returns: split on those too)
    relayed = [line for line in re.split(r"[\r\n]", result.stderr) if re.search(r"\[worker [01]\] building MP4 sample indexes", line)]
    assert {re.search(r"\[worker (\d)\]", line).group(1) for line in relayed} == {"0", "1"}, result.stderr
    # Logged once, by the training process's handler: neither the worker's own stderr nor a
    # second handler (propagation past the progress bar's redirect) prints it again.
    assert all(result.stderr.count(line.split(": ", 1)[1]) == 1 for line in relayed), result.stderr
    assert all(re.match(r"^\d{4}-\d\d-\d\d [\d:,]+ INFO lerobot_nodes\.sidecar\S*: \[worker", line) for line in relayed), relayed
    assert "Traceback" not in result.stderr
