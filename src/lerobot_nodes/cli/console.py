"""What the package's console scripts share: one-line errors, exit codes, ``--debug``, a clean exit.

An error the user can act on (every :class:`~lerobot_nodes.errors.LeRobotNodesError`, and the
OS errors of missing files or permissions) prints ``error: <message>`` and at most one
``hint: ...`` line on stderr, and exits with 2 for usage and configuration errors, 1 for data
and runtime errors. ``--debug`` or ``LEROBOT_NODES_DEBUG=1`` prints the traceback above that
line. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from ..errors import ConfigError, LeRobotNodesError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
DEBUG_FLAG = "--debug"
DEBUG_ENV = "LEROBOT_NODES_DEBUG"
DEBUG_HINT = f"hint: {DEBUG_FLAG} (or {DEBUG_ENV}=1) prints the full traceback"
USER_ERRORS: tuple[type[BaseException], ...] = (LeRobotNodesError, OSError)
"""Errors reported in one line; anything else is a bug and prints its traceback."""

_WORKER_PREFIX = "Caught "
_WORKER_TRACEBACK = " in DataLoader worker process "


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are ``ConfigError``s, so they print like every other error."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def debug_requested(argv: Sequence[str]) -> bool:
    """``--debug`` is in ``argv`` or ``$LEROBOT_NODES_DEBUG`` is set to something other than 0/false."""
    setting = os.environ.get(DEBUG_ENV, "").strip().lower()
    return DEBUG_FLAG in argv or setting not in ("", "0", "false", "no")


def error_message(error: BaseException) -> str:
    """The message of ``error`` (and its notes) on one line.

    A DataLoader worker's exception reaches the training process re-raised by torch as
    ``SameClass("Caught SameClass in DataLoader worker process N.\\nOriginal Traceback ...")``:
    the original message is recovered from the end of that traceback text.
    """
    text = str(error)
    notes: Sequence[str] = getattr(error, "__notes__", ())
    if text.startswith(_WORKER_PREFIX) and _WORKER_TRACEBACK in text.partition("\n")[0]:
        text = _message_in_worker_traceback(type(error), text)
    lines = (line.strip() for part in (text, *notes) for line in part.splitlines())
    return " ".join(line for line in lines if line)


def _message_in_worker_traceback(kind: type[BaseException], wrapped: str) -> str:
    # traceback.format_exception ends with "<module>.<Class>: <message>" (then the notes); the
    # last such line is the exception torch caught, earlier ones are its causes.
    module = kind.__module__
    name = kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"
    start = wrapped.rfind(f"\n{name}: ")
    if start >= 0:
        return wrapped[start + len(name) + 3 :]
    return wrapped.rstrip().rpartition("\n")[2]


def run_reporting_errors(
    command: Callable[[], int],
    *,
    debug: bool,
    usage_hint: str,
    usage_errors: tuple[type[BaseException], ...] = (ConfigError,),
) -> int:
    """Run ``command`` and return its exit code; the user's errors print as one line instead of raising.

    ``usage_errors`` exit with 2 and ``usage_hint`` (how to get the list of flags); other
    errors exit with 1 and a hint about ``--debug``.
    """
    try:
        return command()
    except SystemExit as stop:  # argparse after --help (its errors are ConfigErrors); kept as Python exits
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or EXIT_OK
        print(stop.code, file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as interrupt:
        print("error: interrupted", file=sys.stderr)
        _release_frames(interrupt)
        return EXIT_INTERRUPTED
    except USER_ERRORS as error:
        usage = isinstance(error, usage_errors)
        if debug:
            traceback.print_exc()
        print(f"error: {error_message(error)}", file=sys.stderr)
        if usage:
            print(f"hint: {usage_hint}", file=sys.stderr)
        elif not debug:
            print(DEBUG_HINT, file=sys.stderr)
        _release_frames(error)
        return EXIT_USAGE if usage else EXIT_FAILED


def _release_frames(error: BaseException) -> None:
    """Free what the failed command's frames hold (a DataLoader and its workers, open files) now.

    torch re-raises a worker's error from a frame that references it: a cycle that only the
    garbage collector frees, and it closes the DataLoader's queues before the DataLoader, which
    then cannot tell its workers to stop and kills them; killed workers leak semaphores, and the
    resource tracker warns about them on stderr after the error line. With the frames cleared,
    reference counting shuts the DataLoader down gracefully.
    """
    current: BaseException | None = error
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


def exit_process(main: Callable[[], int]) -> NoReturn:
    """Run a console script's ``main`` and end the process with its exit code, skipping interpreter teardown.

    Now and then pyarrow's thread pools abort the interpreter's shutdown with ``terminate called
    without an active exception`` (exit 134, apache/arrow#34314; one run in 14 of a script that
    only reads Parquet, a few in a hundred CLI runs). So after the exit handlers (log flushing,
    worker processes, shared memory) have run, the process ends with ``os._exit``, before the
    interpreter and C++ teardown where pyarrow's threads race.
    """
    try:
        code = main()
    except BaseException:  # a bug: show it as Python would, then still exit cleanly
        traceback.print_exc()
        code = EXIT_FAILED
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # A closed pipe (`| head`) or stream has nowhere left to flush to.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
