"""Process limits (open files, address space) end a command with one line, and SIGTERM always ends it.

Real limits set with ``setrlimit`` in the child before it starts (as ``ulimit`` does), real
signals, a real C-level deadlock for the watchdog.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lerobot_nodes.cli.limits import open_files_needed

from .cli_process import assert_one_line_error, run_cli


def _open_files(soft: int, hard: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


def test_an_open_file_limit_too_low_for_the_workers_is_one_line_before_any_worker(tiny_dataset: Path) -> None:
    limit = open_files_needed(2) - 8
    result = run_cli(
        "stream", "--dataset.root", tiny_dataset, "--steps", "2", "--num_workers", "2",
        preexec_fn=_open_files(limit, limit), timeout=180,
    )
    error = assert_one_line_error(result, 2, f"the open-file limit is {limit} (ulimit -n)")
    assert "--num_workers=1" in error and "ulimit -n 4096" in error


def test_a_low_soft_open_file_limit_is_raised_and_the_command_streams(tiny_dataset: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < open_files_needed(2):
        pytest.fail(f"this machine's hard open-file limit ({hard}) is below what the test needs")
    result = run_cli(
        "stream", "--dataset.root", tiny_dataset, "--steps", "2", "--num_workers", "2", "--batch_size", "4",
        preexec_fn=_open_files(24, hard), timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def _peak_address_space_of_cli_import() -> int:
    """Bytes of address space a process holds once it has imported the command line (no torch yet)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import lerobot_nodes.cli.main\n"
         "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmPeak')][0])"],
        capture_output=True, text=True, check=True, timeout=120,
    )
    return int(probe.stdout.strip()) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to size the limit")
def test_an_address_space_limit_is_one_line_that_names_it(tiny_dataset: Path) -> None:
    # Room for the command line, none for torch and the decoders: the stream fails inside a
    # library import or allocation, whatever the library, and must still print one line.
    limit = _peak_address_space_of_cli_import() + 96 * 2**20

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    result = run_cli("stream", "--dataset.root", tiny_dataset, "--steps", "2", preexec_fn=apply, timeout=300)
    error = assert_one_line_error(result, 1, "")
    assert f"ulimit -v {limit // 1024}" in error, error
    assert error.startswith(("error: out of memory", "error: cannot start a thread")), error


DEADLOCKED_COMMAND = textwrap.dedent(
    """
    import ctypes, sys
    from lerobot_nodes.cli.signals import run_until_stopped

    def deadlock():
        libc = ctypes.CDLL(None)
        mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER, a default mutex
        libc.pthread_mutex_lock(mutex)
        print("ready", flush=True)
        libc.pthread_mutex_lock(mutex)  # relocking a default mutex never returns, signals or not
        return 0

    sys.exit(run_until_stopped(deadlock, "deadlocked-command"))
    """
)


def test_sigterm_ends_a_command_whose_main_thread_is_blocked_in_c() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", DEADLOCKED_COMMAND], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, stderr = process.communicate(timeout=60)
        waited = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "deadlocked-command: stopped by SIGTERM (the command did not end within 5 s" in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert waited >= 4.5  # the watchdog gave the command its grace period before ending it


def test_a_command_that_ends_on_sigterm_by_itself_is_not_cut_short() -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from lerobot_nodes.cli.signals import Stopped, run_until_stopped

        def command():
            print("ready", flush=True)
            try:
                time.sleep(60)
            except Stopped:
                time.sleep(2)  # a shutdown that takes a while, within the grace period
                print("cleaned up", flush=True)
                raise
            return 0

        sys.exit(run_until_stopped(command, "slow-cleanup"))
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "cleaned up" in stdout
    assert stderr.strip() == "slow-cleanup: stopped by SIGTERM", stderr


def _mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True, timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="a full disk is a tiny tmpfs, and mounting one needs root")
def test_the_demo_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    disk = tmp_path / "full"
    _mount_tmpfs(disk, "size=64k")
    try:
        result = run_cli("stream", "--steps", "2", env={"HF_LEROBOT_HOME": str(disk / "home")}, timeout=180)
        error = assert_one_line_error(result, 1, f"cannot write the demo dataset to {disk / 'home'}")
        assert "No space left on device" in error and "HF_LEROBOT_HOME" in error
        assert [p for p in disk.rglob("*") if not p.is_dir()] == []
        assert not (disk / "home" / "lerobot-nodes-demo").exists()
    finally:
        subprocess.run(["umount", str(disk)], check=True, timeout=30)


def test_the_demo_in_a_read_only_home_says_the_demo_was_being_written(unwritable_home: Path) -> None:
    home = unwritable_home / "home"
    result = run_cli("stream", "--steps", "2", env={"HF_LEROBOT_HOME": str(home)}, timeout=180)
    error = assert_one_line_error(result, 1, f"cannot write the demo dataset to {home}")
    assert "HF_LEROBOT_HOME" in error
