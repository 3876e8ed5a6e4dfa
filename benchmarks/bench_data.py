"""Benchmark datasets: the shared small one and a generated larger one (written once, outside the repo)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DATA = Path(os.environ.get("LRN_BENCH_DATA", "/work/bench-data"))
SMALL_DATASET = Path(os.environ.get("LRN_BENCH_SMALL", "/work/shared/datasets/lerobot-writer-small"))

# The generated dataset: 200 episodes, 2 cameras at 480x640, AV1 with g=2 (LeRobot's defaults), the
# writer's default episode lengths (20..80 frames, seeded). Bump the version when the recipe changes.
LARGE_RECIPE = {
    "num_episodes": 200,
    "height": 480,
    "width": 640,
    "fps": 30,
    "codec": "av1",
    "seed": 0,
}
LARGE_NAME = "gen-200ep-2cam-480x640-av1-g2-v1"

# The long-GOP dataset (issue 12): H.264 as libx264 writes it by default (g=30, crf 23, preset
# medium, B-frames: x264's default of up to 3), 3 cameras at 480x640, 6 episodes of 150 frames
# (900 frames, 2,700 camera frames; 624 of each camera's 900 frames are B-frames, 33 key frames).
# Writing it took 24 minutes on the shared machine at load average 10-17 (20 episodes would have
# taken over an hour). Long GOPs with B-frames are where a loader's seek and frame-timing rules
# show (decoded / delivered, wrong frames).
LONG_GOP_RECIPE = {
    "episode_lengths": [150] * 6,
    "cameras": ["observation.images.top", "observation.images.wrist", "observation.images.side"],
    "height": 480,
    "width": 640,
    "fps": 30,
    "codec": "h264",
    "seed": 0,
}
LONG_GOP_NAME = "gen-6ep-3cam-480x640-h264-g30-bf-v1"


@dataclass(frozen=True)
class BenchDataset:
    name: str
    root: Path

    @property
    def repo_id(self) -> str:
        return f"local/{self.name}"


def small_dataset() -> BenchDataset:
    return BenchDataset("lerobot-writer-small", SMALL_DATASET)


def large_dataset_path() -> Path:
    return BENCH_DATA / "datasets" / LARGE_NAME


def ensure_large_dataset(log=print) -> BenchDataset:
    """Return the generated dataset, writing it first if missing (about 10 minutes on 2 cores)."""
    return _ensure_generated(LARGE_NAME, LARGE_RECIPE, log)


def long_gop_dataset_path() -> Path:
    return BENCH_DATA / "datasets" / LONG_GOP_NAME


def ensure_long_gop_dataset(log=print) -> BenchDataset:
    """Return the long-GOP H.264 dataset, writing it first if missing (a few minutes on 2 cores)."""
    return _ensure_generated(LONG_GOP_NAME, LONG_GOP_RECIPE, log)


def _ensure_generated(name: str, recipe: dict, log) -> BenchDataset:
    target = BENCH_DATA / "datasets" / name
    if (target / "meta" / "info.json").is_file():
        return BenchDataset(name, target)
    from lerobot_nodes.testing import write_dataset

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}-partial-"))
    log(f"writing the generated benchmark dataset {target} ({recipe}); this takes a while ...")
    start = time.perf_counter()
    try:
        write_dataset(staging, **recipe)  # type: ignore[arg-type]
        (staging / "BENCH_RECIPE.json").write_text(json.dumps(recipe, indent=2) + "\n")
        staging.chmod(0o755)
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"wrote {target} in {time.perf_counter() - start:.0f} s")
    return BenchDataset(name, target)


def dataset_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def evict_from_page_cache(paths: list[Path]) -> None:
    """Drop the clean cached pages of ``paths`` so the next read comes from storage."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


if __name__ == "__main__":
    import sys

    which = sys.argv[1] if len(sys.argv) > 1 else "large"
    print((ensure_long_gop_dataset() if which == "long-gop" else ensure_large_dataset()).root)


def resident_bytes(paths: list[Path]) -> int | None:
    """Bytes of ``paths`` now in the page cache (util-linux ``fincore``), None if unavailable.

    Measured after a run whose files were evicted before it started, this is what the run read
    from storage for those files (each page comes from storage at most once, readahead included),
    without the library loading of spawned workers that ``/proc/<pid>/io`` also counts.
    """
    if not paths:
        return 0
    try:
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(int(line) for line in out.split())
