"""What the package's console scripts share: one-line errors, exit codes, ``--debug``, a clean exit.

An error the user can act on (every :class:`~lerobot_nodes.errors.LeRobotNodesError`, and the
OS errors of missing files or permissions) prints ``error: <message>`` and at most one
``hint: ...`` line on stderr, and exits with 2 for usage and configuration errors, 1 for data
and runtime errors. ``--debug`` or ``LEROBOT_NODES_DEBUG=1`` prints the traceback above that
line. A network failure reaching the Hub or another host (huggingface_hub's ``httpx`` or
``requests`` transport errors, matched by class name, and connection-refused or name-resolution
OS errors) is one line too, naming the URL and what to do, and so is a process limit hit (memory,
threads, open files: ``lerobot_nodes.cli.limits``). Any other exception is a bug and keeps
its traceback. Python warnings print as one ``warning: <message>`` line each.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import difflib
import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

from ..errors import ConfigError, LeRobotNodesError, SourceUnavailableError
from .limits import resource_limit_message

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
DEBUG_FLAG = "--debug"
DEBUG_ENV = "LEROBOT_NODES_DEBUG"
VERBOSE_FLAGS = ("-v", "--verbose")
DEBUG_HINT = f"hint: {DEBUG_FLAG} (or {DEBUG_ENV}=1) prints the full traceback"
USER_ERRORS: tuple[type[BaseException], ...] = (LeRobotNodesError, OSError)
"""Errors reported in one line; anything else is a bug and prints its traceback."""

_WORKER_PREFIX = "Caught "
_WORKER_TRACEBACK = " in DataLoader worker process "


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are ``ConfigError``s, so they print like every other error, with the
    closest choice or flag to a mistyped one (``did you mean``)."""

    command_parsers: Mapping[str, argparse.ArgumentParser] = {}  # set per parser, never mutated
    """The parser of each command, for a parser with commands (``add_subparsers(...).choices``)."""

    def error(self, message: str) -> NoReturn:
        choice = _INVALID_CHOICE.search(message)
        if choice is not None:  # a mistyped command, action or --window value
            message += did_you_mean(choice["typed"], _QUOTED.findall(choice["choices"]))
        elif message.startswith(_UNRECOGNIZED):
            raise unrecognized_arguments(message.removeprefix(_UNRECOGNIZED).split(), option_strings(self))
        raise ConfigError(message)


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<typed>[^']*)' \(choose from (?P<choices>.*)\)")
_QUOTED = re.compile(r"'([^']*)'")
_UNRECOGNIZED = "unrecognized arguments: "


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 episode``, ``2 episodes`` (``nouns``: an irregular plural)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def did_you_mean(typed: str, known: Iterable[str]) -> str:
    """``; did you mean --dataset.root?`` for the closest of ``known`` to ``typed`` (a flag or a word), or ``""``."""
    def stem(option: str) -> str:  # compared without what every flag of a group shares
        return option.partition("=")[0].lstrip("-").removeprefix("dataset.")

    by_stem = {stem(option): option.partition("=")[0] for option in known}
    close = difflib.get_close_matches(stem(typed), list(by_stem), n=1, cutoff=0.75)
    return f"; did you mean {by_stem[close[0]]}?" if close else ""


def unrecognized_arguments(extras: Sequence[str], known: Iterable[str]) -> ConfigError:
    """argparse's ``unrecognized arguments: ...`` as a ConfigError, with the closest known flag to the first."""
    known = list(known)
    hint = next((did_you_mean(token, known) for token in extras if token.startswith("-")), "")
    return ConfigError(f"unrecognized arguments: {' '.join(extras)}{hint}")


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string ``parser`` takes (``--help``, ``--window``, ...)."""
    # argparse has no public list of a parser's options; _actions is stable since Python 3.2.
    return [option for action in parser._actions for option in action.option_strings]


def debug_requested(argv: Sequence[str]) -> bool:
    """``--debug`` is in ``argv`` or ``$LEROBOT_NODES_DEBUG`` is set to something other than 0/false."""
    setting = os.environ.get(DEBUG_ENV, "").strip().lower()
    return DEBUG_FLAG in argv or setting not in ("", "0", "false", "no")


HTTP_CLIENT_LOGGERS = ("huggingface_hub", "httpx", "httpx2", "httpcore", "httpcore2", "urllib3", "filelock", "fsspec")
"""Loggers of huggingface_hub and the HTTP clients under it: at INFO they log every request."""


def quiet_http_client_logs(verbose: bool) -> None:
    """Keep :data:`HTTP_CLIENT_LOGGERS` at WARNING, unless ``verbose`` (``--debug``, ``-v``): then at INFO."""
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)


@contextlib.contextmanager
def one_line_warnings(enabled: bool = True) -> Iterator[None]:
    """Within the block, a Python warning prints as ``warning: <message>`` (once per message), not as
    ``file:line: UserWarning: message`` followed by the source line; ``enabled=False`` (``--debug``)
    keeps Python's format. ``warnings.formatwarning`` is replaced, not ``showwarning``, so
    ``warnings.catch_warnings(record=True)`` (``pytest.warns``) still records them.
    """
    if not enabled:
        yield
        return
    shown: set[str] = set()
    previous = warnings.formatwarning

    def format_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> str:
        text = " ".join(str(message).split())
        if category is not UserWarning:
            text = f"{text} ({category.__name__})"
        if text in shown:
            return ""
        shown.add(text)
        return f"warning: {text}\n"

    warnings.formatwarning = format_warning
    try:
        yield
    finally:
        warnings.formatwarning = previous


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


_NETWORK_LIBRARIES = ("httpx", "httpcore", "requests", "urllib3", "aiohttp")
"""HTTP clients huggingface_hub and fsspec use (httpx under huggingface_hub 1.x+/2.x, requests before), by
module name without a version suffix (``httpx2`` is ``httpx``): their classes are matched by name, so
none is imported here and every huggingface_hub version is covered."""
_NETWORK_ERROR_NAMES = frozenset({
    "TransportError",  # httpx: ConnectError, ConnectTimeout, ReadTimeout, NetworkError, ProxyError, ...
    "ConnectionError",  # requests: ConnectionError, SSLError, ProxyError, ConnectTimeout
    "Timeout",  # requests
    "NewConnectionError", "MaxRetryError", "NameResolutionError", "ProtocolError",  # urllib3
    "ClientConnectionError", "ServerTimeoutError",  # aiohttp (fsspec's http)
})
_DNS_FAILURE = re.compile(
    r"name or service not known|nodename nor servname|temporary failure in name resolution|failed to resolve|"
    r"no address associated|getaddrinfo failed|name resolution",
    re.IGNORECASE,
)
_REFUSED = re.compile(r"connection refused|errno 111\b|actively refused", re.IGNORECASE)
_URL = re.compile(r"https?://[^\s'\")>]+")


def _chain(error: BaseException) -> Iterator[BaseException]:
    current: BaseException | None = error
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _is_network_class(kind: type[BaseException]) -> bool:
    return any(
        cls.__module__.partition(".")[0].rstrip("0123456789") in _NETWORK_LIBRARIES and cls.__name__ in _NETWORK_ERROR_NAMES
        for cls in kind.__mro__
    )


def _request_url(error: BaseException) -> str | None:
    """The URL of the request that failed, from ``error.request`` (httpx, requests) or its message."""
    for link in _chain(error):
        try:
            request = getattr(link, "request", None)  # httpx raises RuntimeError when it was never set
        except Exception:  # whatever a property of a foreign exception raises
            request = None
        url = getattr(request, "url", None)
        if url:
            return str(url)
    for link in _chain(error):
        found = _URL.search(str(link))
        if found:
            return found[0].rstrip(".,;:")
    return None


def _origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}" if rest else url


def _failure_kind(error: BaseException) -> str:
    import socket

    links = list(_chain(error))
    text = " ".join(str(link) for link in links)
    names = " ".join(type(link).__name__ for link in links)
    if any(isinstance(link, socket.gaierror) for link in links) or _DNS_FAILURE.search(text) or "NameResolution" in names:
        return "the host name does not resolve"
    if any(isinstance(link, ConnectionRefusedError) for link in links) or _REFUSED.search(text):
        return "connection refused"
    if "Timeout" in names or any(isinstance(link, TimeoutError) for link in links):
        return "timed out"
    return f"{type(error).__name__}: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def hub_endpoint_setting() -> tuple[str, bool]:
    """The Hub endpoint requests go to, and whether ``$HF_ENDPOINT`` set it."""
    if os.environ.get("HF_ENDPOINT"):
        return os.environ["HF_ENDPOINT"].rstrip("/"), True
    try:
        from huggingface_hub import constants

        return str(constants.ENDPOINT).rstrip("/"), False
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        return "https://huggingface.co", False


def network_advice(url: str | None) -> str:
    """What to do when ``url`` (``None``: the Hub) cannot be reached."""
    endpoint, from_env = hub_endpoint_setting()
    if url is not None and _origin(url) != _origin(endpoint):
        return "check the network and the URL"
    setting = f"it is {endpoint}" if from_env else f"unset, so {endpoint}"
    return (
        f"check the network and HF_ENDPOINT ({setting}), or set HF_HUB_OFFLINE=1 to read a local copy "
        "from $HF_LEROBOT_HOME/<repo_id>"
    )


def network_failure_message(error: BaseException) -> str | None:
    """One line for a failure to reach a host (``None`` if ``error`` is not one): which URL, why, what to do.

    Matched: the transport errors of huggingface_hub's HTTP clients (by class name and module, for
    every huggingface_hub version), ``ConnectionRefusedError``/``socket.gaierror`` raised as they are,
    and this package's :class:`SourceUnavailableError` when its cause is a refused connection or an
    unresolvable host (it then already names the URL: the advice is appended).
    """
    import socket

    if isinstance(error, SourceUnavailableError):
        text = error_message(error)
        if _DNS_FAILURE.search(text) or _REFUSED.search(text) or "cannot reach" in text:
            return f"{text}; {network_advice(_request_url(error))}"
        return None
    if isinstance(error, LeRobotNodesError):
        return None
    if not (_is_network_class(type(error)) or isinstance(error, (ConnectionRefusedError, socket.gaierror))):
        return None
    url = _request_url(error)
    endpoint = hub_endpoint_setting()[0]
    where = _origin(url) if url else endpoint
    what = "the Hub at " if where == _origin(endpoint) else ""
    path = url[len(where):] if url and url.startswith(where) else ""
    request = f", requesting {path}" if path not in ("", "/") else ""
    return f"cannot reach {what}{where} ({_failure_kind(error)}{request}): {network_advice(url)}"


def limit_failure_message(error: BaseException) -> str | None:
    """:func:`~lerobot_nodes.cli.limits.resource_limit_message` for errors that are not the package's own."""
    if isinstance(error, LeRobotNodesError):
        return None
    return resource_limit_message(error)


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
    except Exception as error:
        known = network_failure_message(error) or limit_failure_message(error)
        if known is None and not isinstance(error, USER_ERRORS):
            raise  # a bug: its traceback, as Python prints it
        usage = isinstance(error, usage_errors)
        if debug:
            traceback.print_exc()
        print(f"error: {known or error_message(error)}", file=sys.stderr)
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
