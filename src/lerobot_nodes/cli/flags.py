"""LeRobot-style flags: ``--dataset.streaming_episode_pool_size=16``, ``--seed=null``, ...

Values are parsed the way LeRobot's draccus-based CLI reads them from the command line:
``null``/``none`` is ``None``, ``true``/``false`` are booleans, lists and dicts are JSON,
everything else is converted to the option's declared type.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from ..config import StreamingConfig
from ..errors import ConfigError

DATASET_PREFIX = "--dataset."
DATASET_FIELDS: dict[str, Any] = {
    "repo_id": str | None,
    "root": str | None,
    "revision": str | None,
    "repo_type": str,
    "episodes": list | None,
    "streaming": bool,
    "delta_timestamps": dict | None,
    "tolerance_s": float,
    "return_uint8": bool,
}
"""``--dataset.*`` options that are not StreamingConfig fields."""

TRAINING_FIELDS: dict[str, Any] = {
    "batch_size": int,
    "num_workers": int,
    "steps": int,
    "seed": int | None,
    "log_freq": int,
}


def parse_value(flag: str, text: str, kind: Any) -> Any:
    """``text`` of ``flag`` converted to ``kind`` (a type or ``X | None``)."""
    options = typing.get_args(kind) if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union else (kind,)
    optional = type(None) in options
    concrete = [o for o in options if o is not type(None)]
    if text.strip().lower() in ("null", "none", ""):
        if optional:
            return None
        raise ConfigError(f"{flag} cannot be null")
    target = concrete[0] if concrete else str
    try:
        if target is bool:
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError("expected true or false")
            return lowered in ("true", "1")
        if target in (list, dict):
            value = json.loads(text)
            if not isinstance(value, target):
                raise ValueError(f"expected a JSON {target.__name__}")
            return value
        if target is int:
            return int(text)
        if target is float:
            return float(text)
        return target(text)
    except (ValueError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{flag}={text!r} is not a valid {getattr(target, '__name__', target)}: {exc}") from None


def _streaming_field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(StreamingConfig)
    return {f.name: hints[f.name] for f in fields(StreamingConfig)}


def split_flags(argv: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[str]]:
    """Split ``argv`` into (dataset options, streaming options, training options, the rest)."""
    streaming_types = _streaming_field_types()
    dataset: dict[str, Any] = {}
    streaming: dict[str, Any] = {}
    training: dict[str, Any] = {}
    rest: list[str] = []
    for token in argv:
        if not token.startswith("--") or "=" not in token:
            rest.append(token)
            continue
        flag, text = token.split("=", 1)
        if flag.startswith(DATASET_PREFIX):
            name = flag[len(DATASET_PREFIX) :]
            if name in streaming_types and name != "max_num_shards":
                streaming[name] = parse_value(flag, text, streaming_types[name])
            elif name in DATASET_FIELDS:
                dataset[name] = parse_value(flag, text, DATASET_FIELDS[name])
            else:
                known = sorted([*DATASET_FIELDS, *(n for n in streaming_types if n != "max_num_shards")])
                raise ConfigError(f"unknown flag {flag}; --dataset.* flags are: {', '.join(known)}")
        elif flag[2:] in TRAINING_FIELDS:
            training[flag[2:]] = parse_value(flag, text, TRAINING_FIELDS[flag[2:]])
        else:
            rest.append(token)
    return dataset, streaming, training, rest
