"""Decoding frames of a clip by source timestamp, bit-identical to decoding the whole file.

:class:`ClipDecoder` feeds the clip's samples as raw packets to a PyAV codec context (the
decoder FFmpeg itself picks for the stream, ``thread_count=1``, the ``av1C``/``avcC``/``hvcC``
payload as extradata). Packets carry source-timeline pts/dts, so decoded ``frame.pts`` are
source presentation times and frames are matched to queries by pts, never by output position.
RGB frames have the values of ``frame.to_ndarray(format="rgb24")`` then CHW, as LeRobot's
PyAV backend and :class:`~lerobot_nodes.MapStyleLeRobotDataset` return them, converted by one
:class:`~lerobot_nodes.mp4.rgb.RgbConverter` per decoder (planar RGB, one swscale context). A depth camera's decoder (``depth=True``) returns the frames' 12-bit ``gray12le``
codes instead, ``(T, 1, H, W)`` uint16, as LeRobot does before dequantising them
(:mod:`lerobot_nodes.format.depth`).

Decoding only does what a query needs: forward queries continue from the decoder's current
state; a query behind it (or far ahead of it) restarts at the last key frame at or before the
target whose pts is not after it. A query whose frame lies before a *clean cut* (a key frame
no earlier-presented frame is decoded after, e.g. every closed-GOP key frame) drains the codec
there instead of sending the next GOP's first packets, so a reordered (B-frame) GOP costs its
own packets only; a later query in the next GOP continues from that key frame for free.

Decoded frames kept between queries are charged to a :class:`DecodedFrameBudget`, shared by
the decoders of one worker: bytes and frames resident, their peak, and a least-recently-used
eviction that keeps them within the budget. Decoding and conversion release the GIL inside PyAV.
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from fractions import Fraction
from typing import cast

import av
import numpy as np
import torch
from av.video.codeccontext import VideoCodecContext

from ..errors import VideoDecodeError, VideoIndexError
from ..format.depth import codes_to_tensor, depth_codes
from .clip import materialize_clip, read_clip_layout
from .file_video import ERROR_DETECTION, h264_keys_are_idr, tolerance_error
from .layout import Clip, ClipLayout, ClipOrigin
from .plan import ClipPlan
from .rgb import RgbConverter

DEFAULT_FRAME_CACHE_SIZE = 5
"""Decoded frames one :class:`ClipDecoder` keeps at most for repeated or overlapping queries:
enough for anchors visited in ascending runs with a two-frame history window plus the frames
a B-frame drain outputs past the target (x264's b-pyramid: up to three). Measured on the
3-camera H.264 g30 B-frame dataset: decoded per delivered frame 1.025 with 3 to 8 frames, and
each frame fewer is 17 MB less there (16 decoders at 480x640). The shared
:class:`DecodedFrameBudget` bounds the total over all decoders of a worker."""


REORDER_FRAMES = 3
"""Frames a B-frame drain can output past its target (x264's b-pyramid), kept for later queries."""


SHORT_GOP_FRAMES = 2
"""Longest GOP (frames from a key frame to the next) of a clip whose decoder can read ahead to
the end of each GOP it starts (``ClipDecoder(read_ahead=True)``): LeRobot's AV1 (g=2)."""

READ_AHEAD_CODECS = frozenset({"av1"})
"""Codecs whose decoder (one thread) outputs each frame when its packet is sent, so a frame read
ahead is there when it is asked for. H.264's decoder may hold frames back for reordering even
without B-frames (measured on x264 g=2): reading ahead would decode twice, never change a frame."""


def reads_ahead(layout: ClipLayout) -> bool:
    """Whether a decoder of ``layout`` reads ahead when asked to: AV1, every GOP at most
    :data:`SHORT_GOP_FRAMES` frames and frames presented in decode order."""
    keys = np.flatnonzero(layout.keyframes)
    if len(keys) == 0 or layout.codec not in READ_AHEAD_CODECS:
        return False
    gops = np.diff(np.append(keys, len(layout)))
    return bool(gops.max() <= SHORT_GOP_FRAMES and not np.any(np.diff(layout.pts) <= 0))


def frames_to_keep(layout: ClipLayout, window_frames: int) -> int:
    """Decoded frames a decoder of ``layout`` keeps, for a camera window spanning ``window_frames``
    consecutive frames: the window (ascending anchors' windows share all but their newest
    frame), plus :data:`REORDER_FRAMES` when the clip presents frames out of decode order; at
    most :data:`DEFAULT_FRAME_CACHE_SIZE`. A frame kept beyond that is never asked for again
    when anchors run forward (LeRobot's AV1 with one frame per sample: one frame, not five)."""
    reorders = bool(np.any(np.diff(layout.pts) < 0))
    wanted = int(window_frames) + (REORDER_FRAMES if reorders else 0)
    return max(1, min(DEFAULT_FRAME_CACHE_SIZE, wanted))


def frame_charge(frame: av.VideoFrame) -> int:
    """Bytes a cached decoded frame is charged: the larger of its planes and its RGB form (frames
    are kept as decoded and converted per query, so this is an upper bound of what it holds)."""
    planes = sum(int(plane.buffer_size) for plane in frame.planes)
    return max(planes, int(frame.width) * int(frame.height) * 3)


class DecodedFrameBudget:
    """Decoded frames kept by the clip decoders of one worker, bounded in bytes; thread-safe.

    Guarantee: after every :meth:`put` the frames held here total at most ``limit_bytes``
    (``None``: unbounded). When a new frame would exceed it, the least recently used frames of
    any decoder are dropped (the new frame too, when it alone exceeds the limit). Dropping a
    frame never changes a result, only what a later query must decode again. Each frame is
    charged :func:`frame_charge` (its RGB size, an upper bound of its YUV size). The frames a
    query returns are held by the query until it returns, outside this account.

    ``resident_bytes``/``resident_frames`` are what is held now, ``peak_bytes``/``peak_frames``
    the most ever held (both within the limit), ``evictions`` the frames dropped for the limit.
    """

    def __init__(self, limit_bytes: int | None = None) -> None:
        if limit_bytes is not None and limit_bytes < 0:
            raise ValueError(f"decoded frame budget must be >= 0 bytes, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._order: OrderedDict[tuple[int, int], int] = OrderedDict()  # (owner, pts) -> bytes, LRU first
        self._frames: dict[int, OrderedDict[int, av.VideoFrame]] = {}
        self._owners = 0
        self.resident_bytes = 0
        self.peak_bytes = 0
        self.peak_frames = 0
        self.evictions = 0

    @property
    def resident_frames(self) -> int:
        with self._lock:
            return len(self._order)

    def register(self) -> int:
        """A new owner key (one per decoder)."""
        with self._lock:
            self._owners += 1
            self._frames[self._owners] = OrderedDict()
            return self._owners

    def holds(self, owner: int, pts: int) -> bool:
        """Whether ``owner``'s frame at ``pts`` is kept (its recency unchanged)."""
        with self._lock:
            frames = self._frames.get(owner)
            return frames is not None and pts in frames

    def get(self, owner: int, pts: int, touch: bool = True) -> av.VideoFrame | None:
        """``owner``'s frame at ``pts``, or None; ``touch`` False leaves it where it is among the owner's
        frames (they are then dropped in the order they were put) but still marks it used for the budget."""
        with self._lock:
            frames = self._frames.get(owner)
            entry = frames.get(pts) if frames is not None else None
            if entry is not None:
                if touch:
                    frames.move_to_end(pts)  # type: ignore[union-attr]
                self._order.move_to_end((owner, pts))
            return entry

    def put(self, owner: int, pts: int, entry: av.VideoFrame, charge: int, owner_limit: int) -> None:
        """Keep ``entry``; drop this owner's oldest beyond ``owner_limit`` frames, then any LRU over the budget."""
        with self._lock:
            frames = self._frames.setdefault(owner, OrderedDict())
            if pts in frames:
                self._drop(owner, pts)
            frames[pts] = entry
            self._order[(owner, pts)] = charge
            self.resident_bytes += charge
            while len(frames) > owner_limit:
                self._drop(owner, next(iter(frames)))
            limit = self.limit_bytes
            while limit is not None and self.resident_bytes > limit and self._order:
                self._drop(*next(iter(self._order)))
                self.evictions += 1
            self.peak_bytes = max(self.peak_bytes, self.resident_bytes)
            self.peak_frames = max(self.peak_frames, len(self._order))

    def discard(self, owner: int, pts: int) -> None:
        """Drop ``owner``'s frame at ``pts`` if kept (not an eviction: it will not be asked for again)."""
        with self._lock:
            frames = self._frames.get(owner)
            if frames is not None and pts in frames:
                self._drop(owner, pts)

    def release(self, owner: int) -> None:
        """Drop every frame of ``owner`` (its decoder closed)."""
        with self._lock:
            for pts in list(self._frames.get(owner, ())):
                self._drop(owner, pts)

    def forget(self, owner: int) -> None:
        """Drop every frame of ``owner`` and the owner itself."""
        with self._lock:
            for pts in list(self._frames.get(owner, ())):
                self._drop(owner, pts)
            self._frames.pop(owner, None)

    def _drop(self, owner: int, pts: int) -> None:
        self.resident_bytes -= self._order.pop((owner, pts))
        del self._frames[owner][pts]


class CodecContextPool:
    """What the :class:`ClipDecoder` s of one worker share instead of each setting it up: the codec
    contexts of closed decoders, for the decoders opened next, and one RGB converter per thread;
    thread-safe.

    Opening a codec context costs far more than a seek on a short GOP (the codec allocates its
    state and picture pool on first use and frees them on close), and so does a converter's first
    frame (swscale builds its context and tables), so a schedule that opens several decoders per
    episode and camera (open anchor runs) paid both per decoder. A context here is flushed when it
    is given back (no reference or decoded frame left in it) and is handed out only to a decoder of
    the same codec and codec configuration (``av1C``/``avcC``/``hvcC`` bytes), which then starts at a
    key frame exactly as after a seek (the decoders already restart with ``flush_buffers``), so it
    decodes what a new context does. A converter converts one frame at a time on its thread and
    its swscale context depends only on the frame's kind, so the frames are the same whichever
    converter makes them. At most ``limit`` contexts are kept, the most recently given back first;
    ``taken``/``created`` count reused and new contexts.
    """

    def __init__(self, limit: int = 0) -> None:
        self.limit = max(0, int(limit))
        self._lock = threading.Lock()
        self._free: list[tuple[tuple[str, bytes], VideoCodecContext]] = []
        self._local = threading.local()
        self.taken = 0
        self.created = 0

    def converter(self) -> RgbConverter:
        """This thread's RGB converter."""
        converter = getattr(self._local, "converter", None)
        if converter is None:
            converter = self._local.converter = RgbConverter()
        return cast(RgbConverter, converter)

    def take(self, name: str, extradata: bytes | None) -> VideoCodecContext | None:
        """A flushed context of this codec configuration, or None (open a new one)."""
        kind = (name, bytes(extradata or b""))
        with self._lock:
            for position in range(len(self._free) - 1, -1, -1):
                if self._free[position][0] == kind:
                    self.taken += 1
                    return self._free.pop(position)[1]
            self.created += 1
        return None

    def give(self, name: str, extradata: bytes | None, context: VideoCodecContext) -> None:
        """Keep ``context`` (flushed now) for a later decoder; the oldest beyond ``limit`` are dropped."""
        if self.limit <= 0:
            return
        context.flush_buffers()
        with self._lock:
            self._free.append(((name, bytes(extradata or b"")), context))
            del self._free[: max(0, len(self._free) - self.limit)]

    def __len__(self) -> int:
        with self._lock:
            return len(self._free)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


def decoder_name(codec: str) -> str:
    """The FFmpeg decoder ``av.open`` uses for ``codec`` (so both paths decode identically)."""
    if codec == "av1":
        return "libdav1d" if "libdav1d" in av.codecs_available else "libaom-av1"
    if codec in ("h264", "hevc"):
        return codec
    raise VideoIndexError(f"unsupported codec {codec!r}")


class ClipDecoder:
    """Decode frames of one clip (one episode of one camera) by source timestamp.

    Keeps its codec state between calls: a query at or after the previous one continues
    decoding forward; an earlier one restarts at the key frame at or before it. At a clean cut
    (see the module) the codec is drained rather than fed the next GOP, and continues from the
    cut when a later query needs it. Up to ``frame_cache_size`` decoded frames are kept in
    ``frame_budget`` (a private unbounded one by default; shared by a worker's decoders), so
    overlapping windows and ascending anchors decode nothing twice. Frames are bit-identical to
    decoding the whole file whatever the query order, cache size or budget. Calls are
    serialised by an internal lock; use one decoder per thread for parallel decoding.

    ``clip`` is a :class:`~lerobot_nodes.mp4.layout.Clip` (the bytes and the layout its plan
    made, as :class:`~lerobot_nodes.fetch.episode_fetch.EpisodeFetcher` delivers them) or bare
    clip bytes, whose layout is then parsed from their ``moov``.

    ``asked_once``: each frame is asked for once (a streaming reader's camera windows of one frame:
    every anchor once per epoch), so a frame returned is dropped from the cache at once instead of
    held until newer ones push it out; a frame asked for again is decoded again, never different.

    Counters: ``samples_decoded`` (packets sent to the codec), ``restarts`` (seeks) and
    ``drains`` (GOPs ended by a drain instead of the next GOP's packets). A decoder serves one
    camera: RGB frames, or (``frames_at(..., depth=True)`` from the first call on) the codes of
    a depth camera.
    """

    def __init__(
        self,
        clip: Clip | bytes | bytearray | memoryview,
        *,
        frame_cache_size: int = DEFAULT_FRAME_CACHE_SIZE,
        frame_budget: DecodedFrameBudget | None = None,
        context_pool: CodecContextPool | None = None,
        read_ahead: bool = False,
        asked_once: bool = False,
    ) -> None:
        # A planned clip brings its layout; bare bytes have theirs parsed from the moov.
        if isinstance(clip, Clip):
            self._clip, layout = clip.data, clip.layout
        else:
            self._clip = bytes(clip)
            layout = read_clip_layout(self._clip)
        self.depth: bool | None = None  # set by the first frames_at
        self.origin: ClipOrigin = layout.origin
        self.path = layout.path
        self.timescale = layout.timescale
        self.codec = layout.codec
        self._where = f"clip of {layout.path}"
        if not layout.keyframes[0]:
            raise VideoIndexError(f"{self._where}: the clip does not start with a key frame")
        pts = layout.pts
        self._sample_count = len(layout)
        self._keyframes: list[int] = np.flatnonzero(layout.keyframes).tolist()
        self._is_key: list[bool] = np.asarray(layout.keyframes, dtype=bool).tolist()
        self.reads_ahead = bool(read_ahead) and reads_ahead(layout)
        # Leading pictures of the first key frame (open GOP) reference frames outside the clip.
        order = np.argsort(pts, kind="stable")
        presentable = order[pts[order] >= pts[0]]
        # Per-query lookups run on Python lists and ints: numpy's per-call cost dominates at one
        # query a call.
        self._match_samples: list[int] = presentable.tolist()
        self._match_times: list[float] = (pts[presentable] / self.timescale).tolist()
        self._pts_list: list[int] = pts.tolist()
        self._packet_fields: list[tuple[int, int, int, int]] = list(
            zip(layout.offsets.tolist(), layout.sizes.tolist(), self._pts_list, layout.dts.tolist(), strict=True)
        )
        self._charge_of_kind: tuple[tuple[int, int, str], int] | None = None
        self._time_base = Fraction(1, self.timescale)
        self._codec_name = decoder_name(layout.codec)
        self._extradata = layout.codec_config
        keys = self._keyframes
        self._detects_errors = layout.codec != "h264" or h264_keys_are_idr(
            self._clip, layout.offsets[keys].tolist(), layout.sizes[keys].tolist(), bytes(layout.codec_config)
        )
        # Pooled contexts are shared only with decoders of the same options.
        self._pool_name = self._codec_name + ("" if self._detects_errors else "/conceal")
        self._frame_cache_size = max(1, frame_cache_size)
        self._ahead = 0
        self._asked_once = bool(asked_once)
        self._budget = frame_budget if frame_budget is not None else DecodedFrameBudget(None)
        self._owner = self._budget.register()
        weakref.finalize(self, self._budget.forget, self._owner)
        self._clean_cuts: list[bool] = (_clean_cuts(pts) & np.append(layout.keyframes, False)).tolist()
        self._lock = threading.Lock()
        self._context_pool = context_pool
        self._to_rgb: RgbConverter | None = None  # made on first use, unless the pool's are used
        self._context: VideoCodecContext | None = None
        self._next_sample = 0
        self._valid_from_pts = 0
        self._last_output_pts: int | None = None
        self._drained = False
        self.samples_decoded = 0
        self.restarts = 0
        self.drains = 0

    @classmethod
    def from_plan(
        cls,
        plan: ClipPlan,
        chunks: Sequence[bytes | bytearray | memoryview],
        *,
        frame_cache_size: int = DEFAULT_FRAME_CACHE_SIZE,
        frame_budget: DecodedFrameBudget | None = None,
        context_pool: CodecContextPool | None = None,
        read_ahead: bool = False,
    ) -> ClipDecoder:
        """A decoder for the clip of ``plan`` built from its fetched ``chunks`` (its layout from the plan)."""
        clip = Clip(materialize_clip(plan, chunks), plan.layout)
        return cls(
            clip, frame_cache_size=frame_cache_size, frame_budget=frame_budget, context_pool=context_pool, read_ahead=read_ahead
        )

    # -- what the clip holds -------------------------------------------------------------
    @property
    def timestamps_s(self) -> np.ndarray:
        """Source timestamps (seconds, ascending) of every frame the clip can produce."""
        return np.array(self._match_times)

    @property
    def needed_span_s(self) -> tuple[float, float]:
        """Source timestamps of the first and last frame of the span the clip was planned for."""
        return self.origin.first_needed_pts / self.timescale, self.origin.last_needed_pts / self.timescale

    # -- decoding ------------------------------------------------------------------------
    def frames_at(
        self,
        timestamps_s: Sequence[float],
        tolerance_s: float = 1e-4,
        return_uint8: bool = True,
        *,
        depth: bool = False,
        out: np.ndarray | None = None,
    ) -> torch.Tensor:
        """Frames nearest to ``timestamps_s`` (source timeline), ``(T, C, H, W)``.

        uint8 RGB, or float32 in [0, 1] (uint8 / 255) when ``return_uint8`` is False; with
        ``depth`` (a depth camera) uint16 codes ``(T, 1, H, W)`` whatever ``return_uint8``.
        ``out``: RGB frames are written into this array (and returned as a tensor sharing it)
        when its shape and dtype are the result's; otherwise a new tensor is returned. Raises
        :class:`~lerobot_nodes.errors.FrameTimestampError` (LeRobot's message) when a query has
        no frame within ``tolerance_s``, :class:`VideoDecodeError` when the codec fails.
        """
        with self._lock:
            frames = self._frames_for(timestamps_s, tolerance_s, depth)
            if self.depth:
                return codes_to_tensor([depth_codes(frame) for frame in frames])
            return torch.from_numpy(self._rgb_array(frames, return_uint8, out))

    def frames_into(
        self, timestamps_s: Sequence[float], out: np.ndarray, tolerance_s: float = 1e-4, return_uint8: bool = True
    ) -> np.ndarray:
        """:meth:`frames_at` of RGB frames as a numpy array: ``out`` itself when the frames were
        written into it (its shape and dtype are the result's), else a new array. No tensor is
        made: each torch call hands the interpreter lock to another thread and waits to get it back."""
        with self._lock:
            return self._rgb_array(self._frames_for(timestamps_s, tolerance_s, False), return_uint8, out)

    def _frames_for(self, timestamps_s: Sequence[float], tolerance_s: float, depth: bool) -> list[av.VideoFrame]:
        """The decoded frame nearest to each query (the lock held)."""
        queries: list[float] = np.asarray(timestamps_s, dtype=np.float64).reshape(-1).tolist()
        if len(queries) == 0:
            raise ValueError(f"{self._where}: no timestamps to decode")
        if self.depth is None:
            self.depth = depth
        elif self.depth != depth:
            raise ValueError(f"{self._where}: a ClipDecoder decodes either RGB or depth frames, not both")
        pts_of = self._pts_list
        samples = self._match(queries, tolerance_s)
        wanted = {pts_of[sample] for sample in samples}
        found: dict[int, av.VideoFrame] = {}
        for sample in sorted(set(samples), key=pts_of.__getitem__):
            pts = pts_of[sample]
            if pts in found:
                continue
            cached = self._budget.get(self._owner, pts, touch=not self._ahead)
            if cached is not None:
                found[pts] = cached
                continue
            self._decode_until(sample, wanted, found)
        if self.reads_ahead:
            self._read_ahead()
        if self._asked_once:
            for pts in wanted:
                self._budget.discard(self._owner, pts)
        return [found[pts_of[sample]] for sample in samples]

    def keep_ahead(self, frames: int) -> None:
        """Keep ``frames`` decoded frames more, for queries that come back below the furthest one (a
        stranded anchor run, ``nodes.pool_sampler.strand_run``, asks for frames its decoder passed on
        the way to a later one). With any, frames are dropped in the order they were decoded instead of
        least recently used: a frame delivered is not asked for again, one passed waits for its turn."""
        with self._lock:
            extra = max(0, int(frames)) - self._ahead
            self._frame_cache_size += extra
            self._ahead += extra

    def _read_ahead(self) -> None:
        """Decode the rest of the current GOP into the cache (``reads_ahead``: a short GOP without
        reordering), so a later query in it finds its frame kept instead of this decoder's state:
        one decoder then serves every open anchor run of its clip (a run's next frame, asked after
        the other runs', is the one read ahead) at one decoded frame per frame delivered."""
        if self._context is None or self._drained:
            return
        unwanted: set[int] = set()
        last = self.origin.last_needed_pts  # frames past the planned span are never asked for
        while (
            self._next_sample < self._sample_count
            and not self._is_key[self._next_sample]
            and self._pts_list[self._next_sample] <= last
        ):
            frames = self._send(self._next_sample)
            self._next_sample += 1
            for frame in frames:
                self._accept(frame, unwanted, {})

    def _rgb_array(self, frames: list[av.VideoFrame], return_uint8: bool, out: np.ndarray | None) -> np.ndarray:
        """RGB ``(T, 3, H, W)`` of ``frames``: uint8, or float32 ``uint8 / 255``; into ``out`` when it
        has that shape and dtype (a sample's place in its batch), else into a new array.

        Each frame is converted straight into its place (one copy; the cache keeps the decoded
        frame, not an RGB copy of it); a frame repeated in the query is copied from its first place.
        The division runs in numpy on the calling thread: torch's intra-op threads would compete
        with other decode threads for the same cores. The values equal ``torch_uint8.float() / 255``
        bit for bit (both divide correctly rounded in float32).
        """
        dtype = np.uint8 if return_uint8 else np.float32
        shape = (len(frames), 3, frames[0].height, frames[0].width)
        if out is None or out.shape != shape or out.dtype != dtype:
            out = np.empty(shape, dtype=dtype)
        first_place: dict[int, int] = {}
        to_rgb: RgbConverter
        if self._context_pool is not None:
            to_rgb = self._context_pool.converter()
        elif self._to_rgb is not None:
            to_rgb = self._to_rgb
        else:
            to_rgb = self._to_rgb = RgbConverter()
        for position, frame in enumerate(frames):
            earlier = first_place.setdefault(id(frame), position)
            if earlier != position:
                out[position] = out[earlier]
            elif return_uint8:
                to_rgb(frame, out[position])
            else:
                np.divide(to_rgb(frame), np.float32(255), out=out[position], dtype=np.float32)
        return out

    def continues_to(self, timestamp_s: float) -> int | None:
        """Packets this decoder would send to return the frame nearest ``timestamp_s`` without a seek
        (0: the frame is kept), or None when it would restart at a key frame.

        For a cache of several decoders of one clip (each open anchor run decoded forward by its
        own): the one that continues cheapest is used. Only a cost; results never depend on it.
        """
        with self._lock:
            times = self._match_times
            right = min(bisect_left(times, timestamp_s), len(times) - 1)
            left = max(right - 1, 0)
            nearest = left if abs(timestamp_s - times[left]) <= abs(times[right] - timestamp_s) else right
            sample = self._match_samples[nearest]
            pts = self._pts_list[sample]
            if self._budget.holds(self._owner, pts):
                return 0
            if self._context is None:
                return None
            key = self._start_key(sample, pts)
            resumable = (
                key <= self._next_sample
                and pts >= self._valid_from_pts
                and (self._last_output_pts is None or pts > self._last_output_pts)
            )
            return max(0, sample - self._next_sample + 1) if resumable else None

    def close(self) -> None:
        """Release the codec context and cached frames (the decoder can still be used after); the
        context goes back to the ``context_pool`` when there is one."""
        with self._lock:
            context, self._context = self._context, None
            pool = self._context_pool
            if context is not None and pool is not None:
                pool.give(self._pool_name, self._extradata, context)
            self._budget.release(self._owner)

    def __enter__(self) -> ClipDecoder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _match(self, queries: list[float], tolerance_s: float) -> list[int]:
        """The sample (decode index) presented nearest to each query; ties go to the earlier frame.

        A Python loop over ``bisect``: a query costs about a microsecond, where numpy's per-call
        overhead on these tiny arrays (one to a few queries per call) was tens of microseconds.
        """
        times = self._match_times
        last = len(times) - 1
        nearest = []
        for query in queries:
            right = min(bisect_left(times, query), last)
            left = max(right - 1, 0)
            nearest.append(left if abs(query - times[left]) <= abs(times[right] - query) else right)
        distances = [abs(times[i] - query) for i, query in zip(nearest, queries, strict=True)]
        if not all(distance <= tolerance_s for distance in distances):
            raise tolerance_error(
                queries, [times[i] for i in nearest], np.array(distances), tolerance_s, self._where
            )
        samples = self._match_samples
        return [samples[i] for i in nearest]

    def _start_key(self, sample: int, pts: int) -> int:
        """The last key frame at or before ``sample`` whose pts is not after ``pts``."""
        keys, pts_of = self._keyframes, self._pts_list
        position = bisect_right(keys, sample) - 1
        while position > 0 and pts_of[keys[position]] > pts:
            position -= 1
        return keys[max(position, 0)]

    def _decode_until(self, sample: int, wanted: set[int], found: dict[int, av.VideoFrame]) -> None:
        """Decode until the frame of ``sample`` is output, collecting every wanted frame on the way."""
        pts = self._pts_list[sample]
        key = self._start_key(sample, pts)
        resumable = (
            self._context is not None
            and key <= self._next_sample
            and pts >= self._valid_from_pts
            and (self._last_output_pts is None or pts > self._last_output_pts)
        )
        if not resumable:
            self._restart(key)
        # Each step sends one packet, drains or restarts: on any clip that would be fewer than
        # three passes over it. More means corrupt samples keep the frame from coming: stop.
        steps_left = 3 * (self._sample_count + 2)
        while pts not in found:
            steps_left -= 1
            if steps_left < 0:
                raise self._no_frame_error(pts)
            if self._drained and self._next_sample < self._sample_count:
                # Drained at a clean cut: everything presented before it was output.
                cut = self._next_sample
                if sample < cut:
                    # ... this frame too, unless the codec dropped it: decoding it again from
                    # its key frame would only drain at this cut again (corrupt samples).
                    raise self._no_frame_error(pts)
                # The frame is at or after the cut: decoding goes on from there, nothing lost.
                if key <= cut and pts >= self._pts_list[cut]:
                    self._restart(cut, seek=False)  # not a seek: decoding goes on where it stopped
                else:
                    self._restart(key)
                continue
            if self._next_sample < self._sample_count:
                if self._clean_cuts[self._next_sample] and sample < self._next_sample:
                    frames = self._send(None)
                    self._drained = True
                    self.drains += 1
                else:
                    frames = self._send(self._next_sample)
                    self._next_sample += 1
            elif not self._drained:
                frames = self._send(None)
                self._drained = True
            else:
                raise self._no_frame_error(pts)
            for frame in frames:
                self._accept(frame, wanted, found)

    def _no_frame_error(self, pts: int) -> VideoDecodeError:
        return VideoDecodeError(
            f"{self._where}: the decoder produced no frame at pts {pts} "
            f"({pts / self.timescale:.6f} s); the clip's samples are corrupt or incomplete"
        )

    def _restart(self, key: int, seek: bool = True) -> None:
        if self._context is None:
            pool = self._context_pool
            reused = pool.take(self._pool_name, self._extradata) if pool is not None else None
            if reused is not None:
                self._context = reused  # flushed when given back
            else:
                context = cast(VideoCodecContext, av.CodecContext.create(self._codec_name, "r"))
                context.extradata = self._extradata
                context.thread_count = 1
                if self._detects_errors:
                    context.options = dict(ERROR_DETECTION)
                self._context = context
        else:
            self._context.flush_buffers()
        self.restarts += int(seek)
        self._next_sample = key
        self._valid_from_pts = self._pts_list[key]
        self._last_output_pts = None
        self._drained = False

    def _send(self, sample: int | None) -> list[av.VideoFrame]:
        context = self._context
        assert context is not None
        packet = None
        if sample is not None:
            start, size, pts, dts = self._packet_fields[sample]
            packet = av.Packet(self._clip[start : start + size])
            packet.pts = pts
            packet.dts = dts
            packet.time_base = self._time_base
            self.samples_decoded += 1
        try:
            return list(context.decode(packet))
        except av.FFmpegError as error:
            if sample is None:
                where = "flushing"
            else:
                pts = self._packet_fields[sample][2]
                where = f"sample {sample}, frame at pts {pts} ({pts / self.timescale:.6f} s)"
            raise VideoDecodeError(
                f"{self._where}: decoding failed at {where}: {error}; the video's samples are damaged"
            ) from None

    def _accept(self, frame: av.VideoFrame, wanted: set[int], found: dict[int, av.VideoFrame]) -> None:
        pts = frame.pts
        # Frames before the restart key frame are leading pictures whose references were not decoded.
        if pts is None or pts < self._valid_from_pts:
            return
        self._last_output_pts = pts if self._last_output_pts is None else max(self._last_output_pts, pts)
        # One stream's frames share a size and format: their charge is computed once per kind.
        kind = (frame.width, frame.height, frame.format.name)
        known = self._charge_of_kind
        if known is not None and known[0] == kind:
            charge = known[1]
        else:
            charge = frame_charge(frame)
            self._charge_of_kind = (kind, charge)
        if pts in wanted:
            found[pts] = frame
        self._budget.put(self._owner, pts, frame, charge, self._frame_cache_size)


def _clean_cuts(pts: np.ndarray) -> np.ndarray:
    """``cut[k]`` (``0 < k < len``): every sample before ``k`` (decode order) is presented before
    every sample from ``k`` on. Restarting there after a drain needs ``k`` to be a key frame too.

    Draining the codec before sample ``k`` then outputs every frame presented before it, decoded
    from the same packets as in a full decode (references precede their users in decode order).
    """
    count = len(pts)
    cuts = np.zeros(count + 1, dtype=bool)
    if count:
        before = np.maximum.accumulate(pts)
        after = np.minimum.accumulate(pts[::-1])[::-1]
        # ... and the cut's key frame is presented first among the rest (no leading pictures).
        cuts[1:count] = (before[:-1] < after[1:]) & (pts[1:] == after[1:])
    return cuts


def decode_clip(
    clip: Clip | bytes | bytearray | memoryview,
    timestamps_s: Sequence[float],
    tolerance_s: float = 1e-4,
    return_uint8: bool = True,
    depth: bool = False,
) -> torch.Tensor:
    """Frames of ``clip`` nearest to ``timestamps_s`` (source timeline), ``(T, C, H, W)``.

    A one-shot :class:`ClipDecoder`; see :meth:`ClipDecoder.frames_at`.
    """
    with ClipDecoder(clip) as decoder:
        return decoder.frames_at(timestamps_s, tolerance_s=tolerance_s, return_uint8=return_uint8, depth=depth)
