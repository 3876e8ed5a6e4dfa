"""Read one episode of one camera out of a multi-episode MP4 by byte range, frame-exact.

Data flow (one module per step)::

    ByteSource --boxes--> moov --tables/index--> VideoIndex --plan--> ClipPlan
         --(fetch plan.byte_ranges)--> chunks --clip--> mini-MP4 bytes --decode--> frames
                                                        plan.layout ----^

Public API:

``read_index(path_or_url, source=None) -> VideoIndex``
    Index the first video track of an MP4: a local file, or a path relative to ``source`` (a
    :class:`~lerobot_nodes.sources.ByteSource`). Uses ``source.info`` plus at most two
    ``read_ranges`` round trips (moov before or after mdat). ``read_index_from_source(source,
    path)`` is the same with the source first; ``read_index_from_bytes(data)`` indexes bytes.

``VideoIndex``
    Plain per-sample numpy arrays in decode order, equal to FFmpeg's demuxer packets:
    ``offsets``, ``sizes``, ``dts``, ``pts`` (edit list applied like FFmpeg), ``durations``
    (int64) and ``keyframes`` (bool); scalars ``timescale``, ``codec`` (``"av1"``, ``"h264"``,
    ``"hevc"``), ``sample_entry``, ``codec_config`` (FFmpeg extradata), ``stsd`` (verbatim box),
    ``width``, ``height``, ``path``, ``file_size``, ``media_time``, ``empty_edit_duration``.
    ``to_arrays()`` / ``VideoIndex.from_arrays(d)`` round-trip through an NPZ.

``plan_clip(VideoIndex, from_s, to_s) -> ClipPlan``
    Samples, coalesced ``byte_ranges`` (``(start, end)``, end exclusive) and the exact clip
    ``size`` for the frames presented in ``[from_s, to_s)``, from the tables alone.

``materialize_clip(plan, chunks) -> bytes``
    A self-contained MP4 (ftyp, moov, mdat) from the fetched bytes of ``plan.byte_ranges``;
    ``len(result) == plan.size``. It has no edit list: source pts = clip pts +
    ``plan.time_offset`` (also recorded in the clip, see :func:`read_clip`).

``decode_clip(clip, timestamps_s, tolerance_s=1e-4, return_uint8=True) -> torch.Tensor``
    ``(T, C, H, W)`` frames nearest to source-timeline timestamps, bit-identical to decoding the
    whole file with PyAV (``to_ndarray(format="rgb24")``); LeRobot's tolerance check raises
    :class:`~lerobot_nodes.errors.FrameTimestampError`.

``ClipDecoder(clip)``
    The reusable decoder behind ``decode_clip``: keeps codec state for forward access, restarts
    at the key frame at or before a target for backward or random access. ``clip`` is a
    ``Clip(bytes, plan.layout)`` (the plan's :class:`ClipLayout`: no ``moov`` parsed back) or
    bare clip bytes (``read_clip_layout`` parses their ``moov``).

Errors: :class:`~lerobot_nodes.errors.VideoIndexError` (naming the file and the reason) for
MP4s that cannot be indexed: no video track, fragmented files, repeated or non-unit-rate edit
lists, edits that cut frames, truncated or inconsistent tables. :class:`VideoDecodeError` when
a clip's samples do not decode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import VideoDecodeError
from ..lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .clip import materialize_clip, read_clip, read_clip_layout
    from .decode import ClipDecoder, DecodedFrameBudget, decode_clip
    from .index import VideoIndex, read_index, read_index_from_bytes, read_index_from_source
    from .layout import Clip, ClipLayout, ClipOrigin
    from .plan import ClipPlan, plan_clip

# Imported on first use: the index and planning modules need neither PyAV nor torch, the decoder does.
__getattr__, __dir__ = lazy_exports(
    __name__,
    globals(),
    {
        **dict.fromkeys(("materialize_clip", "read_clip", "read_clip_layout"), ".clip"),
        **dict.fromkeys(("ClipDecoder", "DecodedFrameBudget", "decode_clip"), ".decode"),
        **dict.fromkeys(("VideoIndex", "read_index", "read_index_from_bytes", "read_index_from_source"), ".index"),
        **dict.fromkeys(("Clip", "ClipLayout", "ClipOrigin"), ".layout"),
        **dict.fromkeys(("ClipPlan", "plan_clip"), ".plan"),
    },
)

__all__ = [
    "Clip",
    "ClipDecoder",
    "ClipLayout",
    "DecodedFrameBudget",
    "ClipOrigin",
    "ClipPlan",
    "VideoDecodeError",
    "VideoIndex",
    "decode_clip",
    "materialize_clip",
    "plan_clip",
    "read_clip",
    "read_clip_layout",
    "read_index",
    "read_index_from_bytes",
    "read_index_from_source",
]
