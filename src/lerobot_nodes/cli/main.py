"""``lerobot-nodes``: the project's main command.

``lerobot-nodes demo`` generates the built-in demo dataset on first use (into the LeRobot
cache), then reads it and prints a summary and a few samples.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch


def describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return repr(value)


def run_demo(args: argparse.Namespace) -> int:
    from ..map_style import MapStyleLeRobotDataset
    from ..testing import ensure_demo_dataset

    root = args.root or ensure_demo_dataset()
    dataset = MapStyleLeRobotDataset(root=root, return_uint8=True, delta_timestamps=_act_window(root))
    print(dataset.meta.summary())
    started = time.perf_counter()
    step = max(1, len(dataset) // args.samples)
    for index in range(0, len(dataset), step)[: args.samples]:
        sample = dataset[index]
        keys = ", ".join(f"{k}: {describe_value(v)}" for k, v in sample.items())
        print(f"sample {index} (episode {int(sample['episode_index'])}, frame {int(sample['frame_index'])}): {keys}")
    print(f"read {args.samples} samples in {time.perf_counter() - started:.2f} s")
    return 0


def _act_window(root: Any) -> dict[str, list[float]]:
    from ..meta import load_meta
    from ..sources import open_source

    meta = load_meta(open_source(root))
    window = {"action": [i / meta.fps for i in range(10)]}
    window.update({key: [0.0] for key in meta.video_keys})
    return window


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lerobot-nodes", description=__doc__)
    commands = parser.add_subparsers(dest="command")
    demo = commands.add_parser("demo", help="read the built-in demo dataset and print samples")
    demo.add_argument("--root", default=None, help="a local LeRobot v3 dataset instead of the demo")
    demo.add_argument("--samples", type=int, default=4)
    demo.set_defaults(handler=run_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["demo", *(argv or [])])
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
