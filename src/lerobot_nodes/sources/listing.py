"""The files of a store as listed once at open: lookups and prefix listings without more requests."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from ..errors import SourceFileNotFoundError
from .base import FileInfo


class FileListing:
    """Files by path, listed under ``where`` (the store's address, for error messages)."""

    def __init__(self, files: Iterable[FileInfo], where: str) -> None:
        self._files = {info.path: info for info in files}
        self._paths = sorted(self._files)
        self.where = where

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (self._files[path] for path in self._paths)

    def under(self, prefix: str = "") -> list[FileInfo]:
        """Every file at or below ``prefix`` (a folder, with or without its trailing ``/``, or a file), sorted."""
        position = bisect.bisect_left(self._paths, prefix)
        found = []
        for path in self._paths[position:]:
            if not path.startswith(prefix):
                break
            if prefix and not prefix.endswith("/") and path != prefix and path[len(prefix)] != "/":
                continue
            found.append(self._files[path])
        return found

    def info(self, path: str) -> FileInfo:
        found = self._files.get(path)
        if found is None:
            raise SourceFileNotFoundError(f"{path} not found in {self.where}")
        return found
