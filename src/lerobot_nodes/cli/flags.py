"""LeRobot-style flags: ``--dataset.streaming_episode_pool_size=16``, ``--steps 20``, ``--seed=null``, ...

Values are parsed the way LeRobot's draccus-based CLI reads them from the command line:
``--flag=value`` or ``--flag value``; ``null``/``none`` is ``None``, ``true``/``false`` are
booleans, lists and dicts are JSON, everything else is converted to the flag's declared type.
Every flag, its type and its default live in one table, which also writes the ``--help`` text;
the ``--dataset.streaming_*`` part of it is derived from :class:`StreamingConfig`.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any

from ..config import DEFAULT_RANK_POOL_SIZE, StreamingConfig
from ..errors import ConfigError
from .console import did_you_mean

DATASET_PREFIX = "dataset."

EACH_CAMERA = "each camera"
POLICY_WINDOWS: dict[str, dict[str, range]] = {
    "act": {"action": range(0, 50), EACH_CAMERA: range(0, 1)},
    "diffusion": {EACH_CAMERA: range(-1, 1), "observation.state": range(-1, 1), "action": range(-1, 15)},
}
"""Frame offsets of the benchmark policies' ``delta_timestamps`` (``observation.state`` only if the dataset has it):
what ``stream --window`` picks. Here, with the other flags, so ``--help`` needs no import of the streaming code."""
WINDOWS = ("none", *POLICY_WINDOWS)
DEFAULT_WINDOW = "act"


def describe_window(name: str) -> str:
    """``name``'s window in words, for ``--help``: ``action at frames +0..+49, each camera at frame +0``."""
    if name == "none":
        return "single frames, no window"
    parts = []
    for key, offsets in POLICY_WINDOWS[name].items():
        span = f"frame {offsets[0]:+d}" if len(offsets) == 1 else f"frames {offsets[0]:+d}..{offsets[-1]:+d}"
        parts.append(f"{key} at {span}")
    return ", ".join(parts)


@dataclass(frozen=True)
class Flag:
    """One flag as typed without its ``--`` (``dataset.root``, ``batch_size``), its type and default."""

    name: str
    kind: Any
    default: Any = None
    minimum: float | None = None
    default_text: str | None = None
    """How ``--help`` states the default when the value alone does not say what it means."""

    @property
    def option(self) -> str:
        return f"--{self.name}"

    @property
    def key(self) -> str:
        """The name of the option in the dataset/streaming/training dict it is parsed into."""
        return self.name.removeprefix(DATASET_PREFIX)

    def describe_default(self) -> str:
        return self.default_text or format_value(self.default)


RENAME_MAP_FLAG = Flag(
    "dataset.streaming_rename_map",
    dict[str, dict[str, str]] | None,
    default_text='null (a mixture\'s per-dataset renames: {"OWNER/B": {"observation.images.front": '
    '"observation.images.top"}})',
)
"""The mixture's rename map: a ``--dataset.*`` flag of ``stream`` and of ``train`` (not a StreamingConfig field)."""

DATASET_FLAGS: tuple[Flag, ...] = (
    Flag(
        "dataset.root",
        str | None,
        default_text="the built-in demo dataset (when no repo_id is given either); a JSON list for a mixture",
    ),
    Flag(
        "dataset.repo_id",
        str | None,
        default_text="null; when no root is given, the Hub dataset repo streamed (the local copy "
        "$HF_LEROBOT_HOME/<repo_id> is read instead only with HF_HUB_OFFLINE=1); a JSON list, "
        '\'["OWNER/A","OWNER/B"]\', streams a mixture',
    ),
    Flag(
        "dataset.revision",
        str | None,
        default_text="null (LeRobot's v3.0 tag; a branch, tag or sha, resolved at open); a JSON list for a mixture",
    ),
    Flag("dataset.repo_type", str, "dataset"),
    Flag("dataset.episodes", list[int] | None, default_text="null (all episodes)"),
    Flag("dataset.streaming", bool, True, default_text="true (false: the map-style reader)"),
    Flag("dataset.delta_timestamps", dict[str, list[float]] | None, default_text="null (from --window)"),
    Flag("dataset.tolerance_s", float, 1e-4, minimum=0),
    Flag("dataset.return_uint8", bool, True),
    Flag("dataset.depth_output_unit", str, "mm"),
    RENAME_MAP_FLAG,
)
"""``--dataset.*`` flags that are not StreamingConfig fields."""

LIST_FLAGS = frozenset({"dataset.root", "dataset.repo_id", "dataset.revision"})
"""Flags that take one value or, as LeRobot spells a mixture, a JSON list (``'["OWNER/A","OWNER/B"]'``):
a value starting with ``[`` is read as that list, one entry (a string or null) per dataset."""

_STREAMING_DEFAULT_TEXT = {
    "streaming_episode_pool_size": f"null (4 batches of episodes per rank, at least {DEFAULT_RANK_POOL_SIZE}, split over its workers)",
    "video_decoder_cache_size": "null (pool x cameras per worker)",
    "streaming_index_concurrency": "null (streaming_native_http_connections if set, else 4 files for a local "
    "folder, 32 for a remote store)",
    "streaming_sampling_strategy": "null (round_robin for a new run, a resumed run its checkpoint's; remaining: "
    "weight by remaining frames, the default before)",
    "streaming_bad_episodes": "raise (stop at the first missing or inconsistent file; skip: leave out the episodes "
    "whose files are missing, damaged or contradict the metadata, as `inspect` finds them)",
}
_NOT_A_FLAG = ("max_num_shards",)  # set from --num_workers, as LeRobot training does


def _streaming_flags() -> tuple[Flag, ...]:
    hints = typing.get_type_hints(StreamingConfig)
    return tuple(
        Flag(DATASET_PREFIX + f.name, hints[f.name], f.default, default_text=_STREAMING_DEFAULT_TEXT.get(f.name))
        for f in fields(StreamingConfig)
        if f.name not in _NOT_A_FLAG and f.default is not MISSING
    )


STREAMING_FLAGS = _streaming_flags()
"""Every StreamingConfig field as a ``--dataset.*`` flag; StreamingConfig validates their values."""

TRAINING_FLAGS: tuple[Flag, ...] = (
    Flag("batch_size", int, 8, minimum=1),
    Flag("num_workers", int, 2, minimum=0, default_text="2 (0: read in the training process)"),
    Flag("steps", int, 50, minimum=1),
    Flag("seed", int | None, 1000, default_text="1000 (null: the streaming seed 42)"),
    Flag("log_freq", int, 0, minimum=0, default_text="0 (no periodic metrics log line)"),
)

_BY_NAME = {flag.name: flag for flag in (*DATASET_FLAGS, *STREAMING_FLAGS, *TRAINING_FLAGS)}


def format_value(value: Any) -> str:
    """``value`` as it is typed on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def _options(kind: Any) -> tuple[Any, ...]:
    is_union = isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union
    return typing.get_args(kind) if is_union else (kind,)


def _is(value: Any, kind: Any) -> bool:
    """``value`` (parsed JSON) has type ``kind``: ``int``, ``float``, ``str``, ``list[X]`` or ``dict[K, V]``."""
    origin, args = typing.get_origin(kind) or kind, typing.get_args(kind)
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if not isinstance(value, origin):
        return False
    if origin is list and args:
        return all(_is(item, args[0]) for item in value)
    if origin is dict and args:
        return all(_is(key, args[0]) and _is(item, args[1]) for key, item in value.items())
    return True


def parse_value(flag: str, text: str, kind: Any) -> Any:
    """``text`` of ``flag`` converted to ``kind`` (a type, ``list[X]``/``dict[K, V]`` as JSON, or ``X | None``)."""
    options = _options(kind)
    if text.strip().lower() in ("null", "none", ""):
        if type(None) in options:
            return None
        raise ConfigError(f"{flag} cannot be null")
    target = next((o for o in options if o is not type(None)), str)
    origin = typing.get_origin(target) or target
    try:
        if target is bool:
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError("expected true or false")
            return lowered in ("true", "1")
        if origin in (list, dict):
            value = json.loads(text)
            if not _is(value, target):
                raise ValueError(f"expected JSON of type {target}")
            return value
        if target is int:
            return int(text)
        if target is float:
            return float(text)
        return target(text)
    except (ValueError, json.JSONDecodeError) as exc:
        name = getattr(target, "__name__", target) if origin is target else target
        raise ConfigError(f"{flag}={text!r} is not a valid {name}: {exc}") from None


def parse_list(flag: str, text: str) -> list[str | None]:
    """``text`` of a :data:`LIST_FLAGS` flag that starts with ``[``: a JSON list of strings (or nulls)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}={text!r} is not a valid JSON list: {exc}") from None
    return dataset_list(flag, text, value)


def dataset_list(flag: str, text: str, value: Any) -> list[str | None]:
    """``value``, parsed from ``text``, when it is a list of strings (or nulls), one per dataset of a mixture."""
    if not isinstance(value, list) or not all(item is None or isinstance(item, str) for item in value):
        raise ConfigError(f'{flag}={text!r} must be a JSON list of strings, one per dataset: \'["OWNER/A","OWNER/B"]\'')
    return value


def _parse(flag: Flag, text: str) -> Any:
    if flag.name in LIST_FLAGS and text.lstrip().startswith("["):
        return parse_list(flag.option, text)
    value = parse_value(flag.option, text, flag.kind)
    if flag.minimum is not None and value is not None and not value >= flag.minimum:  # NaN too
        raise ConfigError(f"{flag.option} must be >= {format_value(flag.minimum)}, got {text}")
    return value


def _take_flags(argv: Sequence[str], known: Mapping[str, Flag]) -> tuple[list[tuple[Flag, Any]], list[str]]:
    """Every flag of ``known`` (by name) in ``argv`` with its parsed value, and every other token, in order.

    ``--flag=value`` and ``--flag value`` are both read; a value that cannot be parsed is a ConfigError.
    """
    taken: list[tuple[Flag, Any]] = []
    rest: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        name, has_value, text = token.removeprefix("--").partition("=")
        flag = known.get(name) if token.startswith("--") else None
        if flag is None:
            rest.append(token)
            continue
        if not has_value:
            following = next(tokens, None)
            if following is None or following.startswith("--"):
                raise ConfigError(f"{flag.option} needs a value: {flag.option}=VALUE or {flag.option} VALUE")
            text = following
        taken.append((flag, _parse(flag, text)))
    return taken, rest


def split_flags(argv: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[str]]:
    """Split ``argv`` into (dataset options, streaming options, training options, the rest), in order.

    Each dict holds only the flags given. ``--flag=value`` and ``--flag value`` are both read;
    an unknown ``--dataset.*`` flag is a ConfigError listing the known ones.
    """
    unknown = [token for token in argv if token.startswith("--" + DATASET_PREFIX)
               and token.removeprefix("--").partition("=")[0] not in _BY_NAME]
    if unknown:
        name = unknown[0].removeprefix("--").partition("=")[0]
        options = sorted(f.option for f in (*DATASET_FLAGS, *STREAMING_FLAGS))
        suggestion = did_you_mean(f"--{name}", options)  # "; did you mean --dataset.root?": first, the list is long
        listing = f"{suggestion} The" if suggestion else "; the"
        raise ConfigError(f"unknown flag --{name}{listing} --dataset.* flags are: {', '.join(options)}")
    taken, rest = _take_flags(argv, _BY_NAME)
    parsed: dict[tuple[Flag, ...], dict[str, Any]] = {DATASET_FLAGS: {}, STREAMING_FLAGS: {}, TRAINING_FLAGS: {}}
    for flag, value in taken:
        group = next(group for group in parsed if flag in group)
        parsed[group][flag.key] = value
    return parsed[DATASET_FLAGS], parsed[STREAMING_FLAGS], parsed[TRAINING_FLAGS], rest


def split_streaming_flags(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Take the ``--dataset.streaming_*`` flags (every :data:`STREAMING_FLAGS` entry, and
    :data:`RENAME_MAP_FLAG`, whose value is under ``streaming_rename_map``) out of ``argv``.

    Returns the parsed values of the flags given and every other token, unchanged and in order:
    what ``lerobot-nodes train`` hands to LeRobot's own parser, which does not know these flags.
    ``--flag=value`` and ``--flag value`` are both read; a value that cannot be parsed is a ConfigError.
    """
    taken, rest = _take_flags(argv, {flag.name: flag for flag in (*STREAMING_FLAGS, RENAME_MAP_FLAG)})
    return {flag.key: value for flag, value in taken}, rest


def with_defaults(given: dict[str, Any], flags: Sequence[Flag]) -> dict[str, Any]:
    """``given`` completed with the default of every flag it does not set."""
    return {flag.key: given.get(flag.key, flag.default) for flag in flags}


def flags_help(groups: dict[str, Sequence[Flag]]) -> str:
    """The ``--help`` lines of ``groups`` (title -> flags): each flag, its type and its default."""
    width = max(len(flag.option) for flags in groups.values() for flag in flags)
    lines = []
    for title, flags in groups.items():
        lines.append(f"{title}:")
        lines += [f"  {f.option:<{width}}  {_type_name(f.kind):<5}  default: {f.describe_default()}" for f in flags]
    return "\n".join(lines)


def _type_name(kind: Any) -> str:
    target = next(o for o in _options(kind) if o is not type(None))
    origin = typing.get_origin(target) or target
    return "JSON" if origin in (list, dict) else {bool: "BOOL", int: "INT", float: "FLOAT"}.get(target, "TEXT")
