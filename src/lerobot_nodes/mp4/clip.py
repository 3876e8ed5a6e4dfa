"""Self-contained mini-MP4 clips: ``ftyp``, ``moov``, ``mdat`` holding one span's samples.

A clip is what the byte budget counts and what decoders receive. Its layout:

- ``moov`` first (any FFmpeg-based tool opens it alone, from a file or from bytes), with one
  video track: the source's ``stsd`` copied verbatim, the source timescale, stts/ctts/stss
  re-encoded as runs, one chunk (``stsc`` + ``stco``) and per-sample ``stsz``;
- **no edit list**, so FFmpeg reports ``pts = source pts - time_offset`` and
  ``dts = source dts - time_offset`` with ``time_offset`` the source dts of the first sample
  (this avoids FFmpeg's empty-edit and "first presented frame snaps to the edit" rules);
- a ``uuid`` box in ``moov`` (ignored by other readers) recording ``time_offset``, the source
  sample range, the needed presentation times and the source path (:class:`ClipOrigin`);
- ``mdat`` with the samples back to back in decode order.

``len(materialize_clip(plan, chunks)) == plan.size`` always; the header bytes are built at
planning time from the tables, so the size is known before any payload is fetched.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import VideoIndexError
from .boxes import children, locate_moov, parse_box_header
from .index import VideoIndex, parse_moov

if TYPE_CHECKING:
    from .plan import ClipPlan, ClipTables

CLIP_ORIGIN_UUID = uuid.UUID("8f3b6a52-2c1e-4d1b-9b8e-6c0a7f4e5d21")
"""Extended type of the ``uuid`` box that records where a clip comes from."""

_ORIGIN_VERSION = 0
_UNITY_MATRIX = struct.pack(">9I", 0x00010000, 0, 0, 0, 0x00010000, 0, 0, 0, 0x40000000)
_BRANDS = {"av1": b"av01", "h264": b"avc1", "hevc": b"hvc1"}
_MAX_32 = 0xFFFFFFFF


@dataclass(frozen=True)
class ClipOrigin:
    """Where a clip's samples come from (read back from its ``uuid`` box)."""

    path: str
    time_offset: int
    """Source pts = clip pts + ``time_offset`` (ticks of the clip's timescale)."""
    source_sample_start: int
    first_needed_pts: int
    last_needed_pts: int
    """Source presentation times of the first and last frame of the planned span."""


def _box(box_type: bytes, *parts: bytes) -> bytes:
    body = b"".join(parts)
    return struct.pack(">I4s", 8 + len(body), box_type) + body


def _full_box(box_type: bytes, version: int, flags: int, *parts: bytes) -> bytes:
    return _box(box_type, struct.pack(">I", (version << 24) | flags), *parts)


def _table(box_type: bytes, rows: Sequence[np.ndarray]) -> bytes:
    """A full box holding an entry count and big-endian 32-bit columns."""
    table = np.stack([np.asarray(column, dtype=np.int64) for column in rows], axis=1)
    if len(table) and (table.min() < 0 or table.max() > _MAX_32):
        raise VideoIndexError(f"a {box_type.decode()} value does not fit in 32 bits")
    return _full_box(box_type, 0, 0, struct.pack(">I", len(table)), table.astype(">u4").tobytes())


def build_clip_header(
    index: VideoIndex,
    tables: ClipTables,
    payload_size: int,
    *,
    time_offset: int,
    source_sample_start: int,
    first_needed_pts: int,
    last_needed_pts: int,
) -> bytes:
    """The bytes of a clip before its payload: ``ftyp``, ``moov`` and the ``mdat`` header."""
    ftyp = _box(b"ftyp", b"isom", struct.pack(">I", 512), b"isom", b"iso2", _BRANDS[index.codec], b"mp41")
    sample_count = len(tables.sizes)
    counts, durations = tables.time_to_sample
    duration = int((counts * durations).sum())
    timescale = index.timescale

    stbl_parts = [index.stsd, _table(b"stts", [counts, durations])]
    if tables.composition_offsets is not None:
        stbl_parts.append(_table(b"ctts", list(tables.composition_offsets)))
    if tables.sync_samples is not None:
        stbl_parts.append(_table(b"stss", [tables.sync_samples]))
    stbl_parts.append(_table(b"stsc", [np.array([1]), np.array([sample_count]), np.array([1])]))
    stbl_parts.append(
        _full_box(b"stsz", 0, 0, struct.pack(">II", 0, sample_count), tables.sizes.astype(">u4").tobytes())
    )
    mdat_header_size = 8 if payload_size + 8 <= _MAX_32 else 16
    origin = _origin_box(index.path, time_offset, source_sample_start, first_needed_pts, last_needed_pts)

    def moov_with_chunk_offset(offset: int) -> bytes:
        stco = _table(b"stco", [np.array([offset])])
        return _moov(index, timescale, duration, [*stbl_parts, stco], origin)

    # The moov size does not depend on the chunk offset's value, only on its presence.
    payload_offset = len(ftyp) + len(moov_with_chunk_offset(0)) + mdat_header_size
    if payload_offset > _MAX_32:
        raise VideoIndexError(f"{index.path}: clip header of {payload_offset} bytes is too large")
    moov = moov_with_chunk_offset(payload_offset)
    if mdat_header_size == 8:
        mdat_header = struct.pack(">I4s", 8 + payload_size, b"mdat")
    else:
        mdat_header = struct.pack(">I4sQ", 1, b"mdat", 16 + payload_size)
    return ftyp + moov + mdat_header


def _moov(index: VideoIndex, timescale: int, duration: int, stbl_parts: list[bytes], origin: bytes) -> bytes:
    mvhd = _full_box(
        b"mvhd", 1, 0,
        struct.pack(">QQIQ", 0, 0, timescale, duration),
        struct.pack(">IH10x", 0x00010000, 0x0100),
        _UNITY_MATRIX,
        bytes(24),
        struct.pack(">I", 2),
    )  # fmt: skip
    tkhd = _full_box(
        b"tkhd", 1, 3,
        struct.pack(">QQIIQ", 0, 0, 1, 0, duration),
        bytes(8),
        struct.pack(">hhhH", 0, 0, 0, 0),
        _UNITY_MATRIX,
        struct.pack(">II", index.width << 16, index.height << 16),
    )  # fmt: skip
    mdhd = _full_box(
        b"mdhd", 1, 0, struct.pack(">QQIQ", 0, 0, timescale, duration), struct.pack(">HH", 0x55C4, 0)
    )
    hdlr = _full_box(b"hdlr", 0, 0, bytes(4), b"vide", bytes(12), b"VideoHandler\x00")
    vmhd = _full_box(b"vmhd", 0, 1, bytes(8))
    dinf = _box(b"dinf", _full_box(b"dref", 0, 0, struct.pack(">I", 1), _full_box(b"url ", 0, 1)))
    minf = _box(b"minf", vmhd, dinf, _box(b"stbl", *stbl_parts))
    trak = _box(b"trak", tkhd, _box(b"mdia", mdhd, hdlr, minf))
    return _box(b"moov", mvhd, trak, origin)


def _origin_box(path: str, time_offset: int, sample_start: int, first_pts: int, last_pts: int) -> bytes:
    fields = struct.pack(">IqqqqI", _ORIGIN_VERSION << 24, time_offset, sample_start, first_pts, last_pts, 0)
    return _box(b"uuid", CLIP_ORIGIN_UUID.bytes, fields, path.encode("utf-8"))


def materialize_clip(plan: ClipPlan, chunks: Sequence[bytes | bytearray | memoryview]) -> bytes:
    """Assemble the clip of ``plan`` from the fetched bytes of ``plan.byte_ranges`` (in order).

    Raises ``ValueError`` when ``chunks`` do not match the planned ranges. The result is
    exactly ``plan.size`` bytes.
    """
    if len(chunks) != len(plan.byte_ranges):
        raise ValueError(
            f"{plan.path}: got {len(chunks)} chunks for {len(plan.byte_ranges)} planned byte ranges"
        )
    views = [memoryview(chunk).cast("B") for chunk in chunks]
    for i, ((start, end), view) in enumerate(zip(plan.byte_ranges, views, strict=True)):
        if len(view) != end - start:
            raise ValueError(
                f"{plan.path}: chunk {i} has {len(view)} bytes but byte range [{start}, {end}) needs {end - start}"
            )
    out = bytearray(plan.size)
    position = len(plan.header)
    out[:position] = plan.header
    for range_index, start, end in plan.segments:
        out[position : position + end - start] = views[range_index][start:end]
        position += end - start
    if position != plan.size or len(out) != plan.size:
        raise AssertionError(f"{plan.path}: clip has {position} bytes, planned {plan.size}")
    return bytes(out)


def read_clip(clip: bytes | bytearray | memoryview) -> tuple[VideoIndex, ClipOrigin]:
    """The sample index of a clip (clip timeline) and its :class:`ClipOrigin`.

    Raises :class:`VideoIndexError` when ``clip`` is not a clip written by this module.
    """
    view = memoryview(clip).cast("B")
    location = locate_moov(lambda ranges: [bytes(view[a:b]) for a, b in ranges], len(view), "<clip>")
    origin = _read_origin(location.moov)
    where = f"clip of {origin.path}"
    return parse_moov(location.moov, len(view), origin.path, where), origin


def _read_origin(moov: bytes) -> ClipOrigin:
    moov_box = parse_box_header(moov, 0, len(moov), "<clip>")
    for box in children(moov, moov_box, "<clip>"):
        payload = moov[box.payload_start : box.end]
        if box.type != "uuid" or payload[:16] != CLIP_ORIGIN_UUID.bytes:
            continue
        if len(payload) < 16 + 40:
            break
        version_flags, time_offset, sample_start, first_pts, last_pts, _ = struct.unpack_from(
            ">IqqqqI", payload, 16
        )
        if version_flags >> 24 != _ORIGIN_VERSION:
            break
        path = payload[56:].decode("utf-8", errors="replace")
        return ClipOrigin(path, time_offset, sample_start, first_pts, last_pts)
    raise VideoIndexError("<clip>: not a clip written by lerobot_nodes (no origin box in moov)")


__all__ = ["CLIP_ORIGIN_UUID", "ClipOrigin", "build_clip_header", "materialize_clip", "read_clip"]
