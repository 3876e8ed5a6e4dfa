"""SIGKILL trials against real builder processes, shared by the tests and the stress script.

Each trial forks a real process that builds (an archive, or cache records), SIGKILLs it at a
random moment, then checks what a reader would see. Kill times are drawn uniformly in
``[0, 1.15 x build duration]`` so they land anywhere: reading metadata, parsing, writing a
temporary file, renaming it, or after the end (some builds finish; those must be valid too).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import numpy as np
from sidecar_testkit import Zygote, copy_dataset, read_result

from lerobot_nodes.atomic import is_partial
from lerobot_nodes.meta import load_meta
from lerobot_nodes.mp4.index import read_index_from_source
from lerobot_nodes.sidecar import MappedRecord, SidecarCache, build_archive
from lerobot_nodes.sidecar.builder import current_identities, verify_archive
from lerobot_nodes.sources import LocalSource

DATASET_ID = "test/sidecar"
_KILL_WINDOW = 1.15


def _timed_run(zygote: Zygote, task: str, **args: object) -> float:
    """Run ``task`` to completion in a child; its duration as the child measured it."""
    pid, result, _ = zygote.fork(task, **args)
    code = zygote.wait(pid)
    assert code == 0, read_result(result)
    return float(read_result(result)["seconds"])


def _kill_at_random(zygote: Zygote, pid: int, result: Path, duration: float, rng: random.Random) -> tuple[int, float]:
    """SIGKILL ``pid`` after a random delay; the exit code and the updated duration estimate."""
    time.sleep(rng.uniform(0.0, _KILL_WINDOW * duration))
    code = zygote.kill(pid)
    if code == 0:  # the machine got faster: aim the next kills earlier
        duration = min(duration, float(read_result(result)["seconds"]))
    return code, duration


def archive_kill_trials(zygote: Zygote, dataset: Path, workdir: Path, trials: int, seed: int = 4) -> Counter[str]:
    """Kill ``lerobot-build-mp4-sidecar``-style builds over a previous valid archive.

    Asserts after every trial: the output is the only visible file; it is byte-identical to the
    previous archive unless a build completed; it verifies against the store. After all trials,
    the next build removes every temporary file left by the killed builders.
    """
    source = LocalSource(dataset)
    identities = current_identities(source, load_meta(source).video_files(), None)
    output = workdir / "published" / "sidecar.npz"
    build_archive(source, output, dataset_id=DATASET_ID, show_progress=False)
    duration = _timed_run(zygote, "build_archive", root=str(dataset), output=str(output))
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    for trial in range(trials):
        previous = output.read_bytes()
        pid, result, _ = zygote.fork("build_archive", root=str(dataset), output=str(output), workers=rng.choice([1, 2]))
        code, duration = _kill_at_random(zygote, pid, result, duration, rng)
        outcomes["killed" if code == -9 else "finished"] += 1
        visible = sorted(p.name for p in output.parent.iterdir() if not is_partial(p))
        assert visible == ["sidecar.npz"], f"trial {trial}: visible files {visible}"
        outcomes["partials left"] += sum(is_partial(p) for p in output.parent.iterdir())
        if output.read_bytes() != previous:
            assert code == 0 or result.exists(), f"trial {trial}: the output changed but no build completed"
            outcomes["replaced by a new build"] += 1
            with open(output, "rb") as handle:
                verify_archive(handle, str(output), identities)
    with open(output, "rb") as handle:
        verify_archive(handle, str(output), identities)
    build_archive(source, output, show_progress=False)
    assert sorted(p.name for p in output.parent.iterdir()) == ["sidecar.npz"], "dead builders' files not removed"
    return outcomes


def cache_kill_trials(zygote: Zygote, dataset: Path, workdir: Path, trials: int, seed: int = 7) -> Counter[str]:
    """Kill processes that fill the local index cache (half of the files already indexed).

    Asserts after every trial: the previous records are byte-identical; every visible record
    maps, names the current identity of its file and holds exactly its index; the next open
    in this process builds exactly the missing records, returns exact indexes and removes the
    killed writer's temporary files.
    """
    source = LocalSource(dataset)
    paths = load_meta(source).video_files()
    expected = {path: read_index_from_source(source, path).to_arrays() for path in paths}
    identities = current_identities(source, paths, None)
    template = workdir / "template"
    SidecarCache(template, show_progress=False).open(source, paths[: len(paths) // 2], dataset_id=DATASET_ID)
    previous = {p.relative_to(template): p.read_bytes() for p in template.rglob("*.idx")}
    child_args = {"root": str(dataset), "paths": paths}
    duration = _timed_run(zygote, "open_indexes", cache=str(copy_dataset(template, workdir / "warmup")), **child_args)
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    for trial in range(trials):
        cache = copy_dataset(template, workdir / f"cache-{trial}")
        pid, result, _ = zygote.fork("open_indexes", cache=str(cache), workers=rng.choice([1, 2]), **child_args)
        code, duration = _kill_at_random(zygote, pid, result, duration, rng)
        outcomes["killed" if code == -9 else "finished"] += 1
        for relative, content in previous.items():
            assert (cache / relative).read_bytes() == content, f"trial {trial}: {relative} was modified"
        outcomes["partials left"] += sum(is_partial(p) for p in cache.rglob("records/*"))
        records = [p for p in cache.rglob("records/*") if not is_partial(p)]
        for record_path in records:
            record = MappedRecord.open(record_path)
            arrays = expected[record.identity.path]
            assert record.identity == identities[record.identity.path], f"trial {trial}: {record_path}"
            assert all(np.array_equal(record.arrays[k], arrays[k]) for k in ("offsets", "sizes", "pts", "keyframes"))
        outcomes["records installed before the kill"] += len(records) - len(previous)
        indexes, report = SidecarCache(cache, show_progress=False).open(source, paths, dataset_id=DATASET_ID)
        assert len(report.built) == len(paths) - len(records), f"trial {trial}: {report}"
        for path, index in indexes.items():
            assert np.array_equal(index.pts, expected[path]["pts"]) and np.array_equal(index.offsets, expected[path]["offsets"])
        assert not [p for p in cache.rglob("records/*") if is_partial(p)], f"trial {trial}: partials not removed"
    return outcomes
