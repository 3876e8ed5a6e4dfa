"""Decoding frames of a clip by source timestamp, bit-identical to decoding the whole file.

:class:`ClipDecoder` feeds the clip's samples as raw packets to a PyAV codec context (the
decoder FFmpeg itself picks for the stream, ``thread_count=1``, the ``av1C``/``avcC``/``hvcC``
payload as extradata). Packets carry source-timeline pts/dts, so decoded ``frame.pts`` are
source presentation times and frames are matched to queries by pts, never by output position.
RGB conversion is ``frame.to_ndarray(format="rgb24")`` then CHW, as LeRobot's PyAV backend
and :class:`~lerobot_nodes.MapStyleLeRobotDataset` do (with one swscale thread, which gives the
same pixels).

Decoding only does what a query needs: forward queries continue from the decoder's current
state; a query behind it (or far ahead of it) restarts at the last key frame at or before the
target whose pts is not after it. Decoding and conversion release the GIL inside PyAV.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, cast

import av
import numpy as np
import torch
from av.video.codeccontext import VideoCodecContext

from ..errors import VideoDecodeError, VideoIndexError
from ..file_video import tolerance_error
from .clip import ClipOrigin, materialize_clip, read_clip
from .plan import ClipPlan

DEFAULT_FRAME_CACHE_SIZE = 4
"""Decoded frames a :class:`ClipDecoder` keeps for repeated or overlapping queries: enough for
key-frame-aligned anchor pairs with a one-frame history window; each costs a full YUV frame."""


def decoder_name(codec: str) -> str:
    """The FFmpeg decoder ``av.open`` uses for ``codec`` (so both paths decode identically)."""
    if codec == "av1":
        return "libdav1d" if "libdav1d" in av.codecs_available else "libaom-av1"
    if codec in ("h264", "hevc"):
        return codec
    raise VideoIndexError(f"unsupported codec {codec!r}")


class _CachedFrame:
    """A decoded frame, converted to RGB on first use (the decoder buffer is released then)."""

    __slots__ = ("frame", "rgb")

    def __init__(self, frame: av.VideoFrame) -> None:
        self.frame: av.VideoFrame | None = frame
        self.rgb: np.ndarray | None = None

    def to_rgb(self) -> np.ndarray:
        if self.rgb is None:
            assert self.frame is not None
            self.rgb = _frame_to_rgb(self.frame)
            self.frame = None
        return self.rgb


_RGB_OPTIONS: dict[str, Any] = {"threads": 1}


def _frame_to_rgb(frame: av.VideoFrame) -> np.ndarray:
    """``frame`` as an RGB24 array, converted on one swscale thread where PyAV allows choosing.

    One thread gives the same pixels as the default without oversubscribing the cores when several
    decode threads run (auto threading was 6x slower under load). PyAV 15 (what LeRobot 0.6.1 pins)
    has no ``threads`` argument: there the conversion uses its default.
    """
    try:
        return frame.to_ndarray(format="rgb24", **_RGB_OPTIONS)
    except TypeError:
        if not _RGB_OPTIONS:
            raise
        _RGB_OPTIONS.clear()
        return frame.to_ndarray(format="rgb24")


class ClipDecoder:
    """Decode frames of one clip (one episode of one camera) by source timestamp.

    Keeps its codec state between calls: a query at or after the previous one continues
    decoding forward; an earlier one restarts at the key frame at or before it. The last
    ``frame_cache_size`` decoded frames are kept, so overlapping windows decode nothing twice.
    Calls are serialised by an internal lock; use one decoder per thread for parallel decoding.

    Counters: ``samples_decoded`` (packets sent to the codec) and ``restarts`` (seeks).
    """

    def __init__(
        self, clip: bytes | bytearray | memoryview, *, frame_cache_size: int = DEFAULT_FRAME_CACHE_SIZE
    ) -> None:
        self._clip = bytes(clip)
        index, origin = read_clip(self._clip)
        self.origin: ClipOrigin = origin
        self.path = origin.path
        self.timescale = index.timescale
        self.codec = index.codec
        self._where = f"clip of {origin.path}"
        if not index.keyframes[0]:
            raise VideoIndexError(f"{self._where}: the clip does not start with a key frame")
        self._offsets = index.offsets
        self._sizes = index.sizes
        self._pts = index.pts + origin.time_offset
        self._dts = index.dts + origin.time_offset
        self._keyframes = index.keyframe_indices
        # Leading pictures of the first key frame (open GOP) reference frames outside the clip.
        order = index.presentation_order
        presentable = order[self._pts[order] >= self._pts[0]]
        self._match_samples = presentable
        self._match_pts = self._pts[presentable]
        self._time_base = Fraction(1, self.timescale)
        self._codec_name = decoder_name(index.codec)
        self._extradata = index.codec_config
        self._frame_cache_size = max(1, frame_cache_size)
        self._cache: OrderedDict[int, _CachedFrame] = OrderedDict()
        self._lock = threading.Lock()
        self._context: VideoCodecContext | None = None
        self._next_sample = 0
        self._valid_from_pts = 0
        self._last_output_pts: int | None = None
        self._drained = False
        self.samples_decoded = 0
        self.restarts = 0

    @classmethod
    def from_plan(
        cls, plan: ClipPlan, chunks: Sequence[bytes | bytearray | memoryview], **kwargs: int
    ) -> ClipDecoder:
        """A decoder for the clip of ``plan`` built from its fetched ``chunks``."""
        return cls(materialize_clip(plan, chunks), **kwargs)

    # -- what the clip holds -------------------------------------------------------------
    @property
    def timestamps_s(self) -> np.ndarray:
        """Source timestamps (seconds, ascending) of every frame the clip can produce."""
        return self._match_pts / self.timescale

    @property
    def needed_span_s(self) -> tuple[float, float]:
        """Source timestamps of the first and last frame of the span the clip was planned for."""
        return self.origin.first_needed_pts / self.timescale, self.origin.last_needed_pts / self.timescale

    # -- decoding ------------------------------------------------------------------------
    def frames_at(
        self, timestamps_s: Sequence[float], tolerance_s: float = 1e-4, return_uint8: bool = True
    ) -> torch.Tensor:
        """Frames nearest to ``timestamps_s`` (source timeline), ``(T, C, H, W)``.

        uint8 RGB, or float32 in [0, 1] (uint8 / 255) when ``return_uint8`` is False. Raises
        :class:`~lerobot_nodes.errors.FrameTimestampError` (LeRobot's message) when a query has
        no frame within ``tolerance_s``, :class:`VideoDecodeError` when the codec fails.
        """
        queries = np.asarray(timestamps_s, dtype=np.float64).reshape(-1)
        if len(queries) == 0:
            raise ValueError(f"{self._where}: no timestamps to decode")
        with self._lock:
            samples = self._match(queries, tolerance_s)
            wanted = {int(self._pts[sample]) for sample in samples}
            found: dict[int, _CachedFrame] = {}
            for sample in sorted(set(samples.tolist()), key=lambda s: self._pts[s]):
                pts = int(self._pts[sample])
                if pts in found:
                    continue
                cached = self._cache.get(pts)
                if cached is not None:
                    self._cache.move_to_end(pts)
                    found[pts] = cached
                    continue
                self._decode_until(sample, wanted, found)
            arrays = [found[int(self._pts[sample])].to_rgb() for sample in samples]
        return frames_to_tensor(arrays, return_uint8)

    def close(self) -> None:
        """Release the codec context and cached frames (the decoder can still be used after)."""
        with self._lock:
            self._context = None
            self._cache.clear()

    def __enter__(self) -> ClipDecoder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _match(self, queries: np.ndarray, tolerance_s: float) -> np.ndarray:
        """The sample (decode index) presented nearest to each query; ties go to the earlier frame."""
        times = self._match_pts / self.timescale
        right = np.clip(np.searchsorted(times, queries, side="left"), 0, len(times) - 1)
        left = np.clip(right - 1, 0, len(times) - 1)
        take_left = np.abs(queries - times[left]) <= np.abs(times[right] - queries)
        nearest = np.where(take_left, left, right)
        distances = np.abs(times[nearest] - queries)
        if not np.all(distances <= tolerance_s):
            raise tolerance_error(
                queries.tolist(), times[nearest].tolist(), distances, tolerance_s, self._where
            )
        return self._match_samples[nearest]

    def _start_key(self, sample: int, pts: int) -> int:
        """The last key frame at or before ``sample`` whose pts is not after ``pts``."""
        keys = self._keyframes
        position = int(np.searchsorted(keys, sample, side="right")) - 1
        while position > 0 and self._pts[keys[position]] > pts:
            position -= 1
        return int(keys[max(position, 0)])

    def _decode_until(self, sample: int, wanted: set[int], found: dict[int, _CachedFrame]) -> None:
        """Decode until the frame of ``sample`` is output, collecting every wanted frame on the way."""
        pts = int(self._pts[sample])
        key = self._start_key(sample, pts)
        resumable = (
            self._context is not None
            and key <= self._next_sample
            and pts >= self._valid_from_pts
            and (self._last_output_pts is None or pts > self._last_output_pts)
        )
        if not resumable:
            self._restart(key)
        while pts not in found:
            if self._next_sample < len(self._sizes):
                frames = self._send(self._next_sample)
                self._next_sample += 1
            elif not self._drained:
                frames = self._send(None)
                self._drained = True
            else:
                raise VideoDecodeError(
                    f"{self._where}: the decoder produced no frame at pts {pts} "
                    f"({pts / self.timescale:.6f} s); the clip's samples are corrupt or incomplete"
                )
            for frame in frames:
                self._accept(frame, wanted, found)

    def _restart(self, key: int) -> None:
        if self._context is None:
            context = cast(VideoCodecContext, av.CodecContext.create(self._codec_name, "r"))
            context.extradata = self._extradata
            context.thread_count = 1
            self._context = context
        else:
            self._context.flush_buffers()
        self.restarts += 1
        self._next_sample = key
        self._valid_from_pts = int(self._pts[key])
        self._last_output_pts = None
        self._drained = False

    def _send(self, sample: int | None) -> list[av.VideoFrame]:
        context = self._context
        assert context is not None
        packet = None
        if sample is not None:
            start = int(self._offsets[sample])
            packet = av.Packet(self._clip[start : start + int(self._sizes[sample])])
            packet.pts = int(self._pts[sample])
            packet.dts = int(self._dts[sample])
            packet.time_base = self._time_base
            self.samples_decoded += 1
        try:
            return list(context.decode(packet))
        except av.FFmpegError as error:
            where = "flushing" if sample is None else f"sample {sample}"
            raise VideoDecodeError(f"{self._where}: decoding failed at {where}: {error}") from None

    def _accept(self, frame: av.VideoFrame, wanted: set[int], found: dict[int, _CachedFrame]) -> None:
        pts = frame.pts
        # Frames before the restart key frame are leading pictures whose references were not decoded.
        if pts is None or pts < self._valid_from_pts:
            return
        self._last_output_pts = pts if self._last_output_pts is None else max(self._last_output_pts, pts)
        entry = _CachedFrame(frame)
        if pts in wanted:
            entry.to_rgb()
            found[pts] = entry
        self._cache[pts] = entry
        self._cache.move_to_end(pts)
        while len(self._cache) > self._frame_cache_size:
            self._cache.popitem(last=False)


def frames_to_tensor(arrays: list[np.ndarray], return_uint8: bool) -> torch.Tensor:
    """Stack RGB ``(H, W, 3)`` arrays into ``(T, 3, H, W)``: uint8, or float32 ``uint8 / 255``.

    The layout change and division run in numpy on the calling thread: torch's intra-op
    threads would compete with other decode threads for the same cores. The values equal
    ``torch_uint8.float() / 255`` bit for bit (both divide correctly rounded in float32).
    """
    chw = np.ascontiguousarray(np.stack(arrays).transpose(0, 3, 1, 2))
    if return_uint8:
        return torch.from_numpy(chw)
    return torch.from_numpy(np.divide(chw, np.float32(255), dtype=np.float32))


def decode_clip(
    clip: bytes | bytearray | memoryview,
    timestamps_s: Sequence[float],
    tolerance_s: float = 1e-4,
    return_uint8: bool = True,
) -> torch.Tensor:
    """Frames of ``clip`` nearest to ``timestamps_s`` (source timeline), ``(T, C, H, W)``.

    A one-shot :class:`ClipDecoder`; see :meth:`ClipDecoder.frames_at`.
    """
    with ClipDecoder(clip) as decoder:
        return decoder.frames_at(timestamps_s, tolerance_s=tolerance_s, return_uint8=return_uint8)
