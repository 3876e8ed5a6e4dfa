"""A training script without ``if __name__ == "__main__":`` gets one line saying so, not a dead worker.

Under the ``spawn`` and ``forkserver`` start methods a new worker process runs the training script
again, as ``__mp_main__``, before it unpickles its work (``multiprocessing.spawn.prepare``); a
worker forked from a copy of the training process (``lerobot_nodes.workers.server``) does not.
A script that builds its dataset and DataLoader at its top level then builds them again in every
such worker, which cannot start workers of its own: it dies, and the DataLoader says only
``DataLoader worker (pid(s) ...) exited unexpectedly``. Two checks turn that into one line:

- in the training process, before workers start (``streaming_dataloader``):
  :func:`unguarded_main_line` finds the line of the main script, at its top level and outside an
  ``if __name__ == "__main__":`` block, that the caller runs under, and :func:`fail_missing_guard`
  ends the script with the line;
- in a worker, when the dataset is built while the script runs again (:func:`reimporting_main`):
  :func:`exit_if_reimporting_main` prints the line and ends the worker, for DataLoaders that did not
  come through ``streaming_dataloader``.

``LEROBOT_NODES_DEBUG=1`` (the command-line tools' switch) raises a ``ConfigError`` with its
traceback instead.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import sys
from pathlib import Path
from types import FrameType
from typing import NoReturn

from ..errors import ConfigError

DEBUG_ENV = "LEROBOT_NODES_DEBUG"
"""The command-line tools' switch for tracebacks (``lerobot_nodes.cli.console``), read here too."""
REIMPORTED_MAIN = "__mp_main__"
"""The name multiprocessing runs the main script under in a new process."""


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _top_level_frame(module_name: str) -> FrameType | None:
    """The frame running the top level of module ``module_name`` on this thread's stack, if any."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == module_name:
            return frame
        frame = frame.f_back
    return None


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (either order of the two sides)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [side.id for side in sides if isinstance(side, ast.Name)]
    constants = [side.value for side in sides if isinstance(side, ast.Constant)]
    return names == ["__name__"] and constants == ["__main__"]


def unguarded_main_line() -> tuple[str, int] | None:
    """The main script's file and the line, at its top level and outside ``if __name__ == "__main__":``,
    that the caller runs under; None when there is none (no script file: ``python -c``, a notebook;
    a guarded script; a script that cannot be read back)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return None
    frame = _top_level_frame("__main__")
    if frame is None or frame.f_globals is not main.__dict__:
        return None
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_bytes(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            return None if _is_main_guard(node) else (path, line)
    return None


def reimporting_main() -> bool:
    """Whether this process is a multiprocessing child running the main script again right now.

    (While the script runs again, ``multiprocessing.parent_process()`` is still None: the child
    learns its parent only after ``prepare``; ``_inheriting`` is set for that whole phase.)
    """
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return False
    return _top_level_frame(REIMPORTED_MAIN) is not None


def missing_guard_message(path: str, line: int, start_method: str) -> str:
    """The one line: where the script starts workers unguarded, why that fails, what to write."""
    return (
        f"{path}:{line} reaches DataLoader workers from the script's top level, and every {start_method} worker "
        'runs the script again before it starts: put the script\'s code under `if __name__ == "__main__":`'
    )


def fail_missing_guard(message: str) -> NoReturn:
    """End the script with ``error: <message>`` on stderr and exit status 1, no traceback
    (``SystemExit``); with ``LEROBOT_NODES_DEBUG=1``, raise a ``ConfigError`` instead."""
    if _debug():
        raise ConfigError(message)
    raise SystemExit(f"error: {message}")


def exit_if_reimporting_main(start_method: str = "spawn or forkserver") -> None:
    """In a worker running the main script again (:func:`reimporting_main`): print the one line and end
    the worker with exit status 1 (a ``ConfigError`` with ``LEROBOT_NODES_DEBUG=1``). A no-op elsewhere."""
    if not reimporting_main():
        return
    frame = _top_level_frame(REIMPORTED_MAIN)
    assert frame is not None
    message = missing_guard_message(frame.f_code.co_filename, frame.f_lineno, start_method)
    if _debug():
        raise ConfigError(message)
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(1)
