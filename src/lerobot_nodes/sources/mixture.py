"""The byte source of a mixture of datasets: ``"<i>/path"`` is ``path`` of dataset ``i``'s source.

Each dataset keeps its own source, so what is per source stays per source: its pinned revision,
its content identities, its HTTP connections and its node-local byte cache entries (a dataset
read alone or in a mixture shares them). This source only routes; it reads nothing itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .base import ByteRange, ByteSource, FileInfo
from .http_range import HttpStats

if TYPE_CHECKING:
    from .range_cache import ByteRangeCache


def _split(path: str) -> tuple[int, str]:
    head, sep, rest = path.partition("/")
    if not sep or not head.isdigit():
        raise FileNotFoundError(
            f"{path!r} is not a mixture path (expected '<dataset index>/<path in that dataset>')"
        )
    return int(head), rest


class MixtureSource(ByteSource):
    """Routes ``"<i>/<path>"`` to ``parts[i]`` (its reads, listing, identities and byte cache)."""

    def __init__(self, parts: Sequence[ByteSource]) -> None:
        super().__init__()
        if not parts:
            raise ValueError("a mixture needs at least one source")
        self.parts = tuple(parts)
        self.has_stable_identity = all(part.has_stable_identity for part in self.parts)

    @property
    def url(self) -> str:
        return "mixture[" + ", ".join(part.url for part in self.parts) + "]"

    @property
    def revision(self) -> str | None:
        revisions = [part.revision for part in self.parts]
        if all(r is None for r in revisions):
            return None
        return ",".join(r or "-" for r in revisions)

    def published_sidecar_source(self) -> ByteSource | None:
        return None  # each dataset's own source has its published sidecars

    def use_byte_cache(self, cache: ByteRangeCache | None) -> None:
        """Each remote dataset reads through ``cache`` (its own entries); local folders never do.
        :attr:`byte_cache` is then that cache when some dataset uses it (what the metrics report)."""
        for part in self.parts:
            part.use_byte_cache(cache)
        self.byte_cache = next((part.byte_cache for part in self.parts if part.byte_cache is not None), None)

    @property
    def http_stats(self) -> HttpStats:
        """Every HTTP dataset's request counters, summed (an ``AttributeError`` when none reads by HTTP)."""
        found = [part.http_stats for part in self.parts if hasattr(part, "http_stats")]
        if not found:
            raise AttributeError("http_stats: no dataset of this mixture is read over HTTP")
        total = HttpStats()
        counters = [f.name for f in dataclasses.fields(HttpStats) if f.name != "faults"]
        for stats in found:
            for name in counters:
                setattr(total, name, getattr(total, name) + getattr(stats, name))
            for kind, count in stats.faults.items():
                total.faults[kind] = total.faults.get(kind, 0) + count
        return total

    def part(self, path: str) -> tuple[ByteSource, str]:
        """The source of ``path`` and the path inside it."""
        index, rest = _split(path)
        if not 0 <= index < len(self.parts):
            raise FileNotFoundError(f"{path!r}: this mixture has {len(self.parts)} datasets")
        return self.parts[index], rest

    def byte_identity(self, path: str) -> str | None:
        part, rest = self.part(path)
        return part.byte_identity(rest)

    def list_files(self, prefix: str = "") -> list[FileInfo]:
        found: list[FileInfo] = []
        for index, part in enumerate(self.parts):
            mine = f"{index}/"
            if prefix.startswith(mine):
                inner = prefix[len(mine) :]
            elif mine.startswith(prefix):
                inner = ""
            else:
                continue
            found += [FileInfo(mine + f.path, f.size, f.fingerprint) for f in part.list_files(inner)]
        return sorted(found, key=lambda f: f.path)

    def info(self, path: str) -> FileInfo:
        part, rest = self.part(path)
        found = part.info(rest)
        return FileInfo(path, found.size, found.fingerprint)

    def read_file(self, path: str) -> bytes:
        part, rest = self.part(path)
        return part.read_file(rest)

    def read_ranges(self, path: str, ranges: Sequence[ByteRange]) -> list[bytes]:
        part, rest = self.part(path)
        return part.read_ranges(rest, ranges)

    def _read_file(self, path: str) -> bytes:
        return self.read_file(path)

    def _read_ranges(self, path: str, ranges: list[ByteRange]) -> list[bytes]:
        return self.read_ranges(path, ranges)
