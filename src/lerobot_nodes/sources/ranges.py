"""Byte-range arithmetic shared by every planner and reader: one coalescing rule."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

ByteRange = tuple[int, int]
"""A half-open byte range ``(start, end)``: ``end`` is exclusive."""


def coalesce(ranges: Iterable[ByteRange], gap: int = 0) -> list[ByteRange]:
    """Sorted, merged ranges: overlapping ranges, and neighbours at most ``gap`` bytes apart, become one."""
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def covering(ranges: Sequence[ByteRange], merged: Sequence[ByteRange]) -> list[int]:
    """For each of ``ranges``, the position in ``merged`` (sorted, disjoint) of the range holding it."""
    positions = []
    for start, end in ranges:
        low, high = 0, len(merged) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if merged[middle][0] <= start:
                low = middle
            else:
                high = middle - 1
        if not merged or not (merged[low][0] <= start and end <= merged[low][1]):
            raise ValueError(f"byte range ({start}, {end}) is not inside any of the merged ranges")
        positions.append(low)
    return positions


def split(byte_range: ByteRange, parts: int, minimum: int = 1) -> list[ByteRange]:
    """``byte_range`` cut into at most ``parts`` contiguous pieces of at least ``minimum`` bytes."""
    start, end = byte_range
    length = end - start
    count = max(1, min(parts, length // max(1, minimum)))
    bounds = [start + length * i // count for i in range(count + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(count)]
