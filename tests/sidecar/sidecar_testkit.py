"""Helpers of the sidecar tests: dataset copies, and a client of ``sidecar_zygote.py`` that starts
real worker processes cheaply, kills them and reads their results."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ZYGOTE_SCRIPT = Path(__file__).with_name("sidecar_zygote.py")


def copy_dataset(source: Path, target: Path) -> Path:
    """A writable copy of a dataset (the session datasets are shared by many tests)."""
    shutil.copytree(source, target)
    return target


class Zygote:
    """One warm interpreter that forks a fresh OS process per task."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._stderr = open(workdir / "zygote.stderr", "wb")  # noqa: SIM115 - lives as long as the zygote
        self._process = subprocess.Popen(
            [sys.executable, str(ZYGOTE_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        ready = self._read()
        assert "ready" in ready, ready
        self._counter = 0

    def _send(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()
        return self._read()

    def _read(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote died; see {self.workdir / 'zygote.stderr'}")
        return json.loads(line)

    def fork(self, task: str, **args: Any) -> tuple[int, Path, Path]:
        """Start ``task`` in a new process; return its pid, result file and log file."""
        self._counter += 1
        result = self.workdir / f"result-{self._counter}.json"
        log = self.workdir / f"log-{self._counter}.txt"
        args = {"result": str(result), "log": str(log), **args}
        pid = int(self._send({"op": "fork", "task": task, "args": args})["pid"])
        return pid, result, log

    def wait(self, pid: int) -> int:
        """Reap ``pid``; its exit code (negative: the signal that ended it)."""
        return int(self._send({"op": "wait", "pid": pid})["exit"])

    def kill(self, pid: int) -> int:
        os.kill(pid, signal.SIGKILL)
        return self.wait(pid)

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, RuntimeError, json.JSONDecodeError):
            self._send({"op": "exit"})
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
        self._stderr.close()


def read_result(path: Path, timeout_s: float = 60.0) -> dict[str, Any]:
    """The JSON a child wrote (waits for it to appear)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no result at {path} after {timeout_s} s")
        time.sleep(0.01)
    return json.loads(path.read_text())


def mapping_stats(pid: int, file_path: Path) -> dict[str, int]:
    """Summed ``/proc/<pid>/smaps`` fields (kB) of every mapping of ``file_path`` in ``pid``."""
    target = str(file_path)
    totals: dict[str, int] = {}
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            inside = len(fields) >= 6 and fields[5] == target
            continue
        if inside and fields and fields[0].endswith(":") and len(fields) >= 2 and fields[1].isdigit():
            totals[fields[0][:-1]] = totals.get(fields[0][:-1], 0) + int(fields[1])
    return totals
