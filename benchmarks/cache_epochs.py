"""Bytes and requests the loopback Hub serves per epoch (1-3), with the disk byte cache off and on.

Two datasets written by ``lerobot_nodes.testing.write_dataset`` stand for what LeRobot writes: AV1
with ``g=2`` (LeRobot's encoder settings) and H.264 GOP 30 with B-frames (x264 defaults), several
MP4 files per camera (``moov`` at the end for H.264), several data files. Each configuration gets
a fresh ``HF_LEROBOT_HOME`` and a fresh Hub; one ``StreamingLeRobotDataset`` then runs three
epochs with DataLoader workers. "open" is the dataset's construction (revision, listing,
metadata, MP4 index build); "restart" is a second dataset object on the same cache (a resumed or
restarted job) running one more epoch.

    python benchmarks/cache_epochs.py                       # both codecs, 2 workers
    python benchmarks/cache_epochs.py --episodes 8 --workers 0
    python benchmarks/cache_epochs.py --episodes 48 --height 240 --width 320 --video-file-mb 4   # multi-block MP4s

Columns: requests (every request: API and payload), payload requests (resolve + CDN), MB served
(response bodies), the dataset's MB, seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = "lerobot-nodes/cache-epochs"
CAMERAS = ("observation.images.top", "observation.images.wrist")
WINDOW = {"action": [0.0, 1 / 30], "observation.images.top": [-1 / 30, 0.0], "observation.state": [-1 / 30, 0.0]}
CODECS = {
    "av1-g2": {"codec": "av1", "gop": 2, "video_faststart": True},
    "h264-gop30-bframes": {"codec": "h264", "gop": 30, "video_faststart": False},
}


def make_dataset(root: Path, codec: str, episodes: int, length: int, height: int, width: int, video_mb: float) -> Path:
    from lerobot_nodes.testing import write_dataset

    lengths = [length + (7 * i) % 23 - 11 for i in range(episodes)]
    return write_dataset(
        root, episode_lengths=lengths, cameras=CAMERAS, height=height, width=width, video_files_size_in_mb=video_mb,
        data_file_size_in_mb=0.05, seed=5, **CODECS[codec],
    )


def run(root: Path, cache_on: bool, workers: int, epochs: int) -> list[tuple[str, int, int, int, float]]:
    """Rows ``(phase, requests, payload requests, bytes served, seconds)``."""
    from lerobot_nodes.config import StreamingConfig
    from lerobot_nodes.dataset import StreamingLeRobotDataset
    from lerobot_nodes.loader import streaming_dataloader
    from lerobot_nodes.testing.hub import LoopbackHub

    config = StreamingConfig(streaming_episode_pool_size=4, streaming_disk_cache_gb=None if cache_on else 0)
    rows = []
    with tempfile.TemporaryDirectory() as home, LoopbackHub() as hub:
        os.environ["HF_LEROBOT_HOME"] = home
        os.environ["HF_ENDPOINT"] = hub.endpoint
        hub.add_dataset(REPO, root)

        def measured(phase: str, action) -> None:  # type: ignore[no-untyped-def]
            hub.clear_records()
            started = time.perf_counter()
            action()
            records = list(hub.records)
            payload = [r for r in records if r.origin == "cdn" or "/resolve/" in r.path]
            rows.append((phase, len(records), len(payload), sum(r.bytes_sent for r in records),
                         time.perf_counter() - started))

        def open_dataset():  # type: ignore[no-untyped-def]
            return StreamingLeRobotDataset(repo_id=REPO, delta_timestamps=WINDOW, return_uint8=True, seed=3, config=config)

        def epoch(dataset) -> None:  # type: ignore[no-untyped-def]
            for _ in streaming_dataloader(dataset, batch_size=8, num_workers=workers):
                pass

        datasets = []
        measured("open", lambda: datasets.append(open_dataset()))
        for index in range(1, epochs + 1):
            measured(f"epoch {index}", lambda: epoch(datasets[0]))
        measured("restart", lambda: epoch(open_dataset()))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", nargs="+", default=list(CODECS), choices=list(CODECS))
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--length", type=int, default=90, help="frames per episode (about)")
    parser.add_argument("--height", type=int, default=192)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--video-file-mb", type=float, default=1.0, help="MP4 rollover size")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.pop("HF_HUB_OFFLINE", None)
    print("| dataset | cache | phase | requests | payload requests | MB served | dataset MB | s |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as scratch:
        for codec in args.codecs:
            root = make_dataset(
                Path(scratch) / codec, codec, args.episodes, args.length, args.height, args.width, args.video_file_mb
            )
            files = [p for p in root.rglob("*") if p.is_file()]
            size = sum(p.stat().st_size for p in files)
            mp4s = len([p for p in files if p.suffix == ".mp4"])
            parquets = len([p for p in files if p.suffix == ".parquet" and "data" in p.parts])
            label = f"{codec} ({mp4s} mp4, {parquets} data parquet)"
            for cache_on in (False, True):
                for phase, requests, payload, served, seconds in run(root, cache_on, args.workers, args.epochs):
                    print(f"| {label} | {'on' if cache_on else 'off'} | {phase} | {requests} | {payload} | "
                          f"{served / 1e6:.2f} | {size / 1e6:.2f} | {seconds:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
