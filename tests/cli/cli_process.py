"""Run the console scripts as real processes and check the shape of what they print."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

MODULES = {"lerobot-nodes": "lerobot_nodes.cli.main", "lerobot-build-mp4-sidecar": "lerobot_nodes.cli.build_sidecar"}
ABORTING_EXIT_HANDLER = """
import ctypes, runpy
libc = ctypes.CDLL(None)
# Registered first, so it runs last when exit() runs the C/C++ exit handlers: abort, exit 134.
libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)
runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
"""
"""``python -m MODULE`` in a process whose C/C++ exit handlers abort, as pyarrow's sometimes do."""


def run_cli(
    *args: str | Path,
    command: str = "lerobot-nodes",
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    timeout: float = 300,
    abort_at_exit: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``command ARGS`` in a new Python process, as its console script runs it (``python -m`` its module).

    ``abort_at_exit``: the process aborts if it reaches the C/C++ exit handlers (ABORTING_EXIT_HANDLER).
    """
    module = MODULES[command]
    start = ["-c", ABORTING_EXIT_HANDLER.format(module=module)] if abort_at_exit else ["-m", module]
    return subprocess.run(
        [sys.executable, *start, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        preexec_fn=preexec_fn,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], exit_code: int, message: str) -> str:
    """stderr ends with ``error: <message>...`` (plus at most one ``hint:`` line), with no traceback."""
    assert result.returncode == exit_code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    after = lines[errors[0] + 1 :]
    assert len(after) <= 1 and all(line.startswith("hint: ") for line in after), result.stderr
    error = lines[errors[0]]
    assert error.startswith(f"error: {message}"), error
    return error
