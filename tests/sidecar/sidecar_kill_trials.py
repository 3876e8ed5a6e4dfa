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

from lerobot_nodes.atomic import is_partial
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.mp4.index import read_index_from_source
from lerobot_nodes.sidecar import MappedRecord, MappedVideoIndex, SidecarArchive, SidecarCache, build_archive
from lerobot_nodes.sidecar.builder import current_identities, verify_archive
from lerobot_nodes.sidecar.schema import SourceIdentity
from lerobot_nodes.sources import LocalSource

from .sidecar_testkit import Zygote, copy_dataset, read_result

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
    assert code in (0, -9), read_result(result)  # a failed build is a bug, not an outcome
    if code == 0:  # the machine got faster: aim the next kills earlier
        duration = min(duration, float(read_result(result)["seconds"]))
    return code, duration


def _assert_complete_archive(
    output: Path, identities: dict[str, SourceIdentity], expected: dict[str, dict[str, np.ndarray]], where: str
) -> None:
    """``output`` is a whole archive of every file: it verifies and holds exactly each index."""
    with open(output, "rb") as handle:
        verify_archive(handle, str(output), identities)
    with SidecarArchive.from_path(output) as archive:
        assert archive.meta.complete and archive.paths == list(expected), f"{where}: {archive.paths}"
        for path, arrays in expected.items():
            loaded = archive.load_arrays(path)
            assert all(np.array_equal(loaded[name], value) for name, value in arrays.items()), f"{where}: {path}"


def archive_kill_trials(zygote: Zygote, dataset: Path, workdir: Path, trials: int, seed: int = 4) -> Counter[str]:
    """Kill ``lerobot-build-mp4-sidecar``-style builds over a previous valid archive.

    Asserts after every trial, from what a reader of the output can see (never from what the
    child reports, which a kill can cut off at any point): the output is the only visible file;
    it is either still the previous archive (the same file, byte-identical) or another file that
    is a complete archive verifying against the store; a build that exited normally replaced
    it. After all trials, the next build removes every temporary file left by killed builders.
    """
    source = LocalSource(dataset)
    paths = load_meta(source).video_files()
    identities = current_identities(source, paths, None)
    expected = {path: read_index_from_source(source, path).to_arrays() for path in paths}
    output = workdir / "published" / "sidecar.npz"
    build_archive(source, output, dataset_id=DATASET_ID, show_progress=False)
    duration = _timed_run(zygote, "build_archive", root=str(dataset), output=str(output))
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    for trial in range(trials):
        where = f"trial {trial}"
        previous_inode, previous = output.stat().st_ino, output.read_bytes()
        pid, result, _ = zygote.fork("build_archive", root=str(dataset), output=str(output), workers=rng.choice([1, 2]))
        code, duration = _kill_at_random(zygote, pid, result, duration, rng)
        outcomes["killed" if code == -9 else "finished"] += 1
        visible = sorted(p.name for p in output.parent.iterdir() if not is_partial(p))
        assert visible == ["sidecar.npz"], f"{where}: visible files {visible}"
        outcomes["partials left"] += sum(is_partial(p) for p in output.parent.iterdir())
        # A build installs its archive by renaming a new file over the output, so only a
        # new inode can mean new content: the same inode must hold the same bytes.
        replaced = output.stat().st_ino != previous_inode
        if not replaced:
            assert output.read_bytes() == previous, f"{where}: the previous archive was changed in place"
        assert replaced or code != 0, f"{where}: a build exited normally but did not install its archive"
        _assert_complete_archive(output, identities, expected, where)
        outcomes["replaced by a new build"] += replaced
    build_archive(source, output, show_progress=False)
    assert sorted(p.name for p in output.parent.iterdir()) == ["sidecar.npz"], "dead builders' files not removed"
    _assert_complete_archive(output, identities, expected, "after the trials")
    return outcomes


def _same_index(arrays: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> bool:
    return arrays.keys() == expected.keys() and all(np.array_equal(arrays[k], v) for k, v in expected.items())


def cache_kill_trials(zygote: Zygote, dataset: Path, workdir: Path, trials: int, seed: int = 7) -> Counter[str]:
    """Kill processes that fill the local index cache (half of the files already indexed).

    Asserts after every trial, from the files alone: the previous records are byte-identical;
    every visible record maps, names the current identity of its file and holds exactly its
    index; a fill that exited normally left a record of every file. Then the next open in this
    process builds exactly the files without a record, returns exact indexes and removes the
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
        where = f"trial {trial}"
        cache = copy_dataset(template, workdir / f"cache-{trial}")
        pid, result, _ = zygote.fork("open_indexes", cache=str(cache), workers=rng.choice([1, 2]), **child_args)
        code, duration = _kill_at_random(zygote, pid, result, duration, rng)
        outcomes["killed" if code == -9 else "finished"] += 1
        for relative, content in previous.items():
            assert (cache / relative).read_bytes() == content, f"{where}: {relative} was modified"
        outcomes["partials left"] += sum(is_partial(p) for p in cache.rglob("records/*"))
        indexed = set()
        for record_path in (p for p in cache.rglob("records/*") if not is_partial(p)):
            record = MappedRecord.open(record_path)
            path = record.identity.path
            assert record.identity == identities[path] and path not in indexed, f"{where}: {record_path}"
            assert _same_index(MappedVideoIndex(record).to_arrays(), expected[path]), f"{where}: {record_path}"
            indexed.add(path)
        assert code != 0 or indexed == set(paths), f"{where}: a fill exited normally without indexing {set(paths) - indexed}"
        outcomes["records installed by the killed or finished fill"] += len(indexed) - len(previous)
        indexes, report = SidecarCache(cache, show_progress=False).open(source, paths, dataset_id=DATASET_ID)
        assert sorted(report.built) == sorted(set(paths) - indexed), f"{where}: {report}"
        assert sorted(report.reused) == sorted(indexed), f"{where}: {report}"
        for path, index in indexes.items():
            assert _same_index(index.to_arrays(), expected[path]), f"{where}: {path}"
        assert not [p for p in cache.rglob("records/*") if is_partial(p)], f"{where}: partials not removed"
    return outcomes
