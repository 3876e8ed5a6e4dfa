"""Bytes the loopback Hub serves for one streaming epoch, per file kind, against the dataset's bytes.

The dataset mimics a LeRobot-written multi-file one: H.264 GOP 30 with B-frames (x264 defaults),
several cameras, MP4s rolled over into several files with ``moov`` at the end (LeRobot/ffmpeg
without faststart), and data Parquet files rewritten with fixed-size row groups that straddle
episode boundaries (what LeRobot's writers produce, unlike ``write_dataset``'s one row group per
episode). Each run uses a fresh ``HF_LEROBOT_HOME`` (no sidecar or file cache carried over) and
the real huggingface_hub client for revisions and listings.

    python benchmarks/bytes_per_epoch.py                    # 0 and 2 workers on the current src/
    python benchmarks/bytes_per_epoch.py --src /tmp/before/src --label before

Output: per worker count, for parquet (data), mp4, meta and other (API) requests, the bytes served,
the dataset's bytes of that kind, their ratio and the request count.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = "lerobot-nodes/bytes-per-epoch"
CAMERAS = ("observation.images.top", "observation.images.wrist", "observation.images.side")
WINDOW = {"action": [0.0, 1 / 30], "observation.images.top": [-1 / 30, 0.0], "observation.state": [-1 / 30, 0.0]}


def kind_of(path: str) -> str:
    if path.endswith(".mp4"):
        return "mp4"
    if "/meta/" in path or path.startswith("meta/"):
        return "meta"
    if path.endswith(".parquet") and ("/data/" in path or path.startswith("data/")):
        return "parquet"
    return "other"


def restripe_row_groups(root: Path, rows_per_group: int) -> None:
    """Rewrite every data Parquet with ``rows_per_group`` rows per row group (same rows, schema and
    metadata): row groups then hold the end of one episode and the start of the next."""
    import pyarrow.parquet as pq

    for path in sorted((root / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        pq.write_table(table, path, row_group_size=rows_per_group, compression="snappy")


def make_dataset(root: Path, episodes: int, length: int, rows_per_group: int) -> Path:
    from lerobot_nodes.testing import write_dataset

    lengths = [length + (7 * i) % 23 - 11 for i in range(episodes)]
    write_dataset(
        root, episode_lengths=lengths, cameras=CAMERAS, codec="h264", gop=30, video_faststart=False,
        height=96, width=128, video_files_size_in_mb=0.4, data_file_size_in_mb=0.25, seed=5,
    )
    restripe_row_groups(root, rows_per_group)
    return root


def dataset_bytes(root: Path) -> dict[str, int]:
    totals = {"parquet": 0, "mp4": 0, "meta": 0}
    for path in root.rglob("*"):
        if path.is_file() and ".cache" not in path.parts:
            kind = kind_of(path.relative_to(root).as_posix())
            if kind in totals:
                totals[kind] += path.stat().st_size
    return totals


def one_epoch(
    hub: Any, num_workers: int, home: Path, disk_cache_gb: float = 0.0
) -> tuple[dict[str, int], dict[str, int], int, float]:
    os.environ["HF_LEROBOT_HOME"] = str(home)
    from lerobot_nodes.config import StreamingConfig
    from lerobot_nodes.dataset import StreamingLeRobotDataset
    from lerobot_nodes.loader import streaming_dataloader

    config = StreamingConfig(
        streaming_episode_pool_size=2, streaming_prefetch_episodes=2, streaming_disk_cache_gb=disk_cache_gb
    )
    hub.clear_records()
    started = time.perf_counter()
    dataset = StreamingLeRobotDataset(repo_id=REPO, delta_timestamps=WINDOW, return_uint8=True, seed=3, config=config)
    samples = 0
    for batch in streaming_dataloader(dataset, batch_size=8, num_workers=num_workers):
        samples += len(batch["frame_index"])
    seconds = time.perf_counter() - started
    served = {"parquet": 0, "mp4": 0, "meta": 0, "other": 0}
    requests = dict.fromkeys(served, 0)
    for record in list(hub.records):
        kind = kind_of(record.path)
        served[kind] += record.bytes_sent
        requests[kind] += 1
    return served, requests, samples, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", help="put this src/ first on sys.path (e.g. a worktree of the old code)")
    parser.add_argument("--label", default="current")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--length", type=int, default=166)
    parser.add_argument("--rows-per-group", type=int, default=300)
    parser.add_argument("--dataset", help="write the dataset here, or reuse it if already there (default: a temp dir)")
    parser.add_argument("--disk-cache-gb", type=float, default=0.0,
                        help="--dataset.streaming_disk_cache_gb (default 0: the disk cache off)")
    parser.add_argument("--dump", action="store_true", help="print every data-Parquet request (path, range, bytes)")
    args = parser.parse_args(argv)
    if args.src:
        sys.path.insert(0, str(Path(args.src).resolve()))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(args.src).resolve()), os.environ.get("PYTHONPATH", "")])
    for name in ("HF_HUB_DISABLE_XET", "HF_HUB_DISABLE_TELEMETRY"):
        os.environ[name] = "1"
    os.environ.pop("HF_HUB_OFFLINE", None)
    import lerobot_nodes
    from lerobot_nodes.testing.hub import LoopbackHub

    print(f"# {args.label}: lerobot_nodes from {Path(lerobot_nodes.__file__).parent}")
    with tempfile.TemporaryDirectory(prefix="bytes-per-epoch-") as scratch:
        root = Path(args.dataset) if args.dataset else Path(scratch) / "dataset"
        if not (root / "meta" / "info.json").exists():
            make_dataset(root, args.episodes, args.length, args.rows_per_group)
        sizes = dataset_bytes(root)
        import pyarrow.parquet as pq

        files = {k: len([p for p in root.rglob("*") if p.is_file() and kind_of(p.relative_to(root).as_posix()) == k])
                 for k in sizes}
        groups = sum(pq.ParquetFile(p).num_row_groups for p in (root / "data").rglob("*.parquet"))
        print(f"dataset: {args.episodes} episodes, {len(CAMERAS)} cameras, files {files}, {groups} data row groups, "
              f"bytes {sizes}")
        with LoopbackHub() as hub:
            hub.add_dataset(REPO, root)
            os.environ["HF_ENDPOINT"] = hub.endpoint
            print("| workers | kind | served bytes | dataset bytes | served / dataset | requests |")
            print("|---|---|---|---|---|---|")
            for workers in args.workers:
                served, requests, samples, seconds = one_epoch(
                    hub, workers, Path(scratch) / f"home-{workers}", args.disk_cache_gb
                )
                if args.dump:
                    for record in hub.records:
                        if kind_of(record.path) == "parquet":
                            print(f"<!-- {record.origin} {record.path.rsplit('/', 3)[-3:]} {record.range} "
                                  f"{record.bytes_sent} -->")
                for kind in ("parquet", "mp4", "meta", "other"):
                    size = sizes.get(kind, 0)
                    ratio = f"{served[kind] / size:.3f}" if size else "-"
                    print(f"| {workers} | {kind} | {served[kind]:,} | {size:,} | {ratio} | {requests[kind]} |")
                payload = sum(sizes.values())
                total = sum(served.values())
                print(f"| {workers} | **all** | {total:,} | {payload:,} | {total / payload:.3f} | "
                      f"{sum(requests.values())} |")
                print(f"<!-- {workers} workers: {samples} samples in {seconds:.1f} s -->")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
