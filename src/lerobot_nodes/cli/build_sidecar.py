"""``lerobot-build-mp4-sidecar``: build the MP4 index sidecar of a dataset."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from .console import exit_process


def main(argv: Sequence[str] | None = None) -> int:
    from ..sidecar.cli import main as sidecar_main

    return sidecar_main(argv)


def console_script() -> NoReturn:
    """The ``lerobot-build-mp4-sidecar`` console script: ``main``, then a clean process exit."""
    exit_process(main)


if __name__ == "__main__":
    console_script()
