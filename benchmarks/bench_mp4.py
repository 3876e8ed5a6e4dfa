"""Benchmark of lerobot_nodes.mp4 (issue 3): index build, moov location, clip overhead, decoding.

Measures, printing a Markdown report (and writing it with ``--output``):

1. sample-table build time per hour of video (108 000 samples at 30 fps), AV1 and H.264;
2. round trips and bytes read to locate the moov (moov before and after mdat);
3. clip overhead: clip header bytes against payload bytes, per episode;
4. decode ms/frame: clip sequential, clip random access, and the map-style reader
   (``MapStyleLeRobotDataset``'s whole-file PyAV path) on the same frames.

Timings are best-of-N wall times; "CPU ms" is process CPU time over the same run, which
other jobs on the machine disturb less. Run from the repository root::

    /work/venv/bin/python benchmarks/bench_mp4.py --output benchmarks/mp4_results.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq

from lerobot_nodes import MapStyleLeRobotDataset
from lerobot_nodes.mp4 import (
    ClipDecoder,
    VideoIndex,
    decode_clip,
    materialize_clip,
    plan_clip,
    read_index_from_source,
)
from lerobot_nodes.mp4.boxes import locate_moov
from lerobot_nodes.mp4.file_video import FileVideoDecoder
from lerobot_nodes.mp4.index import parse_moov
from lerobot_nodes.sources import LocalSource
from lerobot_nodes.testing.video import concatenate_videos, encode_video, synthetic_frames, video_duration_s

DEFAULT_DATASET = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "lerobot-writer-small"
HOUR_SAMPLES = 108_000
CAMERAS = ("observation.images.top", "observation.images.wrist")


def best_of(repeat: int, function: Callable[[], object]) -> tuple[float, float]:
    """``(best wall seconds, CPU seconds of that run)`` over ``repeat`` runs."""
    best_wall, best_cpu = float("inf"), float("inf")
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        function()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if wall < best_wall:
            best_wall, best_cpu = wall, cpu
    return best_wall, best_cpu


def hour_long_files(work: Path) -> dict[str, Path]:
    """One hour at 30 fps (108 000 samples) by stream-copy concatenation of a 10 s encode.

    Small frames (64x64) keep the files small; the sample tables have the real size.
    """
    frames = synthetic_frames(300, 64, 64, seed=1)
    files = {}
    for codec in ("av1", "h264"):
        episode = encode_video(work / f"{codec}-10s.mp4", frames, codec=codec)
        copies = [episode] * (HOUR_SAMPLES // len(frames))
        files[f"{codec} faststart"] = concatenate_videos(
            copies, work / f"{codec}-1h-faststart.mp4", faststart=True
        )
        files[f"{codec} moov at end"] = concatenate_videos(
            copies, work / f"{codec}-1h-end.mp4", faststart=False
        )
    return files


def bench_index(files: dict[str, Path], repeat: int) -> list[str]:
    lines = [
        "| file (1 h, 108 000 samples) | moov | moov B/sample | parse moov + tables | `read_index` (local) | `av.open` | from NPZ (`np.load` + `from_arrays`) | NPZ raw / deflate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, path in files.items():
        source = LocalSource(path.parent)
        data = path.read_bytes()
        moov = locate_moov(lambda ranges: [data[a:b] for a, b in ranges], len(data), name).moov  # noqa: B023
        index = read_index_from_source(source, path.name)
        assert len(index) == HOUR_SAMPLES, len(index)
        parse, _ = best_of(repeat, lambda: parse_moov(moov, len(data), path.name, name))  # noqa: B023
        full, _ = best_of(repeat, lambda: read_index_from_source(source, path.name))  # noqa: B023
        opened, _ = best_of(repeat, lambda: av.open(str(path)).close())  # noqa: B023
        raw, packed = path.with_suffix(".npz"), path.with_suffix(".deflate.npz")
        np.savez(raw, **index.to_arrays())
        np.savez_compressed(packed, **index.to_arrays())

        def load(npz: Path = packed) -> VideoIndex:
            with np.load(npz) as arrays:
                return VideoIndex.from_arrays(arrays)

        loaded, _ = best_of(repeat, load)
        lines.append(
            f"| {name} | {len(moov) / 1e3:.0f} KB | {len(moov) / HOUR_SAMPLES:.1f} | {parse * 1e3:.1f} ms "
            f"| {full * 1e3:.1f} ms | {opened * 1e3:.1f} ms | {loaded * 1e3:.1f} ms "
            f"| {raw.stat().st_size / 1e6:.2f} / {packed.stat().st_size / 1e6:.2f} MB |"
        )
    return lines


def bench_locate(files: dict[str, Path], dataset: Path) -> list[str]:
    lines = ["| file | file size | moov | round trips | bytes read |", "|---|---|---|---|---|"]
    targets = [(name, path.parent, path.name) for name, path in files.items()]
    targets += [
        (
            f"LeRobot-written {camera.split('.')[-1]} (faststart)",
            dataset,
            f"videos/{camera}/chunk-000/file-000.mp4",
        )
        for camera in CAMERAS
    ]
    for name, root, relative in targets:
        source = LocalSource(root)
        data = (root / relative).read_bytes()
        moov = locate_moov(lambda ranges: [data[a:b] for a, b in ranges], len(data), name).moov  # noqa: B023
        read_index_from_source(source, relative)
        lines.append(
            f"| {name} | {len(data) / 1e6:.1f} MB | {len(moov) / 1e3:.0f} KB | {source.stats.requests} "
            f"| {source.stats.bytes_read / 1e3:.0f} KB |"
        )
    return lines


def episode_spans(dataset: Path, camera: str) -> list[tuple[float, float, int]]:
    rows = pq.read_table(dataset / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    return [
        (row[f"videos/{camera}/from_timestamp"], row[f"videos/{camera}/to_timestamp"], row["length"])
        for row in rows
    ]


def bench_clip_overhead(dataset: Path, hour_files: dict[str, Path], repeat: int) -> list[str]:
    lines = [
        "| source | clips | frames/clip | payload/clip | header/clip | header / payload | plan | fetch + materialise |",
        "|---|---|---|---|---|---|---|---|",
    ]
    source = LocalSource(dataset)
    cases: list[tuple[str, LocalSource, str, list[tuple[float, float, int]]]] = [
        (f"LeRobot-written, {camera.split('.')[-1]} (AV1 240x320)", source, f"videos/{camera}/chunk-000/file-000.mp4", episode_spans(dataset, camera))
        for camera in CAMERAS
    ]  # fmt: skip
    for name in ("av1 faststart", "h264 faststart"):
        path = hour_files[name]
        spans = [(10.0 * i, 10.0 * (i + 1), 300) for i in range(0, 360, 6)]
        cases.append((f"1 h {name.split()[0]}, 10 s episodes", LocalSource(path.parent), path.name, spans))
    for label, case_source, path, spans in cases:
        index = read_index_from_source(case_source, path)
        plans = [plan_clip(index, start, stop) for start, stop, _ in spans]
        payload = np.array([plan.payload_size for plan in plans])
        header = np.array([len(plan.header) for plan in plans])
        frames = np.array([plan.needed_count for plan in plans])
        plan_time, _ = best_of(repeat, lambda: [plan_clip(index, a, b) for a, b, _ in spans])  # noqa: B023
        fetch_time, _ = best_of(
            repeat,
            lambda: [materialize_clip(p, case_source.read_ranges(path, p.byte_ranges)) for p in plans],  # noqa: B023
        )
        lines.append(
            f"| {label} | {len(plans)} | {frames.mean():.0f} | {payload.mean() / 1e3:.1f} KB "
            f"| {header.mean() / 1e3:.2f} KB | {100 * (header / payload).mean():.2f} % "
            f"(max {100 * (header / payload).max():.2f} %) | {plan_time / len(plans) * 1e3:.2f} ms "
            f"| {fetch_time / len(plans) * 1e3:.2f} ms |"
        )
    return lines


def h264_episodes(work: Path) -> tuple[Path, list[tuple[float, float, int]]]:
    """Six 150-frame H.264 (x264 defaults: B-frames, g=30) episodes at 240x320, LeRobot-concatenated."""
    parts, spans, start = [], [], 0.0
    for episode in range(6):
        part = encode_video(
            work / f"h264-ep{episode}.mp4", synthetic_frames(150, 240, 320, seed=episode), codec="h264"
        )
        duration = video_duration_s(part)
        spans.append((start, start + duration, 150))
        start += duration
        parts.append(part)
    return concatenate_videos(parts, work / "h264-episodes.mp4", faststart=True), spans


def bench_decode(
    label: str, root: Path, path: str, spans: list[tuple[float, float, int]], repeat: int, fps: int = 30
) -> list[str]:
    source = LocalSource(root)
    index = read_index_from_source(source, path)
    rng = np.random.default_rng(0)
    rows = []
    episodes = spans[:: max(1, len(spans) // 3)][:3]
    clips = []
    for from_s, to_s, length in episodes:
        plan = plan_clip(index, from_s, to_s)
        clips.append((materialize_clip(plan, source.read_ranges(path, plan.byte_ranges)), from_s, length))
    total_frames = sum(length for _, _, length in clips)

    def clip_sequential() -> None:
        for clip, from_s, length in clips:
            decoder = ClipDecoder(clip)
            for i in range(length):
                decoder.frames_at([from_s + i / fps])

    def clip_batch() -> None:
        for clip, from_s, length in clips:
            decode_clip(clip, [from_s + i / fps for i in range(length)])

    random_queries = [
        (clip, from_s + int(i) / fps) for clip, from_s, length in clips for i in rng.permutation(length)
    ]

    def clip_random() -> None:
        decoders: dict[int, ClipDecoder] = {}
        for clip, timestamp in random_queries:
            decoder = decoders.setdefault(id(clip), ClipDecoder(clip))
            decoder.frames_at([timestamp])

    def clip_random_one_shot() -> None:
        for clip, timestamp in random_queries:
            decode_clip(clip, [timestamp])

    file_decoder = FileVideoDecoder(source, path)

    def map_style_sequential() -> None:
        for _, from_s, length in clips:
            for i in range(length):
                file_decoder.decode([from_s + i / fps], 1e-4)

    def map_style_random() -> None:
        for _, timestamp in random_queries:
            file_decoder.decode([timestamp], 1e-4)

    cases = [
        ("clip, sequential (`ClipDecoder`, one query per frame)", clip_sequential),
        ("clip, whole episode in one call (`decode_clip`)", clip_batch),
        ("clip, random order (`ClipDecoder` reused per clip)", clip_random),
        ("clip, random order (new `decode_clip` per frame)", clip_random_one_shot),
        ("map-style reader, sequential (whole file, `av.open` + seek)", map_style_sequential),
        ("map-style reader, random order", map_style_random),
    ]
    for name, function in cases:
        wall, cpu = best_of(repeat, function)
        rows.append(
            f"| {label} | {name} | {wall / total_frames * 1e3:.2f} | {cpu / total_frames * 1e3:.2f} |"
        )
    file_decoder.close()
    return rows


def bench_map_style_samples(dataset: Path, repeat: int) -> list[str]:
    reader = MapStyleLeRobotDataset(root=dataset, return_uint8=True)
    indices = np.random.default_rng(1).permutation(len(reader))[:150].tolist()
    wall, cpu = best_of(repeat, lambda: [reader[i] for i in indices])
    return [
        f"| LeRobot-written (2 cameras + Parquet) | `MapStyleLeRobotDataset[i]`, random i, whole sample "
        f"| {wall / len(indices) * 1e3:.2f} per sample | {cpu / len(indices) * 1e3:.2f} per sample |"
    ]


NOTES = """## How to read these figures

- The 1 h files are 360 stream-copied repeats of a 10 s, 64x64 encode: their sample tables have
  the real size (108 000 samples, H.264 with B-frame ctts runs and the 502-tick joins of the
  LeRobot concatenation) but their payload is tiny, so in section 3 the header share of those
  clips is far above what real cameras give. The header costs about 6 B per sample for AV1
  g=2 (stsz 4 B, stss 2 B) and about 10 B per sample for H.264 with B-frames (stsz, ctts runs,
  stss) plus about 0.8 KB of fixed boxes.
- "parse moov + tables" is the in-memory parse of the moov (box walk, vectorised tables, edit
  rules, index checks); `read_index` adds `info` and the range reads on a local disk.
- "map-style reader" is `lerobot_nodes.mp4.file_video.FileVideoDecoder`, the video path of
  `MapStyleLeRobotDataset` (LeRobot's PyAV backend: whole file, seek to the key frame before the
  query with a 1-tick margin, decode forward, `to_ndarray(format="rgb24")`).
- Clip decoding feeds raw packets to the codec with `thread_count=1` and converts with one
  swscale thread; the map-style reader uses FFmpeg's default threading (auto), which is why its
  CPU time per frame is high on this loaded 2-core machine.
- Random access in a g=30 H.264 clip decodes on average half a GOP per frame, which is what
  separates it from the g=2 AV1 case; sequential access decodes every sample once.
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dataset", type=Path, default=DEFAULT_DATASET, help="a LeRobot-written v3.0 dataset"
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement (best is kept)")
    parser.add_argument("--output", type=Path, help="also write the Markdown report here")
    args = parser.parse_args()

    started = time.time()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-mp4-") as work_dir:
        work = Path(work_dir)
        hour_files = hour_long_files(work)
        h264_path, h264_spans = h264_episodes(work)
        sections = [
            ("1. Sample-table build per hour of video", bench_index(hour_files, args.repeat)),
            ("2. Locating the moov (64 KiB head + 64 KiB tail windows)", bench_locate(hour_files, args.dataset)),
            ("3. Clip overhead (header = ftyp + moov + mdat header)", bench_clip_overhead(args.dataset, hour_files, args.repeat)),
            (
                "4. Decode ms/frame (RGB uint8 CHW tensors, `thread_count=1`)",
                ["| video | access | wall ms/frame | CPU ms/frame |", "|---|---|---|---|"]
                + bench_decode("LeRobot-written AV1 240x320 g=2", args.dataset, f"videos/{CAMERAS[0]}/chunk-000/file-000.mp4", episode_spans(args.dataset, CAMERAS[0]), args.repeat)
                + bench_decode("H.264 240x320, x264 defaults (B-frames, g=30)", h264_path.parent, h264_path.name, h264_spans, args.repeat)
                + bench_map_style_samples(args.dataset, max(1, args.repeat // 2)),
            ),
        ]  # fmt: skip
    load_after = os.getloadavg()
    header = [
        "# lerobot_nodes.mp4 benchmark",
        "",
        f"Command: `{' '.join(['/work/venv/bin/python', *sys.argv])}`",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, PyAV {av.__version__}, numpy {np.__version__}. Load average "
        f"{load_before[0]:.1f} before and {load_after[0]:.1f} after ({time.time() - started:.0f} s run). "
        f"Best of {args.repeat} runs.",
    ]
    body = [line for title, rows in sections for line in ["", f"## {title}", "", *rows]]
    report = "\n".join(header + body + ["", NOTES]) + "\n"
    print(report)
    if args.output:
        args.output.write_text(report)


if __name__ == "__main__":
    main()
