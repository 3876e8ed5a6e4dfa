"""Data-Parquet row groups shared by several episodes of one reader, fetched once per epoch.

A row group may hold the end of one episode and the start of the next (LeRobot's writers cut
row groups by size, not by episode). Read per episode, such a row group is fetched once per
episode that needs it. :class:`SharedRowGroups` knows the reader's episodes (the worker's
share), so it knows every row group's users: the first fetch that needs a row group reads it,
the bytes are kept until the last of its users has been fetched, then dropped. Each epoch
fetches each episode once, so each row group is read once per epoch.

Guarantees:

* exactness: the kept bytes are the file's own bytes for the same ranges (sources are pinned to
  one content identity), so decoding sees exactly what a read of its own would have returned;
* thread safety and no double read under concurrent fetches: a row group being read by one
  fetch is waited for by the others (the reading fetch never waits for anyone before its own
  read is done, so there is no wait cycle); a failed read is retried by a waiting fetch itself;
* bounded memory: at most ``max_bytes`` of kept row groups (oldest dropped first; a dropped
  row group is read again by its later users, which costs bytes, never correctness). Episodes
  outside the reader's list (or with no list) get no sharing: they read what they need.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from ..format.parquet import EpisodeRowsPlan, EpisodeTableReader, ParquetFooter, candidate_row_groups
from ..sources import ByteRange
from ..sources.ranges import coalesce

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""Row-group bytes one reader keeps at most for its later episodes."""

ReadRanges = Callable[[str, list[ByteRange]], list[bytes]]
"""``(path, ranges) -> bytes of each range``: the fetcher's (error-wrapping) read."""


@dataclass
class _Entry:
    pending: set[int]
    """Users (episodes) not fetched yet; the entry is dropped when this is empty."""
    future: Future[dict[int, bytes]] = field(default_factory=Future)
    size: int = 0


@dataclass(frozen=True)
class RowsRead:
    """The pieces covering an episode's row groups, and how many bytes this fetch read."""

    pieces: dict[int, bytes]
    read_bytes: int
    read_ranges: list[ByteRange]


class SharedRowGroups:
    """Fetches the row groups of a reader's episodes, each once while it has users left."""

    def __init__(
        self, rows: EpisodeTableReader, episodes: Sequence[int] | None, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.rows = rows
        self.meta = rows.meta
        self.max_bytes = int(max_bytes)
        self._episodes = {int(e) for e in episodes} if episodes is not None else set()
        self._users: dict[str, dict[int, frozenset[int]]] = {}
        self._entries: OrderedDict[tuple[str, int], _Entry] = OrderedDict()
        self._kept_bytes = 0
        self._lock = threading.Lock()
        self.reads = 0
        self.shared_hits = 0

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return self._kept_bytes

    # -- users --------------------------------------------------------------------------------
    def _users_of(self, path: str, footer: ParquetFooter) -> dict[int, frozenset[int]]:
        """Per row group of ``path``, the reader's episodes whose plans include it."""
        with self._lock:
            found = self._users.get(path)
        if found is not None:
            return found
        mine = [e for e in sorted(self._episodes) if self.meta.data_file(e) == path]
        users: dict[int, set[int]] = {}
        bounds = _episode_bounds(footer)
        for episode in mine:
            if bounds is None:
                groups = candidate_row_groups(footer.metadata, episode)
            else:
                low, high, has = bounds
                groups = np.flatnonzero(~has | ((low <= episode) & (episode <= high))).tolist()
            for group in groups:
                users.setdefault(int(group), set()).add(episode)
        frozen = {group: frozenset(members) for group, members in users.items()}
        with self._lock:
            return self._users.setdefault(path, frozen)

    # -- fetching -----------------------------------------------------------------------------
    def fetch(self, episode: int, plan: EpisodeRowsPlan, read: ReadRanges) -> RowsRead:
        """The pieces covering ``plan``'s row groups: kept ones, waited-for ones, and one read of
        the rest (coalesced). The episode then stops being a user of each of its row groups."""
        footer = self.rows.footer(plan.path)
        users = self._users_of(plan.path, footer) if episode in self._episodes else {}
        mine: list[int] = []  # row groups this fetch reads (and publishes when shared)
        waits: dict[int, Future[dict[int, bytes]]] = {}
        with self._lock:
            for group in plan.row_groups:
                key = (plan.path, group)
                entry = self._entries.get(key)
                if entry is not None:
                    waits[group] = entry.future
                    continue
                mine.append(group)
                others = users.get(group, frozenset()) - {episode}
                if others:  # someone else will need it: share it
                    self._entries[key] = _Entry(pending=set(others))
        pieces: dict[int, bytes] = {}
        read_bytes, read_ranges = 0, list[ByteRange]()
        if mine:
            got, read_bytes, read_ranges = self._read_groups(plan, footer, mine, read, publish=True)
            pieces.update(got)
        for group, future in waits.items():
            try:
                got = future.result()
                with self._lock:
                    self.shared_hits += 1
            except BaseException:
                # The reading fetch failed (its own episode reports it): read it here instead.
                got, more, ranges = self._read_groups(plan, footer, [group], read, publish=False)
                read_bytes += more
                read_ranges += ranges
            pieces.update(got)
        self._done_with(episode, plan)
        return RowsRead(pieces=pieces, read_bytes=read_bytes, read_ranges=read_ranges)

    def _read_groups(
        self, plan: EpisodeRowsPlan, footer: ParquetFooter, groups: list[int], read: ReadRanges, *, publish: bool
    ) -> tuple[dict[int, bytes], int, list[ByteRange]]:
        wanted = {g: [r for r in (footer.unread(x) for x in plan.group_ranges[g]) if r and r[1] > r[0]] for g in groups}
        ranges = coalesce([r for rs in wanted.values() for r in rs])
        try:
            chunks = read(plan.path, ranges) if ranges else []
        except BaseException as exc:
            if publish:
                self._fail(plan.path, groups, exc)
            raise
        by_start = dict(zip((start for start, _ in ranges), chunks, strict=True))
        pieces: dict[int, bytes] = {}
        for group in groups:
            own: dict[int, bytes] = {}
            for start, end in wanted[group]:
                # The coalesced read holding [start, end): slice it out (the group's own bytes).
                base = max(s for s in by_start if s <= start)
                own[start] = by_start[base][start - base : end - base]
            pieces.update(own)
            if publish:
                self._publish(plan.path, group, own)
        with self._lock:
            self.reads += 1 if ranges else 0
        return pieces, sum(end - start for start, end in ranges), ranges

    def _publish(self, path: str, group: int, own: dict[int, bytes]) -> None:
        with self._lock:
            entry = self._entries.get((path, group))
            if entry is None or entry.future.done():
                return
            entry.size = sum(len(chunk) for chunk in own.values())
            self._kept_bytes += entry.size
            entry.future.set_result(own)
            if not entry.pending:  # every other user was fetched while this read ran
                self._drop((path, group))
            self._trim()

    def _fail(self, path: str, groups: list[int], exc: BaseException) -> None:
        with self._lock:
            for group in groups:
                entry = self._entries.get((path, group))
                if entry is not None and not entry.future.done():
                    del self._entries[(path, group)]
                    entry.future.set_exception(exc)

    def _done_with(self, episode: int, plan: EpisodeRowsPlan) -> None:
        with self._lock:
            for group in plan.row_groups:
                key = (plan.path, group)
                entry = self._entries.get(key)
                if entry is None:
                    continue
                entry.pending.discard(episode)
                if not entry.pending and entry.future.done():
                    self._drop(key)

    def _drop(self, key: tuple[str, int]) -> None:
        entry = self._entries.pop(key)
        self._kept_bytes -= entry.size

    def _trim(self) -> None:
        """Drop the oldest kept row groups while over ``max_bytes`` (lock held)."""
        while self._kept_bytes > self.max_bytes:
            oldest = next((key for key, entry in self._entries.items() if entry.future.done()), None)
            if oldest is None:
                return
            self._drop(oldest)

    def clear(self) -> None:
        """Forget every kept row group (in-flight reads still finish for their own fetches)."""
        with self._lock:
            for key in [key for key, entry in self._entries.items() if entry.future.done()]:
                self._drop(key)


def _episode_bounds(footer: ParquetFooter) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per row group ``(min, max, has_min_max)`` of ``episode_index`` (``None``: no such column)."""
    metadata = footer.metadata
    column = next((i for i in range(metadata.num_columns) if metadata.schema.column(i).path == "episode_index"), None)
    if column is None:
        return None
    count = metadata.num_row_groups
    low, high = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
    has = np.zeros(count, dtype=bool)
    for group in range(count):
        stats = metadata.row_group(group).column(column).statistics
        if stats is not None and stats.has_min_max:
            low[group], high[group], has[group] = int(stats.min), int(stats.max), True
    return low, high, has
