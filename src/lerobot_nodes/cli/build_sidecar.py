"""``lerobot-build-mp4-sidecar``: build (and later publish) a dataset's MP4 sidecar archive.

Example::

    lerobot-build-mp4-sidecar --repo-id=OWNER/DATASET --revision=COMMIT_SHA \\
        --data-root=hf://datasets/OWNER/DATASET@COMMIT_SHA --output=/tmp/dataset-mp4-sidecar.npz --workers=8 --push
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from ..errors import ConfigError, LeRobotNodesError, PublishNotSupportedError, SidecarError
from .console import (
    DEBUG_ENV,
    DEBUG_FLAG,
    VERBOSE_FLAGS,
    ArgumentParser,
    debug_requested,
    error_message,
    exit_process,
    limit_failure_message,
    network_failure_message,
    one_line_warnings,
    quiet_http_client_logs,
    run_reporting_errors,
)
from .limits import system_allocator_under_address_limit
from .signals import Stopped, dump_stacks_on_signal, run_until_stopped

# The builder, the publisher and the byte sources (torch, pyarrow, PyAV, huggingface_hub) are imported
# by _build, once the flags are parsed: --help and usage errors answer at once.

log = logging.getLogger("lerobot_nodes.sidecar")

PROG = "lerobot-build-mp4-sidecar"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=PROG,
        description="Index every MP4 of a LeRobotDataset v3.0 into a sidecar archive (schema v3). "
        "The output is replaced atomically, only by a complete, verified archive.",
    )
    parser.add_argument("--repo-id", "--dataset.repo_id", dest="repo_id", default=None, help="OWNER/DATASET recorded in the archive; without "
                        "--data-root, the Hub dataset repo that is indexed (read from its local copy "
                        "$HF_LEROBOT_HOME/OWNER/DATASET instead only with HF_HUB_OFFLINE=1)")
    parser.add_argument("--revision", "--dataset.revision", dest="revision", default=None, help="revision the archive is bound to (a commit SHA for "
                        "published sidecars)")
    parser.add_argument("--data-root", "--dataset.root", dest="data_root", default=None, help="the dataset root: a local folder, "
                        "hf://datasets/OWNER/NAME@REVISION, hf://buckets/OWNER/BUCKET or any fsspec URL (default: the "
                        "Hub repo --repo-id)")
    parser.add_argument("--output", required=True, help="archive to write (.npz)")
    parser.add_argument("--workers", type=int, default=1, help="video files parsed concurrently (default 1)")
    parser.add_argument("--episodes", "--dataset.episodes", dest="episodes", default=None, help="episode indices, "
                        "comma-separated or a JSON list as the other commands take it ('[0,3]'): index only their "
                        "video files (a subset sidecar, which cannot be published)")
    parser.add_argument("--push", action="store_true", help="publish the verified archive (dataset repo branch "
                        "'lerobot-sidecars', or meta/mp4-sidecars/ of a bucket)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no log lines, only the summary")
    parser.add_argument(DEBUG_FLAG, action="store_true", help=f"print the full traceback of an error, and log every "
                        f"Hub request (or set {DEBUG_ENV}=1)")
    parser.add_argument(*VERBOSE_FLAGS, action="store_true", dest="verbose", help="log every request huggingface_hub "
                        "and its HTTP client make (INFO); without it they log warnings only")
    return parser


def _episodes(value: str | None) -> list[int] | None:
    if value is None:
        return None
    text = value.strip()
    if text.startswith("["):  # the spelling of --dataset.episodes in every other command
        text = text[1:-1] if text.endswith("]") else text[1:]
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(
            f"--episodes must be episode indices, comma-separated (0,3) or a JSON list ([0,3]), got {value!r}"
        ) from None


def _configure_logging(quiet: bool, verbose: bool = False) -> None:
    handler_needed = not logging.getLogger().handlers
    for name in ("lerobot_nodes", *(("huggingface_hub", "httpx", "httpx2") if verbose else ())):
        log_of = logging.getLogger(name)
        if handler_needed and not log_of.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            log_of.addHandler(handler)
    logging.getLogger("lerobot_nodes").setLevel(logging.WARNING if quiet else logging.INFO)
    quiet_http_client_logs(verbose)


def _check_push(args: argparse.Namespace, episodes: list[int] | None) -> None:
    if not args.push:
        return
    if episodes is not None:
        raise PublishNotSupportedError("a sidecar of a subset of the episodes cannot be published: drop --episodes")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command and return its exit code: 0 built, 1 build failed, 2 usage error, 128 + N stopped by signal N."""
    argv = list(sys.argv[1:] if argv is None else argv)
    system_allocator_under_address_limit()
    debug = debug_requested(argv)
    return run_reporting_errors(
        lambda: _build(argv, debug),
        debug=debug,
        usage_hint=f"{PROG} --help lists every flag",
        usage_errors=(ConfigError, PublishNotSupportedError),
    )


def _build(argv: Sequence[str], debug: bool = False) -> int:
    args = build_parser().parse_args(argv)
    episodes = _episodes(args.episodes)
    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    if args.data_root is None and args.repo_id is None:
        raise ConfigError("give --data-root or --repo-id")
    _configure_logging(args.quiet, verbose=debug or args.verbose)
    _check_push(args, episodes)
    dump_stacks_on_signal()
    with one_line_warnings(enabled=not debug):
        # SIGTERM/SIGINT: one line and 128 + the signal, as `lerobot-nodes stream`; the output is only ever
        # replaced by a complete archive, so a stopped build leaves it as it was.
        return run_until_stopped(lambda: _build_archive(args, episodes), PROG)


def _build_archive(args: argparse.Namespace, episodes: list[int] | None) -> int:
    from ..sidecar.builder import build_archive
    from ..sidecar.publish import check_publishable, publish_archive
    from ..sources.resolve import open_source

    try:
        source = open_source(args.data_root, repo_id=args.repo_id, revision=args.revision)
        if args.push:
            check_publishable(source)
        summary = build_archive(
            source,
            args.output,
            dataset_id=args.repo_id,
            revision=args.revision,
            episodes=episodes,
            workers=args.workers,
            show_progress=False if args.quiet else None,
        )
    except Stopped as stop:
        stop.detail = f"before the archive was complete; {args.output} was left as it was"
        raise
    except PublishNotSupportedError:
        raise
    except Exception as error:
        known = network_failure_message(error) or limit_failure_message(error)
        if known is None and not isinstance(error, (LeRobotNodesError, OSError, ValueError)):
            raise
        raise SidecarError(f"build failed, {args.output} was left as it was: {known or error_message(error)}") from error
    print(summary.describe())
    if args.push:
        try:
            where = publish_archive(source, args.output)
        except Stopped as stop:
            stop.detail = f"while publishing; the verified archive stays at {args.output}"
            raise
        except Exception as error:
            network = network_failure_message(error)
            if network is None and not isinstance(error, (LeRobotNodesError, OSError)):
                raise
            raise SidecarError(
                f"publishing failed (the verified archive stays at {args.output}): {network or error_message(error)}"
            ) from error
        print(f"published {where}")
    return 0


def console_script() -> NoReturn:
    """The ``lerobot-build-mp4-sidecar`` console script: ``main``, then a clean process exit."""
    exit_process(main)


if __name__ == "__main__":
    console_script()
