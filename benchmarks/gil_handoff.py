"""What one interpreter lock hand-off costs the decode path: each operation alone, then beside a
thread that only runs Python.

    /work/venv/bin/python benchmarks/gil_handoff.py [--video PATH]

The operations are the ones a decode thread runs per frame: ``decode`` (100 packets through a
fresh single-threaded codec context), ``reformat`` (60 frames to planar RGB with one swscale
context) and ``copy`` (60 frames' three planes copied into a CHW array with numpy). Each releases
the lock inside and must take it back afterwards; beside a Python thread that holds it, taking it
back waits for that thread to give it up (at the latest after ``sys.getswitchinterval()``).
Prints operations per second alone and beside the spinner, and the spinner's own rate.
"""

from __future__ import annotations

import argparse
import glob
import sys
import threading
import time
from collections.abc import Callable

import av
import numpy as np
from av.video.reformatter import VideoReformatter

DEFAULT_VIDEO_GLOB = "/work/shared/datasets/lerobot-writer-small/videos/*/chunk-000/file-000.mp4"


def operations(path: str) -> dict[str, Callable[[], None]]:
    with av.open(path) as container:
        stream = container.streams.video[0]
        codec, extradata = stream.codec_context.name, stream.codec_context.extradata
        packets = [packet for packet in container.demux(stream) if packet.size][:100]
    decoder_name = "libdav1d" if codec == "av1" else codec

    def new_context() -> av.VideoCodecContext:
        context = av.CodecContext.create(decoder_name, "r")
        context.extradata = extradata
        context.thread_count = 1
        return context  # type: ignore[return-value]

    context = new_context()
    frames = [frame for packet in packets[:60] for frame in context.decode(packet)]
    reformatter = VideoReformatter()
    converted = reformatter.reformat(frames[0], format="gbrp", threads=1)
    out = np.empty((3, converted.height, converted.width), dtype=np.uint8)

    def decode() -> None:
        fresh = new_context()
        for packet in packets:
            fresh.decode(packet)

    def reformat() -> None:
        for frame in frames:
            reformatter.reformat(frame, format="gbrp", threads=1)

    def copy() -> None:
        for _ in frames:
            for channel, index in enumerate((2, 0, 1)):
                plane = converted.planes[index]
                rows = np.frombuffer(memoryview(plane), dtype=np.uint8, count=plane.height * plane.line_size)
                out[channel] = rows.reshape(plane.height, plane.line_size)[:, : converted.width]

    return {"decode": decode, "reformat": reformat, "copy": copy}


def _rate(operation: Callable[[], None], seconds: float) -> float:
    started, count = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        operation()
        count += 1
    return count / (time.perf_counter() - started)


def _spin(stop: threading.Event, counts: list[int]) -> None:
    count = 0
    while not stop.is_set():
        count += 1
    counts.append(count)


def beside_spinner(operation: Callable[[], None] | None, seconds: float) -> tuple[float, float]:
    """(operations/s, spinner loops/s) while a pure-Python thread spins."""
    stop, counts = threading.Event(), []
    spinner = threading.Thread(target=_spin, args=(stop, counts))
    started = time.perf_counter()
    spinner.start()
    rate = _rate(operation, seconds) if operation is not None else (time.sleep(seconds) or 0.0)
    stop.set()
    spinner.join()
    return rate, counts[0] / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--video", help="an MP4 (default: the small dataset's first camera file)")
    parser.add_argument("--seconds", type=float, default=1.5)
    args = parser.parse_args()
    path = args.video or sorted(glob.glob(DEFAULT_VIDEO_GLOB))[0]
    _, spinner_alone = beside_spinner(None, args.seconds)
    print(f"{path}; switch interval {sys.getswitchinterval() * 1e3:.1f} ms; spinner alone {spinner_alone:.3g} loops/s")
    print("| operation | alone /s | beside the spinner /s | ratio | spinner's rate vs alone |")
    print("|---|---|---|---|---|")
    for name, operation in operations(path).items():
        alone = _rate(operation, args.seconds)
        beside, spinner = beside_spinner(operation, args.seconds)
        print(f"| {name} | {alone:.1f} | {beside:.1f} | {beside / alone:.2f} | {spinner / spinner_alone:.2f} |")


if __name__ == "__main__":
    main()
