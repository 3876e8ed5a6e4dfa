"""Which frame does each loader return? Frame exactness of loader D (and this project's map-style
reader) against a sequential decode, on any LeRobot v3.0 dataset (meant for the long-GOP one).

    /work/venv/bin/python benchmarks/frame_exactness.py --dataset long-gop
    /work/venv/bin/python benchmarks/frame_exactness.py --root /path/to/dataset --backends torchcodec pyav

Golden: each camera MP4 decoded once from its first frame with PyAV, in presentation order; the
frame of episode ``e``, frame index ``f`` is file frame ``round(from_timestamp * fps) + f``.
Frames are compared as thumbnails (mean of 8x8 pixel blocks) so the whole dataset fits in memory
and different RGB conversions (PyAV here, torchcodec in D) do not matter: for every camera frame a
loader returns, the golden frames of the same episode at offsets -4..+4 are searched for the nearest
one (mean absolute difference); the offset of the nearest is the loader's error in frames (0 =
exact). Consecutive frames of the synthetic footage differ by several grey levels on average, the
same frame decoded by two FFmpeg builds by well under one, so the nearest offset is unambiguous
(``dist`` figures in the output show both).

* ``lerobot_nodes.MapStyleLeRobotDataset`` (this venv) is checked for every sample (``--no-mapstyle``
  skips it);
* loader D runs in its own venv (``drivers/lerobot_episode_frames.py``), once per ``--backends``
  entry (torchcodec: its default here; pyav: its fallback decoder).

Writes a JSON summary to ``--out`` (default ``/work/bench-data/frame-exactness/<dataset>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402

EPISODE_PYTHON = Path(os.environ.get("LRN_LEROBOT_EPISODE_PYTHON", "/work/lerobot-episode-venv/bin/python"))
BLOCK = 8
OFFSETS = range(-4, 5)
# Picture type (I, P, B, ...) of every golden frame: camera -> (episode row, frame index) -> type.
PICTURE_TYPES: dict[str, dict[tuple[int, int], str]] = {}
# FFmpeg's AVPictureType values (PyAV 18 hands them over as plain ints).
PICTURE_TYPE_NAMES = {0: "none", 1: "I", 2: "P", 3: "B", 4: "S", 5: "SI", 6: "SP", 7: "BI"}


def thumbnail_chw(frame: np.ndarray) -> np.ndarray:
    c, h, w = frame.shape
    return frame.astype(np.float32).reshape(c, h // BLOCK, BLOCK, w // BLOCK, BLOCK).mean(axis=(2, 4))


def golden(root: Path, info: dict, episodes: dict[str, list]) -> dict[str, np.ndarray]:
    """Per camera: (episodes, max length, 3, H/8, W/8) thumbnails from a sequential decode."""
    import av

    fps = info["fps"]
    cameras = [k for k, v in info["features"].items() if v.get("dtype") == "video"]
    n = len(episodes["episode_index"])
    longest = max(episodes["length"])
    out: dict[str, np.ndarray] = {}
    for camera in cameras:
        files: dict[tuple[int, int], dict[int, np.ndarray]] = {}
        file_types: dict[tuple[int, int], dict[int, str]] = {}
        for i in range(n):
            key = (episodes[f"videos/{camera}/chunk_index"][i], episodes[f"videos/{camera}/file_index"][i])
            if key in files:
                continue
            path = root / info["video_path"].format(video_key=camera, chunk_index=key[0], file_index=key[1])
            frames: dict[int, np.ndarray] = {}
            types: dict[int, str] = {}
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                for frame in container.decode(stream):
                    index = round(float(frame.pts * stream.time_base) * fps)
                    frames[index] = thumbnail_chw(frame.to_ndarray(format="rgb24").transpose(2, 0, 1))
                    types[index] = PICTURE_TYPE_NAMES.get(
                        int(frame.pict_type), getattr(frame.pict_type, "name", str(frame.pict_type))
                    )
            files[key] = frames
            file_types[key] = types
        first = next(iter(next(iter(files.values())).values()))
        table = np.full((n, longest, *first.shape), np.nan, dtype=np.float32)
        for i in range(n):
            key = (episodes[f"videos/{camera}/chunk_index"][i], episodes[f"videos/{camera}/file_index"][i])
            start = round(episodes[f"videos/{camera}/from_timestamp"][i] * fps)
            for f in range(episodes["length"][i]):
                table[i, f] = files[key][start + f]
                PICTURE_TYPES.setdefault(camera, {})[(i, f)] = file_types[key][start + f]
        out[camera] = table
    return out


def classify(
    table: np.ndarray,
    lengths: list[int],
    episode_row: np.ndarray,
    frame_index: np.ndarray,
    thumbs: np.ndarray,
    types: dict[tuple[int, int], str] | None = None,
) -> dict[str, Any]:
    """Offset of the nearest golden frame for each returned frame."""
    offsets = np.zeros(len(frame_index), dtype=np.int64)
    dist_exact = np.zeros(len(frame_index), dtype=np.float32)
    dist_best = np.zeros(len(frame_index), dtype=np.float32)
    dist_next = np.zeros(len(frame_index), dtype=np.float32)
    for j, (row, f) in enumerate(zip(episode_row, frame_index, strict=True)):
        candidates = []
        for k in OFFSETS:
            g = f + k
            if 0 <= g < lengths[row]:
                candidates.append((float(np.abs(table[row, g] - thumbs[j]).mean()), k))
        candidates.sort()
        dist_best[j], offsets[j] = candidates[0]
        dist_next[j] = candidates[1][0] if len(candidates) > 1 else np.nan
        dist_exact[j] = next(d for d, k in candidates if k == 0)
    values, counts = np.unique(offsets, return_counts=True)
    wrong = int((offsets != 0).sum())
    by_episode: dict[int, list[int]] = {}
    by_type: dict[str, dict[int, int]] = {}
    for row, f, offset in zip(episode_row, frame_index, offsets, strict=True):
        entry = by_episode.setdefault(int(row), [0, 0])
        entry[0] += int(offset != 0)
        entry[1] += 1
        if types is not None:
            counts_of_type = by_type.setdefault(types[(int(row), int(f))], {})
            counts_of_type[int(offset)] = counts_of_type.get(int(offset), 0) + 1
    return {
        "frames": len(offsets),
        "wrong": wrong,
        "wrong_by_episode_row": {k: f"{w}/{n}" for k, (w, n) in sorted(by_episode.items())},
        "offsets_by_picture_type": {k: dict(sorted(v.items())) for k, v in sorted(by_type.items())},
        "wrong_fraction": wrong / len(offsets) if len(offsets) else None,
        "offsets": {int(v): int(c) for v, c in zip(values, counts, strict=True)},
        "dist_exact_median": float(np.median(dist_exact)) if len(offsets) else None,
        "dist_best_median": float(np.median(dist_best)) if len(offsets) else None,
        "dist_best_max": float(dist_best.max()) if len(offsets) else None,
        "dist_second_best_median": float(np.nanmedian(dist_next)) if len(offsets) else None,
        "dist_second_best_min": float(np.nanmin(dist_next)) if len(offsets) else None,
    }


def summarize(per_camera: dict[str, dict[str, Any]]) -> dict[str, Any]:
    frames = sum(c["frames"] for c in per_camera.values())
    wrong = sum(c["wrong"] for c in per_camera.values())
    offsets: dict[int, int] = {}
    for c in per_camera.values():
        for k, v in c["offsets"].items():
            offsets[k] = offsets.get(k, 0) + v
    return {
        "frames": frames,
        "wrong": wrong,
        "wrong_fraction": wrong / frames if frames else None,
        "offsets": dict(sorted(offsets.items())),
        "per_camera": per_camera,
    }


def check_mapstyle(
    root: Path, repo_id: str, tables: dict, row_of: dict[int, int], lengths: list[int], limit: int | None
) -> dict:
    from lerobot_nodes import MapStyleLeRobotDataset

    dataset = MapStyleLeRobotDataset(repo_id, root=root, return_uint8=True)
    cameras = list(tables)
    rows, frames = [], []
    thumbs: dict[str, list[np.ndarray]] = {c: [] for c in cameras}
    for i in range(len(dataset) if limit is None else min(limit, len(dataset))):
        item = dataset[i]
        rows.append(row_of[int(item["episode_index"])])
        frames.append(int(item["frame_index"]))
        for camera in cameras:
            thumbs[camera].append(thumbnail_chw(item[camera].numpy()))
    rows_a, frames_a = np.asarray(rows), np.asarray(frames)
    return summarize(
        {
            c: classify(tables[c], lengths, rows_a, frames_a, np.stack(thumbs[c]), PICTURE_TYPES.get(c))
            for c in cameras
        }
    )


def check_d(
    root: Path,
    tables: dict,
    row_of: dict[int, int],
    lengths: list[int],
    backend: str,
    work: Path,
    limit: int | None,
) -> dict:
    out = work / f"d-{backend}.npz"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD")}
    env.update(
        {
            "HF_HOME": str(bench_data.BENCH_DATA / "hf-home"),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    started = time.perf_counter()
    proc = subprocess.run(
        [
            str(EPISODE_PYTHON),
            str(HERE / "drivers" / "lerobot_episode_frames.py"),
            str(root),
            str(out),
            "--video-backend",
            backend,
            *(["--limit", str(limit)] if limit is not None else []),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    (work / f"d-{backend}.log").write_text(proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"backend": backend, "error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-1500:]}
    run = json.loads(lines[-1])
    data = np.load(out)
    rows_a = np.asarray([row_of[int(e)] for e in data["episode_index"]])
    frames_a = data["frame_index"]
    result: dict[str, Any] = {"backend": backend, **run, "wall_s": time.perf_counter() - started}
    if len(frames_a):
        result.update(
            summarize(
                {
                    c: classify(
                        tables[c], lengths, rows_a, frames_a, data[f"thumb:{c}"], PICTURE_TYPES.get(c)
                    )
                    for c in tables
                }
            )
        )
    if run.get("error"):
        result["stderr_tail"] = proc.stderr[-1500:]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", choices=["small", "large", "long-gop"], default="long-gop")
    parser.add_argument("--root", type=Path, help="any local dataset instead of --dataset")
    parser.add_argument(
        "--backends", nargs="*", default=["torchcodec", "pyav"], help="loader D video backends"
    )
    parser.add_argument("--mapstyle", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--limit", type=int, help="check only this many samples per loader (default: all)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.root:
        root = args.root
    elif args.dataset == "small":
        root = bench_data.small_dataset().root
    elif args.dataset == "large":
        root = bench_data.ensure_large_dataset().root
    else:
        root = bench_data.ensure_long_gop_dataset().root
    root = root.resolve()
    name = root.name
    work = bench_data.BENCH_DATA / "frame-exactness" / name
    work.mkdir(parents=True, exist_ok=True)
    out = args.out or bench_data.BENCH_DATA / "frame-exactness" / f"{name}.json"

    sys.path.insert(0, str(HERE))
    from run import _episodes_table  # the harness's episode table reader

    info = json.loads((root / "meta" / "info.json").read_text())
    episodes = _episodes_table(root)
    row_of = {int(e): i for i, e in enumerate(episodes["episode_index"])}
    lengths = [int(x) for x in episodes["length"]]
    t0 = time.perf_counter()
    tables = golden(root, info, episodes)
    report: dict[str, Any] = {
        "dataset": str(root),
        "golden": "sequential PyAV decode, presentation order",
        "golden_s": time.perf_counter() - t0,
        "camera_frames": sum(lengths) * len(tables),
        "limit": args.limit,
    }
    print(f"golden: {report['golden_s']:.0f} s", flush=True)
    if args.mapstyle:
        t0 = time.perf_counter()
        report["lerobot_nodes_mapstyle"] = check_mapstyle(
            root, f"local/{name}", tables, row_of, lengths, args.limit
        )
        report["lerobot_nodes_mapstyle"]["wall_s"] = time.perf_counter() - t0
        m = report["lerobot_nodes_mapstyle"]
        print(f"MapStyleLeRobotDataset: {m['wrong']}/{m['frames']} wrong, offsets {m['offsets']}", flush=True)
    report["loader_d"] = []
    for backend in args.backends:
        d = check_d(root, tables, row_of, lengths, backend, work, args.limit)
        report["loader_d"].append(d)
        print(
            f"D ({backend}): {d.get('wrong')}/{d.get('frames')} wrong "
            f"({(d.get('wrong_fraction') or 0):.1%}), offsets {d.get('offsets')}, error {d.get('error')}",
            flush=True,
        )
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
