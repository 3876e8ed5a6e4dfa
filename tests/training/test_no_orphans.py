"""No orphans: when a training process dies, every process it started and its shared memory go too.

Real processes and real signals: a streaming run (the ``stream`` command, or a user's own
script) is started in its own session and left to stream; then its process tree is
recorded from ``/proc`` (children recursively: the workers' server and the workers; plus a
stdlib forkserver and the resource tracker, found by command line in its session), the training process alone gets the signal (as
``kill``, SLURM and ``docker stop`` send it), and every recorded process must be gone within
5 s, with no ``/dev/shm`` segment of the run left behind. Linux only, like ``/proc``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader
from lerobot_nodes.loader import shutdown_dataloader
from lerobot_nodes.workers.lifeline import guard_forkserver, guard_worker

SCRIPTS = Path(__file__).parent / "scripts"
SHM = Path("/dev/shm")
GONE_WITHIN_S = 5.0
STARTUP_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class Proc:
    """A process, told apart from a later one with a recycled pid by its start time."""

    pid: int
    parent: int
    started: str
    command: str

    @property
    def role(self) -> str:
        if "multiprocessing.forkserver" in self.command:
            return "forkserver"
        if "multiprocessing.resource_tracker" in self.command:
            return "resource tracker"
        return "python"


def _stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the command name (state first), or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _all_processes() -> dict[int, list[str]]:
    processes = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[0] != "Z":
                processes[int(entry)] = fields
    return processes


def process_tree(root: int) -> dict[int, Proc]:
    """``root``, its descendants, and its session's forkserver and resource tracker."""
    processes = _all_processes()
    children: dict[int, list[int]] = {}
    for pid, fields in processes.items():
        children.setdefault(int(fields[1]), []).append(pid)
    found, stack = set(), [root]
    while stack:
        pid = stack.pop()
        if pid in processes and pid not in found:
            found.add(pid)
            stack += children.get(pid, [])
    for pid, fields in processes.items():  # fields[3] is the session id
        if int(fields[3]) == root and any(name in _command(pid) for name in ("forkserver", "resource_tracker")):
            found.add(pid)
    # fields[19] is the start time: with the pid it names one process for good.
    return {pid: Proc(pid, int(processes[pid][1]), processes[pid][19], _command(pid)) for pid in found}


def worker_server(root: int, tree: dict[int, Proc]) -> Proc:
    """The process the workers were forked from: the training process's fork
    (``lerobot_nodes.workers.server``, role "python") or a stdlib forkserver."""
    servers = [p for p in tree.values() if p.parent == root and any(q.parent == p.pid for q in tree.values())]
    assert len(servers) == 1, tree
    return servers[0]


def is_gone(proc: Proc) -> bool:
    fields = _stat(proc.pid)
    return fields is None or fields[0] == "Z" or fields[19] != proc.started


def mapped_segments(tree: dict[int, Proc]) -> set[str]:
    """Names of the ``/dev/shm`` files the processes map (unlinked ones have no name to leak)."""
    names = set()
    for pid in tree:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            path = line.split(maxsplit=5)[5] if len(line.split(maxsplit=5)) == 6 else ""
            if path.startswith(f"{SHM}/") and not path.endswith("(deleted)"):
                names.add(path.removeprefix(f"{SHM}/"))
    return names


def shm_names() -> set[str]:
    return set(os.listdir(SHM))


def leftovers(tree: dict[int, Proc], segments: set[str]) -> list[str]:
    """What of the run still exists: live processes, its named segments, torch tensors' segments."""
    alive = [f"{proc.role} {proc.pid}" for proc in tree.values() if not is_gone(proc)]
    present = shm_names()
    torch_prefixes = tuple(f"torch_{pid}_" for pid in tree)  # torch names its segments after the creator
    return alive + sorted(segments & present) + sorted(n for n in present if n.startswith(torch_prefixes))


def thread_states(tree: dict[int, Proc]) -> str:
    """Each live process's threads with their state and kernel wait channel: where a run that
    outlived its budget was waiting (read from /proc, for the failure message)."""
    lines = []
    for proc in tree.values():
        if is_gone(proc):
            continue
        lines.append(f"{proc.role} {proc.pid}:")
        try:
            tasks = sorted(os.listdir(f"/proc/{proc.pid}/task"), key=int)
        except OSError:
            continue
        for tid in tasks:
            try:
                name = Path(f"/proc/{proc.pid}/task/{tid}/comm").read_text().strip()
                wchan = Path(f"/proc/{proc.pid}/task/{tid}/wchan").read_text().strip()
                state = Path(f"/proc/{proc.pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            lines.append(f"  {tid} {name} {state} {wchan}")
    return "\n".join(lines)


def dump_python_stacks(tree: dict[int, Proc]) -> None:
    """Ask each live process of the run for its threads' Python stacks (``lerobot-nodes`` prints
    them to its stderr on SIGUSR2, workers included), and give them a moment to print."""
    for proc in tree.values():
        if proc.role == "python" and not is_gone(proc):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGUSR2)
            time.sleep(0.5)  # one at a time: dumps printed at once interleave in the shared stderr


def wait_until_streaming(process: subprocess.Popen, record: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not (record.exists() and record.read_text().count("\n") >= 3):
        assert process.poll() is None, f"the run ended before streaming (exit {process.returncode})"
        assert time.monotonic() < deadline, "no batch within the startup timeout"
        time.sleep(0.05)


@dataclass
class Run:
    """A streaming run caught mid-stream: its process tree and the shared memory it created."""

    process: subprocess.Popen
    tree: dict[int, Proc]
    segments: set[str]
    stderr: Path

    def signal_and_wait(self, signum: int) -> list[str]:
        """Signal the training process; what of the run is left after GONE_WITHIN_S (empty if all gone)."""
        os.kill(self.process.pid, signum)
        deadline = time.monotonic() + GONE_WITHIN_S
        while True:
            self.process.poll()  # reap it, so it does not linger as our zombie
            left = leftovers(self.tree, self.segments)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.02)


def start(command: list[str], record: Path, tmp_path: Path, server_role: str = "python") -> Run:
    before = shm_names()
    stderr = tmp_path / "stderr.txt"
    with open(stderr, "w") as err:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        wait_until_streaming(process, record)
        tree = process_tree(process.pid)
        server = worker_server(process.pid, tree)
        assert server.role == server_role, tree
        workers = [proc for proc in tree.values() if proc.parent == server.pid]
        others = sorted(proc.role for proc in tree.values() if proc not in (server, *workers))
        # trainer, server, resource tracker, and two workers forked by the server
        assert len(workers) == 2 and others == ["python", "resource tracker"], tree
        segments = mapped_segments(tree) - before
        assert any(name.startswith("psm_") for name in segments), segments  # the metrics counters
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return Run(process, tree, segments, stderr)


def stream_command(dataset: Path, record: Path) -> list[str]:
    return [
        sys.executable, "-m", "lerobot_nodes.cli.main", "stream", f"--dataset.root={dataset}", "--num_workers=2",
        "--batch_size=4", "--steps=100000", "--dataset.streaming_episode_pool_size=2", f"--record={record}", "--quiet",
    ]  # fmt: skip


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_stream_command_leaves_nothing_behind(small_dataset, tmp_path, signum):
    record = tmp_path / "record.jsonl"
    run = start(stream_command(small_dataset, record), record, tmp_path)
    left = run.signal_and_wait(signum)
    if left:  # where each process waits, and what the run printed, before the group is killed
        states = thread_states(run.tree)
        dump_python_stacks(run.tree)
        os.killpg(run.process.pid, signal.SIGKILL)
        stderr = run.stderr.read_text()[-20000:]
        raise AssertionError(f"{GONE_WITHIN_S} s after {signum.name}: {left}\n{states}\nstderr:\n{stderr}")
    assert run.process.wait(timeout=10) == (-signal.SIGKILL if signum == signal.SIGKILL else 128 + signum)
    if signum != signal.SIGKILL:
        stderr = run.stderr.read_text()
        assert "Traceback" not in stderr, stderr
        last = stderr.splitlines()[-1]
        assert last.startswith(f"lerobot-nodes stream: stopped by {signum.name} after step "), stderr
        assert last.endswith("of 100000; DataLoader workers shut down") and stderr.count("stopped by") == 1


def test_sigusr2_prints_every_threads_stack_and_streaming_goes_on(small_dataset, tmp_path):
    record = tmp_path / "record.jsonl"
    run = start(stream_command(small_dataset, record), record, tmp_path)
    server = worker_server(run.process.pid, run.tree)
    workers = [proc for proc in run.tree.values() if proc.parent == server.pid]
    try:
        deadline = time.monotonic() + 30
        # One at a time: two processes dumping at once interleave their lines in the shared stderr.
        for pid, frame in ((run.process.pid, "in _stream_steps"), (workers[0].pid, "in _worker_loop")):
            os.kill(pid, signal.SIGUSR2)
            while frame not in (text := run.stderr.read_text()):
                assert time.monotonic() < deadline, text[-4000:]
                time.sleep(0.05)
            time.sleep(0.2)  # the rest of that dump
        streamed = record.read_text().count("\n")
        while record.read_text().count("\n") < streamed + 3:  # still streaming after the dumps
            assert run.process.poll() is None and time.monotonic() < deadline, run.stderr.read_text()[-4000:]
            time.sleep(0.05)
    finally:
        left = run.signal_and_wait(signal.SIGTERM)
    assert not left, f"{GONE_WITHIN_S} s after SIGTERM: {left}"
    assert "Traceback" not in run.stderr.read_text()


@pytest.mark.parametrize("how", ["streaming_dataloader", "stateful_dataloader"])
def test_killed_training_script_leaves_nothing_behind(small_dataset, tmp_path, how):
    record = tmp_path / "batches.txt"
    command = [sys.executable, str(SCRIPTS / "library_loop.py"), str(small_dataset), str(record), how]
    # A plain StatefulDataLoader given "forkserver" gets the stdlib's.
    run = start(command, record, tmp_path, "python" if how == "streaming_dataloader" else "forkserver")
    left = run.signal_and_wait(signal.SIGKILL)
    assert not left, f"{GONE_WITHIN_S} s after SIGKILL: {left}"


def started(command: list[str], record: Path, tmp_path: Path) -> subprocess.Popen:
    """``command`` started in its own session, once it has written three lines to ``record``."""
    with open(tmp_path / "stderr.txt", "w") as err:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        wait_until_streaming(process, record)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return process


def test_a_server_the_dataset_started_ends_with_a_killed_training_process(small_dataset, tmp_path):
    # Built before any DataLoader (no start_worker_context call), the dataset forked the workers'
    # server; the trainer dies while still building its policy, before any worker exists.
    record = tmp_path / "record.txt"
    process = started([sys.executable, str(SCRIPTS / "library_loop.py"), str(small_dataset), str(record), "idle"],
                      record, tmp_path)  # fmt: skip
    tree = process_tree(process.pid)
    servers = [p for p in tree.values() if p.parent == process.pid and p.role == "python"]
    assert len(servers) == 1 and str(SCRIPTS / "library_loop.py") in servers[0].command, tree
    run = Run(process, tree, set(), tmp_path / "stderr.txt")
    left = run.signal_and_wait(signal.SIGKILL)
    assert not left, f"{GONE_WITHIN_S} s after SIGKILL: {left}"


@pytest.mark.parametrize("how", ["no_workers", "fork_dataloader"])
def test_a_run_that_needs_no_server_keeps_none(small_dataset, tmp_path, how):
    # The server the dataset forked is stopped once the dataset is read without workers, or by
    # workers forked from the training process itself.
    record = tmp_path / "record.txt"
    process = started(
        [sys.executable, str(SCRIPTS / "library_loop.py"), str(small_dataset), str(record), how], record, tmp_path
    )
    try:
        tree = process_tree(process.pid)
        children = sorted(p.role for p in tree.values() if p.parent == process.pid)
        workers = 2 if how == "fork_dataloader" else 0
        assert children == ["python"] * workers + ["resource tracker"], tree
        assert all(p.parent == process.pid for p in tree.values() if p.pid != process.pid), tree
    finally:
        left = Run(process, process_tree(process.pid), set(), tmp_path / "stderr.txt").signal_and_wait(signal.SIGKILL)
    assert not left, f"{GONE_WITHIN_S} s after SIGKILL: {left}"


def record_worker(directory: Path, worker_id: int) -> None:
    """A user's ``worker_init_fn``: notes which worker ran it and whether it was guarded first."""
    from lerobot_nodes.workers import lifeline

    (directory / f"worker-{worker_id}").write_text(str(lifeline._guarded_pid == os.getpid()))


def test_a_users_worker_init_fn_runs_after_the_guard(small_dataset, tmp_path):
    dataset = StreamingLeRobotDataset(root=small_dataset, return_uint8=True)
    loader = streaming_dataloader(dataset, 4, 2, worker_init_fn=functools.partial(record_worker, tmp_path))
    next(iter(loader))
    workers = [w.pid for w in loader._iterator._workers]
    shutdown_dataloader(loader)
    assert {p.name: p.read_text() for p in tmp_path.glob("worker-*")} == {"worker-0": "True", "worker-1": "True"}
    assert all(_stat(pid) is None or _stat(pid)[0] == "Z" for pid in workers)


def test_guards_do_nothing_in_the_training_process():
    assert not guard_worker() and not guard_forkserver()


def test_workers_end_by_themselves_when_the_loader_shuts_down(small_dataset):
    dataset = StreamingLeRobotDataset(root=small_dataset, return_uint8=True)
    loader = streaming_dataloader(dataset, 4, 2)
    next(iter(loader))
    workers = list(loader._iterator._workers)
    shutdown_dataloader(loader)
    # 0: each worker closed its graph and left; torch's terminate() after its 5 s join would give -15.
    assert [worker.exitcode for worker in workers] == [0, 0]


RING_SCRIPT = """
import sys
from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader

if __name__ == "__main__":
    dataset = StreamingLeRobotDataset(root=sys.argv[1], return_uint8=True, seed=1)
    loader = streaming_dataloader(dataset, batch_size=4, num_workers=2)
    ring = dataset.batch_ring
    names = [segment.name for segment in ring._segments.values()] + [ring.name]
    batches = 0
    while True:
        for batch in loader:
            batches += 1
            if batches == 12:
                print(ring.unlinked, *names, flush=True)
"""


def test_a_killed_process_group_leaves_no_batch_ring_in_dev_shm(small_dataset, tmp_path):
    # The ring's segments hold whole batches (hundreds of MB at 480x640): once every worker has
    # attached, their names are unlinked, so killing the whole group (its resource tracker too, as a
    # job scheduler does) frees them with the last process instead of leaving them in /dev/shm.
    script = tmp_path / "ring.py"
    script.write_text(RING_SCRIPT)
    process = subprocess.Popen(
        [sys.executable, str(script), str(small_dataset)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().split()
        tree = process_tree(process.pid)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert line and line[0] == "True", line
    names = line[1:]
    assert len(names) == 6 + 1  # prefetch_factor 4 + 2 slots and the control table
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and any(not is_gone(proc) for proc in tree.values()):
        time.sleep(0.05)
    assert all(is_gone(proc) for proc in tree.values()), tree
    assert not set(names) & shm_names()
