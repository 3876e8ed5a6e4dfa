"""Turn LeRobot's ``repo_id`` / ``root`` / ``revision`` arguments into one byte source."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SourceError
from .base import ByteSource
from .local import LocalSource


def lerobot_home() -> Path:
    """``$HF_LEROBOT_HOME``, else ``$HF_HOME/lerobot``, else ``~/.cache/huggingface/lerobot``."""
    if os.environ.get("HF_LEROBOT_HOME"):
        return Path(os.environ["HF_LEROBOT_HOME"]).expanduser()
    hf_home = Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser()
    return hf_home / "lerobot"


def resolve_source(
    repo_id: str | None = None,
    root: str | os.PathLike[str] | ByteSource | None = None,
    revision: str | None = None,
    repo_type: str = "dataset",
    token: str | bool | None = None,
) -> ByteSource:
    """The byte source of a dataset, found the way LeRobot finds it.

    ``root`` wins when given (a folder or a ready :class:`ByteSource`). Otherwise a local copy
    at ``$HF_LEROBOT_HOME/<repo_id>`` is used.
    """
    if isinstance(root, ByteSource):
        return root
    if root is not None:
        return LocalSource(root)
    if repo_id is None:
        raise ValueError("give repo_id or root")
    local = lerobot_home() / repo_id
    if local.is_dir():
        return LocalSource(local)
    raise SourceError(
        f"{repo_id!r} ({repo_type}) has no local copy at {local}, and this build of lerobot_nodes reads local "
        "folders only: pass root=/path/to/dataset"
    )
