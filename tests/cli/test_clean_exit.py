"""The console scripts always exit with their own code, never pyarrow's shutdown abort (exit 134)."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import entry_points
from pathlib import Path

from lerobot_nodes.cli import build_sidecar, main

from .cli_process import run_cli

RUNS = 30
"""pyarrow aborted about one run in fifteen: 30 clean runs would all pass by luck with p < 0.13."""


def test_console_scripts_exit_through_exit_process() -> None:
    scripts = {script.name: script for script in entry_points(group="console_scripts")}
    for name, module in [("lerobot-nodes", main), ("lerobot-build-mp4-sidecar", build_sidecar)]:
        assert scripts[name].load() is module.console_script, (
            f"{name} runs {scripts[name].value}: reinstall the package (pip install -e .) to update the script"
        )


def test_every_run_exits_0(tiny_dataset: Path) -> None:
    """``inspect`` reads the dataset's Parquet files with pyarrow: the cheapest command that can hit the race."""
    inspect = ("inspect", f"--dataset.root={tiny_dataset}")
    assert run_cli(*inspect).returncode == 0  # builds the sidecar index once; the runs below only read it

    def run(_: int) -> subprocess.CompletedProcess[str]:
        return run_cli(*inspect)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, range(RUNS)))
    failed = [(r.returncode, r.stderr.strip().splitlines()[-1:]) for r in results if r.returncode != 0]
    assert not failed, f"{len(failed)} of {RUNS} runs failed: {failed}"
    assert all("episodes: 4" in r.stdout for r in results)
