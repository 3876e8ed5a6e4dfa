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
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import VideoIndexError
from .boxes import children, locate_moov, parse_box_header
from .index import VideoIndex, parse_moov
from .layout import ClipLayout, ClipOrigin
from .mux import CLIP_ORIGIN_UUID, ORIGIN_VERSION

if TYPE_CHECKING:
    from .plan import ClipPlan


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


def read_clip_layout(clip: bytes | bytearray | memoryview) -> ClipLayout:
    """The :class:`ClipLayout` of a clip, parsed from its ``moov`` (a planned clip has its layout
    from the plan already: :attr:`ClipPlan.layout <lerobot_nodes.mp4.plan.ClipPlan.layout>`)."""
    index, origin = read_clip(clip)
    return ClipLayout(
        codec=index.codec,
        timescale=index.timescale,
        codec_config=index.codec_config,
        offsets=index.offsets,
        sizes=index.sizes,
        pts=index.pts + origin.time_offset,
        dts=index.dts + origin.time_offset,
        keyframes=index.keyframes,
        origin=origin,
    )


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
        if version_flags >> 24 != ORIGIN_VERSION:
            break
        path = payload[56:].decode("utf-8", errors="replace")
        return ClipOrigin(path, time_offset, sample_start, first_pts, last_pts)
    raise VideoIndexError("<clip>: not a clip written by lerobot_nodes (no origin box in moov)")


__all__ = ["CLIP_ORIGIN_UUID", "ClipOrigin", "materialize_clip", "read_clip", "read_clip_layout"]
