"""``lerobot-nodes``: the project's main command.

``lerobot-nodes stream`` (also the default with no command) streams a dataset through
``StatefulDataLoader`` as LeRobot training does; with no ``--dataset.root`` it uses the
built-in demo dataset, generated into the LeRobot cache on first use. ``lerobot-nodes
inspect`` summarises a dataset and its MP4 sidecar and lists every way its metadata disagrees
with its videos (exit status 1 if any); ``lerobot-nodes demo`` reads a few samples with the
map-style reader; ``lerobot-nodes cache list|clear`` shows or removes the local index and
metadata caches; ``lerobot-nodes train`` runs LeRobot's own ``lerobot-train`` with every flag, streaming
through this package with ``--dataset.streaming=true`` (``cli.train``). SIGTERM and SIGINT stop a command cleanly: one line on stderr, exit status
128 + the signal.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ..errors import ConfigError
from .console import (
    DEBUG_ENV,
    DEBUG_FLAG,
    VERBOSE_FLAGS,
    ArgumentParser,
    debug_requested,
    exit_process,
    one_line_warnings,
    option_strings,
    plural,
    quiet_http_client_logs,
    run_reporting_errors,
    unrecognized_arguments,
)
from .limits import system_allocator_under_address_limit
from .signals import dump_stacks_on_signal, run_until_stopped

# Nothing here imports torch, pyarrow or the streaming code at module level: --help and usage errors
# answer in a fraction of a second; each command imports what it runs (tests/cli/test_cli_startup.py).

PROG = "lerobot-nodes"
COMMANDS = ("stream", "inspect", "demo", "cache", "train")
DEFAULT_COMMAND = "stream"
FLAG_COMMANDS = ("stream", "inspect")
"""Commands that take LeRobot-style flags (``--dataset.root=PATH``)."""
INSPECT_FLAGS = ("root", "repo_id", "revision", "episodes", "tolerance_s")


def describe_value(value: Any) -> str:
    import torch

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
    print(f"read {plural(args.samples, 'sample')} in {time.perf_counter() - started:.2f} s")
    return 0


def _act_window(root: Any) -> dict[str, list[float]]:
    from ..format.meta import load_meta
    from ..sources import open_source

    meta = load_meta(open_source(root))
    window = {"action": [i / meta.fps for i in range(10)]}
    window.update({key: [0.0] for key in meta.video_keys})
    return window


def run_stream_command(args: argparse.Namespace) -> int:
    from .stream import run_stream

    return run_stream(
        args.dataset,
        args.streaming,
        args.training,
        window=args.window,
        save_checkpoint=args.save_checkpoint,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        record=args.record,
        quiet=args.quiet,
    )


def run_inspect(args: argparse.Namespace) -> int:
    """The dataset doctor: the summary, the MP4 sidecar, then every check of ``dataset_doctor``
    and ``video_checks`` (and, with ``--decode``, every frame decoded); exit 1 on an error."""
    from ..dataset_doctor import check_dataset, episodes_to_skip
    from ..format.meta import load_meta, select_episodes
    from ..sources.resolve import open_source
    from ..testing import ensure_demo_dataset
    from ..video_checks import span_overflows, video_problems

    ignored = [f"--dataset.{name}" for name in (*args.dataset, *args.streaming) if name not in INSPECT_FLAGS]
    ignored += [f"--{name}" for name in args.training]
    if ignored:
        known = ", ".join(f"--dataset.{name}" for name in INSPECT_FLAGS)
        raise ConfigError(f"inspect does not take {', '.join(ignored)}; its flags are {known}")
    root, repo_id = args.dataset.get("root"), args.dataset.get("repo_id")
    if root is None and repo_id is None:
        root = str(ensure_demo_dataset())
    source = open_source(
        root, repo_id=repo_id, revision=args.dataset.get("revision"), repo_type=args.dataset.get("repo_type", "dataset")
    )
    tolerance_s = float(args.dataset.get("tolerance_s", 1e-4))
    # Missing files are findings here, not the first error of opening.
    meta = load_meta(source, check_files=False)
    selection = args.dataset.get("episodes")
    episodes = None if selection is None else select_episodes(meta, selection)
    print(meta.summary())
    if episodes is not None:
        print(f"  checking {plural(len(episodes), 'selected episode')} and the files they use")
    descriptions: list[str] = []

    def open_indexes(paths: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
        indexes, failures, description = open_sidecar(source, meta, paths)
        descriptions.append(description)
        return indexes, failures

    report = check_dataset(
        meta, episodes, tolerance_s, open_indexes,
        span_overflows=lambda indexes, chosen: span_overflows(meta, indexes, chosen, tolerance_s),
    )  # fmt: skip
    findings = report.findings
    bad = episodes_to_skip(meta, report, tolerance_s)  # what open finds, before --decode adds its findings
    print("\n".join(descriptions) if descriptions else "MP4 sidecar: the dataset has no videos")
    if args.decode:
        decode_selected(source, meta, episodes, report, tolerance_s, findings)
    print(describe_findings(findings))
    checked = report.video_checkable.tolist()
    problems = video_problems(meta, report.indexes, checked, tolerance_s, limit=VIDEO_PROBLEM_LINES) if checked else []
    print(describe_video_problems(meta, problems, len(checked)))
    if len(bad):
        print(describe_skip(bad, len(meta.episodes) if episodes is None else len(episodes)))
    return 1 if problems or findings.errors else 0


def describe_skip(bad: Any, selected: int) -> str:
    """What ``--dataset.streaming_bad_episodes=skip`` would leave out (``dataset_doctor.episodes_to_skip``,
    the check ``stream`` runs), by kind."""
    head = f"--dataset.streaming_bad_episodes=skip leaves out {plural(len(bad), 'episode')} of {selected}:"
    return "\n".join([head, *(f"  {line}" for line in bad.lines())])


VIDEO_PROBLEM_LINES = 20
"""Span problems ``inspect`` lists before ``... and N more``."""


def decode_selected(source: Any, meta: Any, episodes: Any, report: Any, tolerance_s: float, findings: Any) -> None:
    """``--decode``: every sample of the selected episodes without a file error, read through the map-style reader."""
    import numpy as np

    from ..dataset_doctor import WARNING, Finding, decode_problems
    from ..errors import LeRobotNodesError
    from ..map_style import MapStyleLeRobotDataset

    chosen = np.arange(len(meta.episodes)) if episodes is None else np.asarray(episodes, dtype=np.int64)
    healthy = chosen[~np.isin(chosen, report.broken)].tolist()
    started = time.perf_counter()
    if not healthy:
        print("decode: no episode without a file error to decode")
        return
    try:
        dataset = MapStyleLeRobotDataset(root=source, episodes=healthy, tolerance_s=tolerance_s, return_uint8=True)
    except LeRobotNodesError as exc:
        # e.g. a missing file of an episode not selected: the map-style reader checks every file at open
        findings.add(Finding(WARNING, "decode skipped", f"the map-style reader does not open: {exc}"))
        return
    read = decode_problems(dataset, healthy, findings)
    skipped = len(chosen) - len(healthy)
    print(
        f"decode: read {plural(read, 'sample')} of {plural(len(healthy), 'episode')} in "
        f"{time.perf_counter() - started:.2f} s" + (f" ({plural(skipped, 'episode')} with a file error skipped)" if skipped else "")
    )


def open_sidecar(source: Any, meta: Any, paths: list[str] | None = None) -> tuple[dict[str, Any], dict[str, str], str]:
    """The MP4 index of every video file of ``paths`` (default: all), opened (or built) from the
    sidecar cache, why each file that failed did, and where each came from."""
    from ..errors import LeRobotNodesError
    from ..sidecar import SidecarCache

    paths = meta.video_files() if paths is None else paths
    if not paths:
        return {}, {}, "MP4 sidecar: the dataset has no videos"
    started = time.perf_counter()
    cache = SidecarCache()
    failures: dict[str, str] = {}
    try:
        indexes, report = cache.open(source, paths, dataset_id=meta.repo_id)
        reports = [report]
    except (LeRobotNodesError, OSError, ValueError):
        # One bad MP4: open the rest one by one to name it (only when one fails).
        indexes, reports = {}, []
        for path in paths:
            try:
                one, report = cache.open(source, [path], dataset_id=meta.repo_id)
            except (LeRobotNodesError, OSError, ValueError) as exc:
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                failures[path] = why.split(f"{path}: ", 1)[-1]  # the path is the finding's own
                continue
            indexes.update(one)
            reports.append(report)
    samples = sum(len(index.sizes) for index in indexes.values())
    nbytes = sum(sum(array.nbytes for array in vars(index).values() if hasattr(array, "nbytes")) for index in indexes.values())
    in_memory = any(r.in_memory for r in reports)
    lines = [
        f"MP4 sidecar: {plural(len(indexes), 'video file')}, {plural(samples, 'sample')}, "
        f"opened in {time.perf_counter() - started:.3f} s",
        f"  reused {sum(len(r.reused) for r in reports)}, converted from a published sidecar "
        f"{sum(len(r.converted) for r in reports)}, built {sum(len(r.built) for r in reports)}"
        f"{' (in memory: the store has no stable identities)' if in_memory else ''}",
        f"  index arrays: {nbytes / max(1, samples):.1f} bytes per frame",
    ]
    lines += [f"  rebuilt {path}: {reason}" for r in reports for path, reason in r.stale.items()]
    if failures:
        lines.append(f"  {plural(len(failures), 'video file')} could not be indexed (listed below)")
    return indexes, failures, "\n".join(lines)


def describe_findings(findings: Any) -> str:
    """The dataset doctor's findings (``lerobot_nodes.dataset_doctor``), grouped by kind."""
    errors, warnings_ = findings.errors, findings.warnings
    if not errors and not warnings_:
        return "dataset files: every data Parquet footer, row count and range, MP4 frame count, stats and file agree"
    head = f"dataset files: {plural(errors, 'error')}, {plural(warnings_, 'warning')}"
    return "\n".join([head, *findings.lines()])


def describe_video_problems(meta: Any, problems: list[str], episodes: int | None = None) -> str:
    """The result of the metadata-against-video checks (``lerobot_nodes.video_checks``)."""
    if not meta.video_keys:
        return "video metadata: no videos to check"
    episodes = len(meta.episodes) if episodes is None else episodes
    if not problems and episodes == 0:
        return "video metadata: not checked (no episode has all its MP4s indexed; see above)"
    if not problems:
        return (
            f"video metadata: the camera info of {plural(len(meta.video_keys), 'camera')} and the video spans of "
            f"{plural(episodes, 'episode')} agree with the MP4 streams"
        )
    more = re.match(r"\.\.\. and (\d+) more", problems[-1])
    count = len(problems) - 1 + int(more.group(1)) if more else len(problems)
    return "\n".join([f"video metadata: {plural(count, 'problem')}", *(f"  {problem}" for problem in problems)])


def run_cache_command(args: argparse.Namespace) -> int:
    from .cache import run_cache_clear, run_cache_list

    if args.action == "list":
        return run_cache_list()
    return run_cache_clear(args.repo_id, args.all)


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


def build_parser() -> ArgumentParser:
    from .flags import (
        DATASET_FLAGS,
        DEFAULT_WINDOW,
        STREAMING_FLAGS,
        TRAINING_FLAGS,
        WINDOWS,
        describe_window,
        flags_help,
    )

    debug = ArgumentParser(add_help=False)
    debug.add_argument(
        DEBUG_FLAG, action="store_true",
        help=f"print the full traceback of an error, and log every Hub request (or set {DEBUG_ENV}=1)",
    )
    debug.add_argument(
        *VERBOSE_FLAGS, action="store_true", dest="verbose",
        help="log every request huggingface_hub and its HTTP client make (INFO); without it they log warnings only",
    )
    parser = ArgumentParser(
        prog=PROG,
        description="Stream, inspect or sample a LeRobotDataset v3.0. With no command, or flags only, it runs "
        "'stream'. Errors print as one line; --debug prints their traceback.",
        parents=[debug],
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=ArgumentParser)
    parser.command_parsers = commands.choices
    stream = commands.add_parser(
        "stream",
        parents=[debug],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="stream a dataset (default: the built-in demo) through StatefulDataLoader like training does",
        usage=f"%(prog)s [--dataset.NAME VALUE ...] {' '.join(f'[{f.option} N]' for f in TRAINING_FLAGS)} [options]",
        description="Stream a dataset through StatefulDataLoader as LeRobot training does and print the metrics\n"
        "report. The --dataset.* and training flags below are typed as LeRobot users type them:\n"
        "--flag=VALUE or --flag VALUE; null means unset, lists and dicts are JSON.",
        epilog=flags_help(
            {"dataset flags": DATASET_FLAGS, "streaming flags": STREAMING_FLAGS, "training flags": TRAINING_FLAGS}
        ),
    )
    windows = "; ".join(f"{name}: {describe_window(name)}" for name in WINDOWS)
    stream.add_argument(
        "--window",
        choices=WINDOWS,
        default=DEFAULT_WINDOW,
        help=f"the delta_timestamps used when --dataset.delta_timestamps is not given (default: {DEFAULT_WINDOW}); "
        f"frames relative to the sampled one. {windows}",
    )
    stream.add_argument("--save-checkpoint", default=None, metavar="PATH", help="save the loader state after the last step")
    stream.add_argument(
        "--checkpoint-every", type=at_least(1), default=None, metavar="N",
        help="also save every N steps (needs --save-checkpoint)",
    )
    stream.add_argument(
        "--resume",
        default=None,
        metavar="PATH",
        help="continue from a checkpoint saved by --save-checkpoint, or from LeRobot's training_step.json "
        "(or the checkpoint folder holding it): by step offset, batch size, world size and seed from the file when "
        "it has them, else from the flags",
    )
    stream.add_argument("--record", default=None, metavar="FILE", help="append the (episode, frame) of every sample to FILE, (dataset_index, episode, frame) for a mixture")
    stream.add_argument("--quiet", action="store_true", help="no summary, progress bar or report")
    stream.set_defaults(handler=run_stream_command)
    inspect = commands.add_parser(
        "inspect",
        parents=[debug],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="check a dataset as stream would read it: data Parquet footers, row counts and ranges, MP4 indexes "
        "against meta/episodes, stats, stray files (--decode: every frame too)",
        usage="%(prog)s [--dataset.root PATH | --dataset.repo_id OWNER/NAME] [--dataset.revision REV] "
        "[--dataset.episodes [...]] [--decode] [--debug]",
        description="The dataset doctor. Summarise a dataset (default: the built-in demo) and its MP4 sidecar "
        "index, then list every problem stream would meet, without reading the payload: each data Parquet's "
        "footer (readable, PAR1 magic), row count and index / episode_index / frame_index / timestamp ranges "
        "against meta/episodes; each MP4 index against each episode's span, fps, size, codec and frame count; "
        "meta/stats.json; files no episode refers to (a warning). Each problem is one line with the episodes "
        "it affects, grouped by kind. --decode also decodes every selected frame. Exit status 1 on any error.",
        epilog=flags_help({"flags": [f for f in DATASET_FLAGS if f.key in INSPECT_FLAGS]}),
    )
    inspect.add_argument(
        "--decode", action="store_true",
        help="also read every sample of the selected episodes through the map-style reader, decoding every frame, "
        "and list decoder errors (one per episode)",
    )  # fmt: skip
    inspect.set_defaults(handler=run_inspect)
    demo = commands.add_parser(
        "demo", parents=[debug], help="read the built-in demo dataset and print samples with the map-style reader"
    )
    demo.add_argument("--root", "--dataset.root", dest="root", default=None, help="a local LeRobot v3 dataset instead of the demo")
    demo.add_argument("--samples", type=at_least(1), default=4, help="samples to print (default 4)")
    demo.set_defaults(handler=run_demo)
    add_cache_parser(commands, debug)
    commands.add_parser(
        "train",
        parents=[debug],
        help="run LeRobot's lerobot-train (LeRobot >= 0.6.1) with every flag; --dataset.streaming=true streams "
        "through lerobot_nodes (lerobot-nodes train --help)",
        add_help=False,
    )
    return parser


def add_cache_parser(commands: Any, debug: argparse.ArgumentParser) -> None:
    cache = commands.add_parser(
        "cache",
        parents=[debug],
        help="list or clear the local MP4 index and metadata caches under $HF_LEROBOT_HOME",
        description="The caches under $HF_LEROBOT_HOME: streaming-indexes (MP4 sample indexes, one entry per "
        "dataset revision) and streaming-meta (metadata and listings of Hub commits and buckets). Entries are "
        "rebuilt on demand; clearing one is needed only when a video was replaced without its identity changing "
        "(same size, restored mtime), which a decode error points out.",
    )
    actions = cache.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=ArgumentParser)
    listing = actions.add_parser(
        "list", parents=[debug], help="each entry: kind, dataset id, revision, number of records, bytes on disk, path"
    )
    listing.set_defaults(handler=run_cache_command)
    clear = actions.add_parser(
        "clear",
        parents=[debug],
        help="remove the entries of one dataset, or all; an entry whose lock a live process holds is kept",
        usage="%(prog)s (--dataset.repo_id ID | --all) [--debug]",
    )
    which = clear.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--dataset.repo_id", dest="repo_id", metavar="ID",
        help="the Hub dataset or bucket id (OWNER/NAME), as 'cache list' shows it; a local folder "
        "shows as 'local folder NAME'",
    )
    which.add_argument("--all", action="store_true", help="every entry of both caches")
    clear.set_defaults(handler=run_cache_command)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``lerobot-nodes`` and return its exit code; errors print as one line (see ``console``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    system_allocator_under_address_limit()
    debug = debug_requested(argv)
    argv = [token for token in argv if token != DEBUG_FLAG]
    if not argv or (argv[0].startswith("-") and argv[0] not in ("--help", "-h")):
        argv = [DEFAULT_COMMAND, *argv]
    if argv[0] in COMMANDS:
        usage_hint = f"{PROG} {argv[0]} --help lists every flag"
    else:
        usage_hint = f"{PROG} --help lists the commands"
    if argv[0] == "train":
        # LeRobot's flags go to LeRobot's parser unchanged, and LeRobot sets up its own logging (but
        # not the levels of the Hub client's loggers, which log every request at INFO).
        from .train import run_train

        quiet_http_client_logs(verbose=debug)

        return run_reporting_errors(lambda: run_train(argv[1:]), debug=debug, usage_hint=usage_hint)
    return run_reporting_errors(lambda: _run(argv, debug), debug=debug, usage_hint=usage_hint)


def _run(argv: list[str], debug: bool = False) -> int:
    import logging

    from .flags import DATASET_FLAGS, STREAMING_FLAGS, TRAINING_FLAGS, split_flags

    # torchdata's own deprecation notice, printed by every StatefulDataLoader: nothing a user can act on.
    warnings.filterwarnings("ignore", message=".set_vital. is deprecated", category=UserWarning)
    command, rest = argv[0], argv[1:]
    flags: dict[str, Any] = {}
    table: list[str] = []
    if command in FLAG_COMMANDS:
        dataset, streaming, training, rest = split_flags(rest)
        flags = {"dataset": dataset, "streaming": streaming, "training": training}
        table = [flag.option for flag in (*DATASET_FLAGS, *STREAMING_FLAGS, *TRAINING_FLAGS)]
    parser = build_parser()
    args, extras = parser.parse_known_args([command, *rest])
    if extras:
        known = option_strings(parser.command_parsers[command]) if command in parser.command_parsers else []
        raise unrecognized_arguments(extras, [*known, *table])
    vars(args).update(flags)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_http_client_logs(verbose=debug or args.verbose)
    dump_stacks_on_signal()
    with one_line_warnings(enabled=not debug):
        return run_until_stopped(lambda: int(args.handler(args)), f"{PROG} {args.command}")


def console_script() -> NoReturn:
    """The ``lerobot-nodes`` console script: ``main`` with the command line, then a clean process exit."""
    exit_process(main)


if __name__ == "__main__":
    console_script()
