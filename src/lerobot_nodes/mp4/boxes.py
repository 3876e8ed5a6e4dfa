"""ISO-BMFF boxes: header walking in memory and locating the ``moov`` box by range reads.

Guarantees:

- every walker checks sizes against its enclosing range, so a corrupt or truncated file raises
  :class:`~lerobot_nodes.errors.VideoIndexError` naming the file, never ``IndexError`` or
  ``struct.error``, and every loop advances by at least one header (no hang);
- :func:`locate_moov` finds ``moov`` in **at most two** ``read_ranges`` round trips for the
  layouts FFmpeg writes (``ftyp [free] mdat moov``, LeRobot's and FFmpeg's default, and
  ``ftyp moov [free] mdat`` with faststart), reading little beyond the ``moov`` itself: the first
  round trip reads a small head window (``ftyp``, the ``mdat`` header, or the start of a faststart
  ``moov``); the second reads exactly the bytes the box headers say are still missing: the rest
  of a faststart ``moov``, or everything after ``mdat`` (which is the ``moov`` in FFmpeg's layout).
  Nothing of the ``mdat`` payload is read beyond the head window, so streaming readers that fetch
  the payload by sample range do not pay for it twice.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ..errors import VideoIndexError
from ..sources import ByteRange

HEAD_WINDOW = 4 * 1024
"""Bytes read from the start of the file in the first round trip: ``ftyp``, ``free`` and the
``mdat`` header (FFmpeg writes about 56 bytes before the payload), or ``ftyp`` and a small
faststart ``moov``. Kept small: in the ``mdat``-first layout every byte past the ``mdat`` header
is payload that episode reads fetch again."""

TAIL_WINDOW = 0
"""Bytes read speculatively from the end of the file in the first round trip (0: none). A
trailing ``moov`` is read exactly once the ``mdat`` header has given its position, which costs
the same number of HTTP requests (a first read of a remote file is sequential anyway) and no
payload byte."""

# When the box after mdat is not read yet, the rest of the file is read in one go (it is the
# moov in every FFmpeg layout, so this is exactly the moov). Past this size a header window is
# read instead, so a file with a second huge mdat costs an extra round trip, not its payload.
_MAX_OPEN_ENDED_READ = 64 * 1024 * 1024
# Round trips allowed for unusual layouts (many top-level boxes after mdat) before giving up.
_MAX_ROUND_TRIPS = 8

ReadRanges = Callable[[Sequence[ByteRange]], list[bytes]]
"""Reads several byte ranges of one file in one round trip (``ByteSource.read_ranges``)."""


@dataclass(frozen=True)
class Box:
    """One box: ``type`` (four characters), absolute ``start``, ``header_size`` and total ``size``."""

    type: str
    start: int
    header_size: int
    size: int

    @property
    def payload_start(self) -> int:
        return self.start + self.header_size

    @property
    def end(self) -> int:
        return self.start + self.size


def fourcc(raw: bytes) -> str:
    """A box or sample-entry type as text (latin-1 keeps every byte, e.g. ``©nam``)."""
    return raw.decode("latin-1")


def parse_box_header(data: bytes | memoryview, position: int, limit: int, where: str) -> Box:
    """The box starting at ``position`` of ``data``; it must end at or before ``limit``.

    ``size == 0`` (box extends to the end of its container) resolves to ``limit``.
    """
    if limit - position < 8:
        raise VideoIndexError(f"{where}: truncated box header at byte {position}")
    size, raw_type = struct.unpack_from(">I4s", data, position)
    header_size = 8
    if size == 1:
        if limit - position < 16:
            raise VideoIndexError(f"{where}: truncated 64-bit box header at byte {position}")
        (size,) = struct.unpack_from(">Q", data, position + 8)
        header_size = 16
    elif size == 0:
        size = limit - position
    box_type = fourcc(raw_type)
    if size < header_size:
        raise VideoIndexError(f"{where}: box {box_type!r} at byte {position} has an invalid size {size}")
    if position + size > limit:
        raise VideoIndexError(
            f"{where}: box {box_type!r} at byte {position} claims {size} bytes but its container ends "
            f"{limit - position} bytes later (truncated file?)"
        )
    return Box(box_type, position, header_size, size)


def iter_boxes(data: bytes | memoryview, start: int, end: int, where: str) -> Iterator[Box]:
    """The consecutive boxes filling ``data[start:end]``; offsets are indices into ``data``."""
    position = start
    while position < end:
        box = parse_box_header(data, position, end, where)
        yield box
        position = box.end


def children(data: bytes | memoryview, parent: Box, where: str, skip: int = 0) -> list[Box]:
    """The child boxes of ``parent`` (``skip`` bytes of fields precede them in the payload)."""
    start = parent.payload_start + skip
    if start > parent.end:
        raise VideoIndexError(f"{where}: box {parent.type!r} at byte {parent.start} is too short")
    return list(iter_boxes(data, start, parent.end, where))


def find_child(boxes: list[Box], box_type: str) -> Box | None:
    """The first box of ``box_type`` in ``boxes``."""
    for box in boxes:
        if box.type == box_type:
            return box
    return None


def require_child(boxes: list[Box], box_type: str, parent: str, where: str) -> Box:
    box = find_child(boxes, box_type)
    if box is None:
        raise VideoIndexError(f"{where}: {parent} has no {box_type!r} box")
    return box


@dataclass(frozen=True)
class MoovLocation:
    """The ``moov`` box bytes (header included) and where they were found."""

    moov: bytes
    offset: int
    file_size: int
    top_level: tuple[str, ...]
    """Types of the top-level boxes walked before ``moov`` (for diagnostics)."""
    round_trips: int


class _Windows:
    """Byte windows already read from the file, looked up by absolute range."""

    def __init__(self) -> None:
        self._windows: list[tuple[int, bytes]] = []

    def add(self, start: int, data: bytes) -> None:
        """Keep ``data`` read at ``start``, joined with a window that starts where it ends."""
        end = start + len(data)
        for i, (window_start, window) in enumerate(self._windows):
            if window_start == end:
                self._windows[i] = (start, data + window)
                return
        self._windows.append((start, data))

    def unread_end(self, start: int, end: int) -> int:
        """``end``, or earlier when a window already holds ``[x, end)`` for some ``x > start``."""
        for window_start, window in self._windows:
            if start < window_start < end <= window_start + len(window):
                return window_start
        return end

    def get(self, start: int, end: int) -> bytes | None:
        for window_start, data in self._windows:
            if window_start <= start and end <= window_start + len(data):
                return data[start - window_start : end - window_start]
        return None

    def prefix(self, start: int) -> bytes:
        """The longest run of bytes already read from ``start`` on (possibly empty)."""
        best = b""
        for window_start, data in self._windows:
            if window_start <= start < window_start + len(data) and window_start + len(data) - start > len(
                best
            ):
                best = data[start - window_start :]
        return best


def locate_moov(
    read_ranges: ReadRanges,
    file_size: int,
    where: str,
    head_window: int = HEAD_WINDOW,
    tail_window: int = TAIL_WINDOW,
) -> MoovLocation:
    """Walk the top-level boxes of a file of ``file_size`` bytes and return its ``moov``.

    ``read_ranges`` is called once per round trip. Raises :class:`VideoIndexError` when the
    file is not an MP4 with a ``moov``, is truncated, or is fragmented (a ``moof`` box).
    """
    if file_size < 8:
        raise VideoIndexError(f"{where}: file of {file_size} bytes is too small to be an MP4")
    windows = _Windows()
    round_trips = 0

    def fetch(ranges: list[ByteRange]) -> None:
        nonlocal round_trips
        round_trips += 1
        if round_trips > _MAX_ROUND_TRIPS:
            raise VideoIndexError(f"{where}: no moov box found after {_MAX_ROUND_TRIPS} range reads")
        for (start, _), data in zip(ranges, read_ranges(ranges), strict=True):
            windows.add(start, data)

    if file_size <= head_window + tail_window:
        fetch([(0, file_size)])
    elif tail_window:
        fetch([(0, head_window), (file_size - tail_window, file_size)])
    else:
        fetch([(0, head_window)])

    top_level: list[str] = []
    position = 0
    after_mdat = False
    while position < file_size:
        header = windows.get(position, min(position + 16, file_size))
        if header is None:
            remaining = file_size - position
            if after_mdat and remaining <= _MAX_OPEN_ENDED_READ:
                # FFmpeg's layout: the moov fills the rest of the file, so this is exactly it.
                end = file_size
            else:
                # A header window: the next box may be an mdat whose payload is not wanted.
                end = min(file_size, position + max(head_window, HEAD_WINDOW))
            fetch([(position, windows.unread_end(position, end))])
            continue
        # Parse against the file bounds: the header bytes are all that is needed.
        box = parse_box_header(header, 0, file_size - position, where)
        box = Box(box.type, position, box.header_size, box.size)
        top_level.append(box.type)
        if box.type == "moov":
            moov = windows.get(box.start, box.end)
            if moov is None:
                # Only the part not read yet (a faststart moov larger than the head window).
                known = windows.prefix(box.start)
                fetch([(box.start + len(known), box.end)])
                rest = windows.get(box.start + len(known), box.end)
                assert rest is not None
                moov = known + rest
            return MoovLocation(moov, box.start, file_size, tuple(top_level), round_trips)
        if box.type == "moof":
            raise VideoIndexError(f"{where}: fragmented MP4 (moof box at byte {box.start}) is not supported")
        after_mdat = box.type == "mdat"
        position = box.end
    raise VideoIndexError(f"{where}: no moov box (top-level boxes: {', '.join(top_level) or 'none'})")
