"""The decode limit: raw PyAV decode throughput of a dataset's videos on this machine.

Sequential decode of each camera's MP4 from its first frame, every frame converted with
``frame.to_ndarray(format="rgb24")`` (what every loader here does before handing a frame on):

* ``single``: one process, decoder ``thread_count=1``;
* ``per_core``: one such process per core (``os.cpu_count()``), all at once, frames summed;
* ``auto_threads``: one process, FFmpeg's default threading (``thread_count=0``), for reference;
* ``cpu_limit_fps``: ``single`` frames per CPU-second times the number of cores, the limit an idle
  machine would show (this figure does not drop when other programs share the machine).

Loader throughput is then given as a fraction of the limit (the most frames per second this
machine can turn into RGB arrays): ``samples/s * frames per sample / limit fps``.

    /work/venv/bin/python benchmarks/decode_limit.py --root /work/shared/datasets/lerobot-writer-small
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import av


def video_files(root: Path) -> list[Path]:
    info = json.loads((root / "meta" / "info.json").read_text())
    cameras = [key for key, spec in info["features"].items() if spec.get("dtype") == "video"]
    files: list[Path] = []
    for camera in cameras:
        files.extend(sorted((root / "videos" / camera).rglob("*.mp4")))
    return files


def decode(path: Path, seconds: float, thread_count: int) -> dict[str, float]:
    """Decode ``path`` from the start (looping if it is short) for about ``seconds``."""
    frames = 0
    pixels = 0
    cpu_start = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = thread_count
            if thread_count == 0:
                stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                array = frame.to_ndarray(format="rgb24")
                frames += 1
                pixels = array.shape[0] * array.shape[1]
                if frames % 16 == 0 and time.perf_counter() >= deadline:
                    break
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    return {
        "frames": frames,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "fps": frames / elapsed,
        "fps_per_cpu_second": frames / cpu,
        "pixels": pixels,
    }


def _worker(path: str, seconds: float, thread_count: int) -> None:
    print(json.dumps(decode(Path(path), seconds, thread_count)))


def per_core(files: list[Path], seconds: float, processes: int) -> dict[str, float]:
    """``processes`` decoders at once, one per core, each on its own file when there are enough."""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", str(files[i % len(files)]), "--seconds", str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    start = time.perf_counter()
    results = [json.loads(proc.communicate()[0]) for proc in procs]
    wall = time.perf_counter() - start
    frames = sum(r["frames"] for r in results)
    # Each worker ran for ``seconds``; their own rates add up (start-up skew is excluded).
    return {
        "processes": processes,
        "frames": frames,
        "fps": sum(r["fps"] for r in results),
        "wall_s": wall,
        "per_process_fps": [r["fps"] for r in results],
    }


def measure(root: Path, seconds: float) -> dict:
    files = video_files(root)
    if not files:
        raise SystemExit(f"no videos under {root}")
    single = [decode(path, seconds / len(files), 1) | {"file": str(path.relative_to(root))} for path in files]
    frames = sum(r["frames"] for r in single)
    single_fps = frames / sum(r["seconds"] for r in single)
    single_cpu_fps = frames / sum(r["cpu_seconds"] for r in single)
    auto = decode(files[0], seconds / 2, 0)
    cores = os.cpu_count() or 1
    return {
        "dataset": str(root),
        "pyav": av.__version__,
        "codec": av.open(str(files[0])).streams.video[0].codec_context.name,
        "files": [str(p.relative_to(root)) for p in files],
        "single": {"fps": single_fps, "fps_per_cpu_second": single_cpu_fps, "files": single},
        "per_core": per_core(files, seconds, cores),
        # What all cores could do if nothing else ran: one thread's frames per CPU-second times the
        # cores. It does not drop when other programs load the machine, unlike the wall-clock figures.
        "cpu_limit_fps": single_cpu_fps * cores,
        "auto_threads": auto,
        "cores": cores,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, help="dataset root")
    parser.add_argument("--seconds", type=float, default=8.0, help="decode time per measurement")
    parser.add_argument("--out", type=Path, help="write the JSON result here too")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.seconds, args.threads)
        return
    if args.root is None:
        parser.error("--root is required")
    result = measure(args.root, args.seconds)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
