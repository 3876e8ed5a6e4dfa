"""Writing clip headers: the ``ftyp``, ``moov`` and ``mdat`` header of a self-contained mini-MP4.

The header of a clip is built at planning time from the sample tables alone
(:func:`build_clip_header`), so a clip's exact size is known before any payload is fetched.
Its layout is described in :mod:`lerobot_nodes.mp4.clip`, which assembles and reads clips.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import VideoIndexError
from .index import VideoIndex

CLIP_ORIGIN_UUID = uuid.UUID("8f3b6a52-2c1e-4d1b-9b8e-6c0a7f4e5d21")
"""Extended type of the ``uuid`` box that records where a clip comes from."""

ORIGIN_VERSION = 0
_UNITY_MATRIX = struct.pack(">9I", 0x00010000, 0, 0, 0, 0x00010000, 0, 0, 0, 0x40000000)
_BRANDS = {"av1": b"av01", "h264": b"avc1", "hevc": b"hvc1"}
_MAX_32 = 0xFFFFFFFF


@dataclass(frozen=True)
class ClipTables:
    """The sample tables written into a clip: runs and per-sample arrays for its samples."""

    sizes: np.ndarray
    time_to_sample: tuple[np.ndarray, np.ndarray]
    """``(counts, durations)`` runs (stts)."""
    composition_offsets: tuple[np.ndarray, np.ndarray] | None
    """``(counts, pts - dts)`` runs (ctts v0), ``None`` when every offset is 0."""
    sync_samples: np.ndarray | None
    """1-based sync sample numbers (stss), ``None`` when every sample is a sync sample."""


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
    fields = struct.pack(">IqqqqI", ORIGIN_VERSION << 24, time_offset, sample_start, first_pts, last_pts, 0)
    return _box(b"uuid", CLIP_ORIGIN_UUID.bytes, fields, path.encode("utf-8"))
