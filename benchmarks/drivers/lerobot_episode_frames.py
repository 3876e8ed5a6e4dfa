"""Dump what loader D (LeRobot's episode-streaming branch) returns for every camera frame.

Runs under D's venv (``/work/lerobot-episode-venv``); called by ``benchmarks/frame_exactness.py``.
Iterates ``StreamingLeRobotDataset(repo_id, root=..., return_uint8=True)`` once (no window, no
DataLoader, ``repeat=False``, training's streaming defaults otherwise) and writes, per sample,
``episode_index``, ``frame_index`` and a thumbnail of each camera frame (mean of 8x8 pixel blocks,
float32) to an ``.npz``. A decoding error ends the pass; it is written out with what came before.

    python lerobot_episode_frames.py ROOT OUT.npz [--video-backend torchcodec|pyav] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import numpy as np
import torch
from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

BLOCK = 8


def thumbnail(frame: torch.Tensor) -> np.ndarray:
    """(3, H, W) uint8 -> (3, H/8, W/8) float32 block means."""
    c, h, w = frame.shape
    x = frame.to(torch.float32).reshape(c, h // BLOCK, BLOCK, w // BLOCK, BLOCK)
    return x.mean(dim=(2, 4)).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--video-backend", default=None)
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    dataset = StreamingLeRobotDataset(
        "local/" + args.root.rstrip("/").rsplit("/", 1)[-1],
        root=args.root,
        max_num_shards=1,
        return_uint8=True,
        video_backend=args.video_backend,
        episode_pool_size=32,
        prefetch_episodes=8,
        decode_threads=2,
        decoded_queue_size=8,
    )
    cameras = list(dataset.meta.video_keys)
    episodes: list[int] = []
    frames: list[int] = []
    thumbs: dict[str, list[np.ndarray]] = {key: [] for key in cameras}
    error = None
    try:
        for i, item in enumerate(dataset):
            if args.limit is not None and i >= args.limit:
                break
            episodes.append(int(item["episode_index"]))
            frames.append(int(item["frame_index"]))
            for key in cameras:
                thumbs[key].append(thumbnail(item[key]))
    except Exception as exc:  # recorded, not raised: the caller reports it
        error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    np.savez(
        args.out,
        episode_index=np.asarray(episodes, dtype=np.int64),
        frame_index=np.asarray(frames, dtype=np.int64),
        **{f"thumb:{key}": np.stack(v) if v else np.zeros((0,)) for key, v in thumbs.items()},
    )
    print(
        json.dumps(
            {
                "samples": len(episodes),
                "cameras": cameras,
                "video_backend": dataset._video_backend,
                "error": error,
                "seconds": time.perf_counter() - started,
            }
        )
    )


if __name__ == "__main__":
    main()
