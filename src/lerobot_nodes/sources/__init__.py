"""Byte sources: the only way readers reach dataset files."""

from __future__ import annotations

import os

from .base import ByteRange, ByteSource, FileInfo, ReadStats
from .local import LocalSource


def open_source(root: str | os.PathLike[str] | ByteSource) -> ByteSource:
    """Open a dataset root: a local folder (remote stores plug in here later)."""
    if isinstance(root, ByteSource):
        return root
    return LocalSource(root)


__all__ = ["ByteRange", "ByteSource", "FileInfo", "LocalSource", "ReadStats", "open_source"]
