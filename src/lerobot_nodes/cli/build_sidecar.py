"""``lerobot-build-mp4-sidecar``: build the MP4 index sidecar of a dataset."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from ..sidecar.cli import main as sidecar_main

    return sidecar_main(argv)


if __name__ == "__main__":
    sys.exit(main())
