"""Runtime shared by every benchmark driver.

A driver is a small script run as a subprocess by ``benchmarks/run.py`` under the Python of the
loader it measures (this project's venv, or the separate LeRobot venv). It only needs the
standard library and torch, so the same file serves both interpreters.

Protocol with the harness (one line each, on stdout / stdin):

1. driver imports its loader library, prints ``@@READY`` and waits for a line on stdin
   (the harness takes its memory baseline and starts sampling);
2. driver builds the dataset and DataLoader, pulls batches and prints ``@@RESULT <json>``;
3. driver waits for another line on stdin (the harness takes its last sample of the whole process
   tree, workers included), then shuts the loader down and exits.

Measurements taken here (the harness adds memory and whole-run I/O):

* time to first batch: from just before the dataset is constructed to the first batch in hand;
* batch wait: time spent inside ``next(iterator)`` for each later batch;
* steady-state samples/s: samples of batches 2..N over the time from batch 1 to batch N;
* ``/proc/<pid>/io`` (``read_bytes``, ``rchar``) and CPU time of this process and all descendants,
  and the decoded-frame counter of ``decode_counter.c``, at the first and the last batch, so
  steady-state ratios exclude start-up and worker imports;
* after the timed batches, an exact decoded-frames-per-delivered-frame check (``_decode_check``);
* each timed batch's ``episode_index`` and ``frame_index`` (``mixing``), from which the harness
  computes the batch-mixing figures (``lerobot_nodes.batch_mixing``) next to a uniform shuffle's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

READY = "@@READY"
RESULT = "@@RESULT "


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (all threads)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                out.extend(int(x) for x in handle.read().split())
        except OSError:
            continue
    return out


def process_tree(root: int) -> list[int]:
    """``root`` and all of its descendants."""
    seen: list[int] = []
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.append(pid)
        stack.extend(children(pid))
    return seen


def read_io(pid: int) -> dict[str, int] | None:
    try:
        with open(f"/proc/{pid}/io") as handle:
            fields = dict(line.split(":", 1) for line in handle.read().splitlines() if ":" in line)
    except OSError:
        return None
    return {"read_bytes": int(fields["read_bytes"]), "rchar": int(fields["rchar"])}


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def read_cpu(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def read_cpu_with_reaped(pid: int) -> float | None:
    """CPU seconds of ``pid`` plus those of its children that exited and were waited for."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLOCK_TICKS


def tree_cpu(root: int) -> float:
    """CPU seconds of the live tree, plus those of its processes that already exited and were reaped
    (a loader's short-lived helpers would otherwise take their CPU time with them)."""
    return sum(cpu for cpu in (read_cpu_with_reaped(pid) for pid in process_tree(root)) if cpu is not None)


def tree_io(root: int) -> dict[str, int]:
    total = {"read_bytes": 0, "rchar": 0, "processes": 0}
    for pid in process_tree(root):
        io = read_io(pid)
        if io is None:
            continue
        total["read_bytes"] += io["read_bytes"]
        total["rchar"] += io["rchar"]
        total["processes"] += 1
    return total


def read_decoded() -> int | None:
    """Frames decoded so far by the whole process tree (``decode_counter.c``), or None."""
    path = os.environ.get("LRN_DECODE_COUNTER_FILE")
    if not path or "decode_counter" not in os.environ.get("LD_PRELOAD", ""):
        return None
    with open(path, "rb") as handle:
        return int.from_bytes(handle.read(8), "little")


def delta_timestamps(
    window: str, fps: int, camera_keys: list[str], features: Mapping[str, Any]
) -> dict | None:
    """``delta_timestamps`` the way LeRobot's ``resolve_delta_timestamps`` builds them for a policy.

    * ``none``: no window;
    * ``act``: ACT, ``action`` = ``range(50)`` (chunk_size 50); observations have no deltas, so
      cameras are decoded at offset 0 only;
    * ``diffusion``: Diffusion Policy, n_obs_steps 2, horizon 16: cameras and ``observation.state``
      at ``[-1, 0]``, ``action`` at ``range(-1, 15)``.
    """
    if window == "none":
        return None
    if window == "act":
        return {"action": [i / fps for i in range(50)]}
    if window == "diffusion":
        obs = [i / fps for i in range(-1, 1)]
        out: dict[str, list[float]] = {key: list(obs) for key in camera_keys}
        if "observation.state" in features:
            out["observation.state"] = list(obs)
        out["action"] = [i / fps for i in range(-1, 15)]
        return out
    raise ValueError(f"unknown window {window!r}")


def worker_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """DataLoader options that LeRobot's training sets only when workers are enabled."""
    if config["num_workers"] <= 0:
        return {}
    return {
        "prefetch_factor": config["prefetch_factor"],
        "persistent_workers": True,
        "multiprocessing_context": config["mp_context"],
    }


def _frames_per_sample(batch: Mapping[str, Any], camera_keys: list[str]) -> tuple[int, dict[str, list[int]]]:
    frames = 0
    shapes: dict[str, list[int]] = {}
    for key in camera_keys:
        value = batch[key]
        shapes[key] = list(value.shape)
        frames += 1 if value.dim() == 4 else int(value.shape[1])
    return frames, shapes


def _batch_len(batch: Mapping[str, Any], camera_keys: list[str]) -> int:
    return int(batch[camera_keys[0]].shape[0])


def _indexes(batch: Mapping[str, Any]) -> tuple[list[int], list[int]] | None:
    """The batch's ``episode_index`` and ``frame_index`` as lists (None when it has none)."""
    episodes, frames = batch.get("episode_index"), batch.get("frame_index")
    if episodes is None or frames is None:
        return None
    return [int(x) for x in episodes.reshape(-1).tolist()], [int(x) for x in frames.reshape(-1).tolist()]


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def wait_idle(root: int, quiet_s: float = 0.6, timeout_s: float = 60.0) -> bool:
    """Wait until the tree stops decoding and stops using CPU (all prefetched work done)."""
    deadline = time.perf_counter() + timeout_s
    decoded, cpu = read_decoded(), tree_cpu(root)
    quiet_since = time.perf_counter()
    while time.perf_counter() < deadline:
        time.sleep(0.2)
        now_decoded, now_cpu = read_decoded(), tree_cpu(root)
        if now_decoded != decoded or now_cpu - cpu > 0.05:
            quiet_since = time.perf_counter()
        elif time.perf_counter() - quiet_since >= quiet_s:
            return True
        decoded, cpu = now_decoded, now_cpu
    return False


def _decode_check(iterator: Any, root: int, camera_keys: list[str], batches: int) -> dict[str, Any] | None:
    """Decoded frames per delivered frame, exact despite prefetching.

    After the timed batches, wait until every batch the DataLoader has already asked for is done;
    pull ``batches`` more; wait again. Each extra batch makes the loader start exactly one more
    batch, so the frames decoded between the two idle points belong to exactly as many batches as
    were pulled (for LeRobot's streaming dataset: to the frames that replace them in its buffer).
    """
    if batches <= 0:
        return None
    idle_before = wait_idle(root)
    decoded_before = read_decoded()
    frames = samples = pulled = 0
    for _ in range(batches):
        try:
            batch = next(iterator)
        except StopIteration:
            break
        pulled += 1
        n = _batch_len(batch, camera_keys)
        samples += n
        frames += n * _frames_per_sample(batch, camera_keys)[0]
        del batch
    idle_after = wait_idle(root)
    decoded_after = read_decoded()
    if decoded_before is None or decoded_after is None:
        return None
    return {
        "batches": pulled,
        "samples": samples,
        "frames": frames,
        "decoded": decoded_after - decoded_before,
        "idle": idle_before and idle_after,
    }


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _wait() -> None:
    sys.stdin.readline()


def main(build: Callable[[dict[str, Any]], tuple[Iterable[Any], dict[str, Any]]]) -> None:
    """Run one measured loader pass; ``build(config)`` returns ``(loader, info)``."""
    config: dict[str, Any] = json.loads(sys.argv[1])
    camera_keys: list[str] = config["camera_keys"]
    me = os.getpid()
    _emit(READY)
    _wait()
    io_start = tree_io(me)
    decoded_start = read_decoded()
    t0 = time.perf_counter()
    loader, info = build(config)
    t_built = time.perf_counter()
    iterator = iter(loader)
    t_iter = time.perf_counter()
    num_batches: int | None = config.get("num_batches")  # None: one full epoch
    waits: list[float] = []
    samples = 0
    first: dict[str, Any] = {}
    frames_per_sample = 0
    shapes: dict[str, list[int]] = {}
    t_last = t_first = t0
    batches = 0
    mixing: dict[str, list[int]] = {"episodes": [], "frames": [], "sizes": []}
    while num_batches is None or batches < num_batches:
        before = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        now = time.perf_counter()
        batches += 1
        samples += _batch_len(batch, camera_keys)
        t_last = now
        indexes = _indexes(batch)
        if indexes is not None:
            mixing["episodes"] += indexes[0]
            mixing["frames"] += indexes[1]
            mixing["sizes"].append(len(indexes[0]))
        if batches == 1:
            t_first = now
            frames_per_sample, shapes = _frames_per_sample(batch, camera_keys)
            first = {"samples": samples, "io": tree_io(me), "decoded": read_decoded(), "cpu": tree_cpu(me)}
        else:
            waits.append(now - before)
        del batch
    io_end = tree_io(me)
    decoded_end = read_decoded()
    cpu_end = tree_cpu(me)
    steady_samples = samples - first.get("samples", samples)
    steady_time = t_last - t_first
    decode_check = None
    exhausted = num_batches is not None and batches < num_batches
    if num_batches is not None and not exhausted and decoded_end is not None:
        decode_check = _decode_check(iterator, me, camera_keys, config.get("decode_check_batches", 4))
    result = {
        "label": info.get("label"),
        "info": info,
        "batches": batches,
        "samples": samples,
        "frames_per_sample": frames_per_sample,
        "shapes": shapes,
        "build_s": t_built - t0,
        "iter_s": t_iter - t_built,
        "ttfb_s": (t_first - t0) if batches else None,
        "total_s": t_last - t0,
        "samples_per_s": (steady_samples / steady_time) if steady_time > 0 else None,
        "samples_per_s_e2e": samples / (t_last - t0) if batches else None,
        "wait_p50_s": _percentile(waits, 0.50),
        "wait_p95_s": _percentile(waits, 0.95),
        "wait_p99_s": _percentile(waits, 0.99),
        "wait_max_s": max(waits) if waits else None,
        "io_start": io_start,
        "io_first": first.get("io"),
        "io_end": io_end,
        "decoded_start": decoded_start,
        "decoded_first": first.get("decoded"),
        "decoded_end": decoded_end,
        "steady_samples": steady_samples,
        "cpu_first_s": first.get("cpu"),
        "cpu_end_s": cpu_end,
        "decode_check": decode_check,
        "mixing": mixing if mixing["sizes"] else None,
    }
    _emit(RESULT + json.dumps(result))
    _wait()
    del iterator, loader
