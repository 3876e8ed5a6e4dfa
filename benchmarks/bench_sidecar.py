"""Benchmark of lerobot_nodes.sidecar (issue 4): sizes per frame, open times, build throughput.

Measures, printing a Markdown report (and writing it with ``--output``):

1. bytes per frame: the six index columns as int64, the schema v3 archive (deflate NPZ), and
   the derived memory-mapped record (smallest exact dtypes, constant columns stored once),
   on one-hour files (108 000 samples) and on the LeRobot-written dataset;
2. open times: cold (nothing cached: parse the MP4s and write records), first open with a
   published archive (convert it), warm (records cached: validate and map);
3. build throughput of ``lerobot-build-mp4-sidecar`` with ``--workers 1`` and ``2``: local
   files, the same files behind a simulated 20 ms round trip per request (a remote store),
   and the end-to-end CLI build of the LeRobot-written dataset.

Timings are best-of-N wall times with the process CPU time of the same run. Run from the
repository root::

    /work/venv/bin/python benchmarks/bench_sidecar.py --output benchmarks/sidecar_results.md
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sidecar import BuildSummary, MappedRecord, SidecarCache, build_archive
from lerobot_nodes.sidecar.builder import write_archive
from lerobot_nodes.sidecar.schema import DEFAULT_ARCHIVE_NAME, PUBLISHED_DIR
from lerobot_nodes.sources import ByteRange, ByteSource, FileInfo, LocalSource
from lerobot_nodes.testing.video import concatenate_videos, encode_video, synthetic_frames

DEFAULT_DATASET = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "lerobot-writer-small"
HOUR_SAMPLES = 108_000
INT64_COLUMNS = 6  # offsets, sizes, dts, pts, durations, keyframes
LATENCY_S = 0.020


def best_of(repeat: int, function: Callable[[], object], setup: Callable[[], object] | None = None) -> tuple[float, float]:
    """``(best wall seconds, CPU seconds of that run)`` over ``repeat`` runs (``setup`` untimed)."""
    best_wall, best_cpu = float("inf"), float("inf")
    for _ in range(repeat):
        if setup is not None:
            setup()
        wall, cpu = time.perf_counter(), time.process_time()
        function()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if wall < best_wall:
            best_wall, best_cpu = wall, cpu
    return best_wall, best_cpu


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """The AV1 encoder prints banners on the C-level stderr."""
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def hour_long_store(work: Path) -> tuple[Path, dict[str, str]]:
    """A store holding one hour (108 000 samples) of AV1 g=2 and of H.264 with B-frames.

    Stream-copy concatenations of a 10 s 64x64 encode, as LeRobot concatenates episodes: the
    sample tables have the real size of an hour of video.
    """
    store = work / "store"
    frames = synthetic_frames(300, 64, 64, seed=1)
    files = {}
    with quiet_stderr():
        for codec in ("av1", "h264"):
            episode = encode_video(work / f"{codec}-10s.mp4", frames, codec=codec)
            target = store / "videos" / f"{codec}-1h.mp4"
            target.parent.mkdir(parents=True, exist_ok=True)
            concatenate_videos([episode] * (HOUR_SAMPLES // len(frames)), target, faststart=True)
            files[codec] = f"videos/{codec}-1h.mp4"
    return store, files


class LatencySource(ByteSource):
    """A local store behind a fixed round-trip time per request, like a remote object store."""

    def __init__(self, inner: LocalSource, latency_s: float) -> None:
        super().__init__()
        self.inner = inner
        self.latency_s = latency_s

    @property
    def url(self) -> str:
        return self.inner.url

    def list_files(self, prefix: str = "") -> list[FileInfo]:
        time.sleep(self.latency_s)
        return self.inner.list_files(prefix)

    def info(self, path: str) -> FileInfo:
        time.sleep(self.latency_s)
        return self.inner.info(path)

    def _read_file(self, path: str) -> bytes:
        time.sleep(self.latency_s)
        return self.inner.read_file(path)

    def _read_ranges(self, path: str, ranges: list[ByteRange]) -> list[bytes]:
        time.sleep(self.latency_s)
        return self.inner.read_ranges(path, ranges)


# -- 1. sizes -------------------------------------------------------------------------------


def bench_sizes(store: Path, files: dict[str, str], dataset: Path, work: Path) -> list[str]:
    rows = [
        "| video | samples | int64 columns B/frame | archive NPZ B/frame (uncompressed) | derived record B/frame "
        "| of which index columns | derived layout (dtype, kind) |",
        "|---|---|---|---|---|---|---|",
    ]
    cases = [(f"1 h {codec.upper()} ({'g=2' if codec == 'av1' else 'x264 defaults, B-frames'})", store, [path])
             for codec, path in files.items()]
    cases.append(("LeRobot-written AV1 240x320, 2 cameras", dataset, load_meta(LocalSource(dataset)).video_files()))
    for number, (label, root, paths) in enumerate(cases):
        source = LocalSource(root)
        archive = work / f"sizes-{number}.npz"
        summary = write_archive(source, paths, archive, complete=True, show_progress=False)
        with zipfile.ZipFile(archive) as npz:
            uncompressed = sum(member.file_size for member in npz.infolist())
        cache = work / f"sizes-cache-{number}"
        indexes, _ = SidecarCache(cache, show_progress=False).open(source, paths)
        records = [index.record for index in indexes.values()]  # type: ignore[attr-defined]
        record_bytes = sum(record.nbytes for record in records)
        samples = summary.samples
        index_bytes = sum(_column_bytes(record, index_only=True) for record in records)
        rows.append(
            f"| {label} | {samples} | {INT64_COLUMNS * 8} | {summary.archive_bytes / samples:.1f} "
            f"({uncompressed / samples:.1f}) | {record_bytes / samples:.1f} | {index_bytes / samples:.1f} "
            f"| {_layout(records[0])} |"
        )
    return rows + [
        "",
        "The archive keeps plain int64 tables (schema v3) and is deflate-compressed; the derived record is what",
        "training maps. *Index columns* are the six VideoIndex tables; the rest of a record is its header, the",
        "codec configuration, and the shared lookup columns (`presentation_order`, `keyframe_indices`) that",
        "every process would otherwise compute and hold privately.",
    ]


def _column_bytes(record: MappedRecord, index_only: bool) -> int:
    names = ("offsets", "sizes", "dts", "pts", "durations", "keyframes")
    layouts = record.header["arrays"]
    return sum(int(layouts[n].get("nbytes", 0)) for n in (names if index_only else layouts))


def _layout(record: MappedRecord) -> str:
    parts = []
    for name in ("offsets", "sizes", "dts", "pts", "durations", "keyframes", "presentation_order", "keyframe_indices"):
        layout = record.header["arrays"][name]
        parts.append(f"{name} {np.dtype(layout['dtype']).name} {layout['kind']}")
    return ", ".join(parts)


# -- 2. open times --------------------------------------------------------------------------


def bench_open(store: Path, files: dict[str, str], dataset: Path, work: Path, repeat: int) -> list[str]:
    rows = [
        "| files | samples | cold open: parse + write records | first open: convert published archive | warm open: map records |",
        "|---|---|---|---|---|",
    ]
    published_store = work / "published-store"
    shutil.copytree(store, published_store)
    cases = [("2 x 1 h (AV1 + H.264)", published_store, sorted(files.values()))]
    dataset_copy = work / "published-dataset"
    shutil.copytree(dataset, dataset_copy)
    cases.append(("LeRobot-written dataset, 2 files", dataset_copy, load_meta(LocalSource(dataset_copy)).video_files()))
    for label, root, paths in cases:
        source = LocalSource(root)
        archive = root / PUBLISHED_DIR / DEFAULT_ARCHIVE_NAME
        samples = write_archive(source, paths, archive, complete=True, show_progress=False).samples
        hidden = archive.with_name("hidden.bak")
        cache = work / "open-cache"
        fresh_cache = partial(shutil.rmtree, cache, ignore_errors=True)
        open_once = partial(_open_once, cache, source, paths)
        archive.rename(hidden)
        cold = best_of(repeat, open_once, setup=fresh_cache)
        hidden.rename(archive)
        converted = best_of(repeat, open_once, setup=fresh_cache)
        warm = best_of(repeat * 4, open_once)
        rows.append(f"| {label} | {samples} | {_ms(cold)} | {_ms(converted)} | {_ms(warm)} |")
    return rows + ["", "Wall ms (CPU ms of the same run). Warm opens check each file's identity and map its record."]


def _open_once(cache: Path, source: ByteSource, paths: list[str]) -> None:
    SidecarCache(cache, show_progress=False).open(source, paths)


def _ms(timing: tuple[float, float]) -> str:
    return f"{timing[0] * 1000:.1f} ms ({timing[1] * 1000:.1f})"


# -- 3. build throughput --------------------------------------------------------------------


def _record(into: list[BuildSummary], build: Callable[..., BuildSummary], *args: Any, **kwargs: Any) -> None:
    into.append(build(*args, **kwargs))


def bench_build(store: Path, files: dict[str, str], dataset: Path, work: Path, repeat: int) -> list[str]:
    many = work / "many-store"
    paths = []
    for copy in range(4):
        for codec, path in files.items():
            target = many / "videos" / f"{codec}-{copy}.mp4"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(store / path, target)
            paths.append(f"videos/{codec}-{copy}.mp4")
    rows = [
        "| build | --workers | wall s (CPU s) | files/s | hours of video/s | bytes read |",
        "|---|---|---|---|---|---|",
    ]
    local = LocalSource(many)
    remote = LatencySource(LocalSource(many), LATENCY_S)
    for label, source in (("8 x 1 h files, local disk", local), (f"8 x 1 h files, {LATENCY_S * 1000:.0f} ms per request", remote)):
        for workers in (1, 2):
            summaries: list[BuildSummary] = []
            build = partial(_record, summaries, write_archive, source, paths, work / "build.npz", complete=True,
                            workers=workers, show_progress=False)
            wall, cpu = best_of(repeat, build)
            summary = summaries[-1]
            rows.append(f"| {label} | {workers} | {wall:.2f} ({cpu:.2f}) | {summary.files / wall:.1f} | "
                        f"{summary.samples / HOUR_SAMPLES / wall:.1f} | {summary.bytes_read} |")
    for workers in (1, 2):
        summaries = []
        cli_build = partial(_record, summaries, build_archive, LocalSource(dataset), work / "cli.npz", workers=workers,
                            show_progress=False)
        wall, cpu = best_of(repeat, cli_build)
        summary = summaries[-1]
        rows.append(f"| LeRobot-written dataset (CLI build, metadata included) | {workers} | {wall:.2f} ({cpu:.2f}) | "
                    f"{summary.files / wall:.1f} | {summary.samples / HOUR_SAMPLES / wall:.1f} | {summary.bytes_read} |")
    return rows + [
        "",
        "A build parses only each file's `moov` (range reads) and compresses the tables into the archive, so",
        "`--workers` helps when requests wait on the network; on a local disk the parse is CPU-bound Python and",
        "numpy, and threads share one interpreter.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", type=Path, default=DEFAULT_DATASET, help="a LeRobot-written v3.0 dataset")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (best is kept)")
    parser.add_argument("--output", type=Path, help="also write the Markdown report here")
    args = parser.parse_args()
    started = time.time()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-sidecar-") as work_dir:
        work = Path(work_dir)
        store, files = hour_long_store(work)
        sections = [
            ("1. Bytes per frame", bench_sizes(store, files, args.dataset, work)),
            ("2. Open times", bench_open(store, files, args.dataset, work, args.repeat)),
            ("3. Build throughput (`lerobot-build-mp4-sidecar --workers`)", bench_build(store, files, args.dataset, work, args.repeat)),
        ]  # fmt: skip
    load_after = os.getloadavg()
    header = [
        "# lerobot_nodes.sidecar benchmark",
        "",
        f"Command: `{' '.join(['/work/venv/bin/python', *sys.argv])}`",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, numpy {np.__version__}. Load average {load_before[0]:.1f} before and "
        f"{load_after[0]:.1f} after ({time.time() - started:.0f} s run). Best of {args.repeat} runs.",
    ]
    report = "\n".join(header + [line for title, rows in sections for line in ["", f"## {title}", "", *rows]]) + "\n"
    print(report)
    if args.output:
        args.output.write_text(report)


if __name__ == "__main__":
    main()
