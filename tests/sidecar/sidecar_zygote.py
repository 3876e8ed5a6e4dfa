"""A process that imports lerobot_nodes once, then forks real worker processes on request.

Importing torch-backed lerobot_nodes costs seconds per interpreter; forking a warm process
costs milliseconds, so kill trials and concurrency tests can use many real processes. Each
child is an ordinary OS process: it builds, locks, maps and can be SIGKILLed like any other.

Protocol (one JSON object per line): ``{"op": "fork", "task": ..., "args": {...}}`` answers
``{"pid": N}``; ``{"op": "wait", "pid": N}`` answers ``{"exit": code}`` (negative: signal);
``{"op": "exit"}`` ends the zygote. A child writes its result as JSON to ``args["result"]``
and its log lines to ``args["log"]``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sidecar import SidecarCache, build_archive
from lerobot_nodes.sidecar.cache import CacheEntry
from lerobot_nodes.sidecar.locking import BuildLock
from lerobot_nodes.sources import LocalSource


def _digest(indexes: dict[str, Any]) -> dict[str, str]:
    import hashlib

    out = {}
    for path, index in sorted(indexes.items()):
        h = hashlib.sha256()
        for name, array in sorted(index.to_arrays().items()):
            h.update(name.encode())
            h.update(np.ascontiguousarray(array).tobytes())
        out[path] = h.hexdigest()
    return out


def task_build_archive(args: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    summary = build_archive(
        LocalSource(args["root"]), args["output"], dataset_id="test/sidecar", workers=args.get("workers", 1),
        show_progress=False,
    )
    return {"files": summary.files, "seconds": time.monotonic() - started}


def task_open_indexes(args: dict[str, Any]) -> dict[str, Any]:
    source = LocalSource(args["root"])
    paths = args.get("paths") or load_meta(source).video_files()
    cache = SidecarCache(args["cache"], lock_timeout_s=args.get("lock_timeout_s", 60), show_progress=False,
                         build_workers=args.get("workers", 2))
    started = time.monotonic()
    indexes, report = cache.open(source, paths, dataset_id="test/sidecar")
    result = {
        "seconds": time.monotonic() - started,
        "built": report.built,
        "reused": report.reused,
        "converted": report.converted,
        "lock_wait_s": report.lock_wait_s,
        "digests": _digest(indexes),
        "records": sorted(str(index.record.path) for index in indexes.values()),
    }
    if args.get("touch_and_hold"):
        total = 0  # read every page of every dense column
        for index in indexes.values():
            for array in index.record.arrays.values():
                if array.dtype.kind in "biu":
                    total += int(np.asarray(array, dtype=np.int64).sum())
        result["touched"] = total
        _write_result(args["result"], result)
        time.sleep(args["touch_and_hold"])
    return result


def task_hold_lock(args: dict[str, Any]) -> dict[str, Any]:
    source = LocalSource(args["root"])
    entry = CacheEntry(Path(args["cache"]), CacheEntry.key(source, "test/sidecar"))
    with BuildLock(entry.lock_path, None, "hold the lock for a test"):
        _write_result(args["result"], {"lock": str(entry.lock_path)})
        time.sleep(args["hold_s"])
    return {"lock": str(entry.lock_path)}


TASKS = {"build_archive": task_build_archive, "open_indexes": task_open_indexes, "hold_lock": task_hold_lock}


def _write_result(path: str, value: dict[str, Any]) -> None:
    temporary = f"{path}.tmp"
    Path(temporary).write_text(json.dumps(value))
    os.replace(temporary, path)


def _run_child(task: str, args: dict[str, Any]) -> int:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # stdout is the zygote's protocol channel
    handler = logging.FileHandler(args["log"]) if args.get("log") else logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(process)d %(levelname)s %(message)s"))
    package_log = logging.getLogger("lerobot_nodes")
    package_log.handlers = [handler]
    package_log.setLevel(logging.INFO)
    package_log.propagate = False
    start_at = args.get("start_at")
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
    try:
        result = TASKS[task](args)
        if not args.get("touch_and_hold"):
            _write_result(args["result"], result)
        return 0
    except BaseException as error:  # report every failure to the test
        _write_result(args["result"], {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()})
        return 1


def main() -> None:
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "fork":
            pid = os.fork()
            if pid == 0:
                os._exit(_run_child(command["task"], command["args"]))
            print(json.dumps({"pid": pid}), flush=True)
        elif command["op"] == "wait":
            _, status = os.waitpid(command["pid"], 0)
            print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)
        elif command["op"] == "exit":
            break


if __name__ == "__main__":
    main()
