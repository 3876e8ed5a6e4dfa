"""Where LeRobot keeps its local files, found the way LeRobot finds it."""

from __future__ import annotations

import os
from pathlib import Path


def lerobot_home() -> Path:
    """``$HF_LEROBOT_HOME``, else ``$HF_HOME/lerobot``, else ``~/.cache/huggingface/lerobot``."""
    if os.environ.get("HF_LEROBOT_HOME"):
        return Path(os.environ["HF_LEROBOT_HOME"]).expanduser()
    hf_home = Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser()
    return hf_home / "lerobot"
