"""``lerobot-nodes``: the project's main command.

``lerobot-nodes stream`` (also the default with no command) streams a dataset through
``StatefulDataLoader`` as LeRobot training does; with no ``--dataset.root`` it uses the
built-in demo dataset, generated into the LeRobot cache on first use. ``lerobot-nodes
inspect`` summarises a dataset and its MP4 sidecar and lists every way its metadata disagrees
with its videos (exit status 1 if any); ``lerobot-nodes demo`` reads a few samples with the
map-style reader. SIGTERM and SIGINT stop a command cleanly: one line on stderr, exit status
128 + the signal.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from .signals import Stopped, stopping_on_signals


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


def run_stream_command(args: argparse.Namespace) -> int:
    from .flags import split_flags
    from .stream import run_stream

    dataset, streaming, training, rest = split_flags(args.flags)
    if rest:
        raise SystemExit(f"lerobot-nodes stream: unknown arguments {rest}; flags look like --dataset.root=PATH")
    return run_stream(
        dataset,
        streaming,
        training,
        window=args.window,
        save_checkpoint=args.save_checkpoint,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        record=args.record,
        quiet=args.quiet,
    )


def run_inspect(args: argparse.Namespace) -> int:
    from ..meta import load_meta
    from ..sources.resolve import open_source
    from ..testing import ensure_demo_dataset
    from ..video_checks import video_problems
    from .flags import split_flags

    dataset, _, _, _ = split_flags(args.flags)
    root = dataset.get("root")
    if root is None and dataset.get("repo_id") is None:
        root = str(ensure_demo_dataset())
    source = open_source(
        root, repo_id=dataset.get("repo_id"), revision=dataset.get("revision"), repo_type=dataset.get("repo_type", "dataset")
    )
    meta = load_meta(source)
    print(meta.summary())
    indexes, description = open_sidecar(source, meta)
    print(description)
    problems = video_problems(meta, indexes, range(len(meta.episodes)), float(dataset.get("tolerance_s", 1e-4)))
    print(describe_video_problems(meta, problems))
    return 1 if problems else 0


def open_sidecar(source: Any, meta: Any) -> tuple[dict[str, Any], str]:
    """The MP4 index of every video file, opened (or built) from the sidecar cache, and where each came from."""
    from ..sidecar import SidecarCache

    paths = meta.video_files()
    if not paths:
        return {}, "MP4 sidecar: the dataset has no videos"
    started = time.perf_counter()
    indexes, report = SidecarCache().open(source, paths, dataset_id=meta.repo_id)
    samples = sum(len(index.sizes) for index in indexes.values())
    nbytes = sum(sum(array.nbytes for array in vars(index).values() if hasattr(array, "nbytes")) for index in indexes.values())
    lines = [
        f"MP4 sidecar: {len(indexes)} video files, {samples} samples, opened in {time.perf_counter() - started:.3f} s",
        f"  reused {len(report.reused)}, converted from a published sidecar {len(report.converted)}, "
        f"built {len(report.built)}{' (in memory: the store has no stable identities)' if report.in_memory else ''}",
        f"  index arrays: {nbytes / max(1, samples):.1f} bytes per frame",
    ]
    lines += [f"  rebuilt {path}: {reason}" for path, reason in report.stale.items()]
    return indexes, "\n".join(lines)


def describe_video_problems(meta: Any, problems: list[str]) -> str:
    """The result of the metadata-against-video checks (``lerobot_nodes.video_checks``)."""
    if not meta.video_keys:
        return "video metadata: no videos to check"
    if not problems:
        return (
            f"video metadata: the camera info of {len(meta.video_keys)} cameras and the video spans of "
            f"{len(meta.episodes)} episodes agree with the MP4 streams"
        )
    return "\n".join([f"video metadata: {len(problems)} problem(s)", *(f"  {problem}" for problem in problems)])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lerobot-nodes", description=__doc__)
    commands = parser.add_subparsers(dest="command")
    stream = commands.add_parser(
        "stream",
        help="stream a dataset (default: the built-in demo) through StatefulDataLoader like training does",
        description="Flags as LeRobot users type them: --dataset.root=PATH --dataset.repo_id=OWNER/NAME "
        "--dataset.streaming_episode_pool_size=16 --batch_size=8 --num_workers=2 --steps=100 --seed=1000 ...",
    )
    stream.add_argument("flags", nargs="*", help="--dataset.*, --batch_size, --num_workers, --steps, --seed, --log_freq")
    stream.add_argument("--window", choices=("none", "act", "diffusion"), default="act")
    stream.add_argument("--save-checkpoint", default=None, help="save the loader state after the last step")
    stream.add_argument("--checkpoint-every", type=int, default=0, help="also save every N steps")
    stream.add_argument("--resume", default=None, help="continue from a checkpoint saved by --save-checkpoint")
    stream.add_argument("--record", default=None, help="append the (episode, frame) of every sample to this file")
    stream.add_argument("--quiet", action="store_true")
    stream.set_defaults(handler=run_stream_command)
    inspect = commands.add_parser("inspect", help="summarise a dataset and its MP4 sidecar index, and check its metadata against its videos")
    inspect.add_argument("flags", nargs="*", help="--dataset.root=PATH or --dataset.repo_id=OWNER/NAME")
    inspect.set_defaults(handler=run_inspect)
    demo = commands.add_parser("demo", help="read the built-in demo dataset and print samples")
    demo.add_argument("--root", default=None, help="a local LeRobot v3 dataset instead of the demo")
    demo.add_argument("--samples", type=int, default=4)
    demo.set_defaults(handler=run_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("--"):
        argv = ["stream", *argv]
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if args.command in ("stream", "inspect"):
            args.flags = [*args.flags, *unknown]
        else:
            parser.error(f"unknown arguments {unknown}")
    with stopping_on_signals():
        try:
            return int(args.handler(args))
        except Stopped as stop:
            print(stop.message(f"lerobot-nodes {args.command}"), file=sys.stderr)
            return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())
