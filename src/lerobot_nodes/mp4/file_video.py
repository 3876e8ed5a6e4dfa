"""Decode frames by timestamp from a whole MP4 file, exactly as LeRobot's PyAV backend does.

This is the reference path of :class:`~lerobot_nodes.MapStyleLeRobotDataset`: open the file
(through the byte source), seek to the keyframe before the first query with LeRobot's
one-tick margin, decode forward to the last query and pick the frame nearest each query.
The container stays open between calls so consecutive samples do not reopen the file.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence

import av
import numpy as np
import torch

from ..errors import FrameTimestampError, MetadataError, VideoDecodeError, VideoIndexError
from ..format.depth import codes_to_tensor, depth_codes
from ..sources import ByteSource
from ..sources.source_file import open_buffered


def tolerance_error(
    queries: Sequence[float], loaded: Sequence[float], distances: np.ndarray, tolerance_s: float, where: str
) -> FrameTimestampError:
    """LeRobot's message for frames too far from their query."""
    bad = distances > tolerance_s
    return FrameTimestampError(
        f"One or several query timestamps unexpectedly violate the tolerance ({distances[bad].tolist()} > "
        f"tolerance_s={tolerance_s}). It means that the closest frame that can be loaded from the video is too far "
        f"away in time. This might be due to synchronization issues with timestamps during data collection. "
        f"To be safe, we advise to ignore this item during training.\nqueried timestamps: {list(queries)}\n"
        f"loaded timestamps: {list(loaded)}\nvideo: {where}"
    )


ERROR_DETECTION = {"err_detect": "explode"}
"""Codec options of the decoders (clip and whole file): FFmpeg's decoder fails with an error
where it detects a damaged bitstream instead of concealing it (H.264 otherwise patches the
macroblocks it could not decode from neighbouring frames and returns them without a word).
Frames of undamaged files are unchanged: the flag acts only where the decoder detects an error.
LeRobot's dav1d already fails on AV1 errors it detects. Not set for H.264 whose key frames are
not all IDR (open GOP, see :func:`h264_keys_are_idr`). Damage a decoder cannot detect (bytes
that still parse) stays undetected: MP4 samples carry no checksum."""


def h264_keys_are_idr(data: bytes | memoryview, offsets: Sequence[int], sizes: Sequence[int], config: bytes) -> bool:
    """Whether every H.264 sample at ``offsets``/``sizes`` of ``data`` (key frames, ``avcC``
    ``config``) is an IDR picture: its first slice NAL unit is of type 5.

    A recovery-point I frame (x264's open GOP) is a sync sample too, but pictures after it may
    name earlier pictures in their reference marking: decoding from it, FFmpeg reports that
    ("mmco: unref short failure") on clean files, and ``err_detect=explode`` would fail there.
    """
    if len(config) < 5:
        return False
    length_size = (config[4] & 3) + 1
    view = memoryview(data)
    for offset, size in zip(offsets, sizes, strict=True):
        position, end, idr = int(offset), int(offset) + int(size), False
        while position + length_size < end:
            nal_size = int.from_bytes(view[position : position + length_size], "big")
            nal_type = view[position + length_size] & 0x1F
            if 1 <= nal_type <= 5:
                idr = nal_type == 5
                break
            position += length_size + nal_size
        if not idr:
            return False
    return True


def _reformat_takes_threads() -> bool:
    """Whether ``VideoFrame.to_ndarray`` accepts ``threads`` (PyAV 17 and later; earlier raise TypeError)."""
    try:
        av.VideoFrame(16, 16, "yuv420p").to_ndarray(format="rgb24", threads=1)
    except TypeError:
        return False
    return True


ONE_SWSCALE_THREAD = _reformat_takes_threads()
"""One swscale thread where PyAV lets us choose (17+: its default is one per core, which
oversubscribes the cores when several decode threads convert at once); before 17 PyAV's
conversion takes no ``threads`` and runs in one swscale thread of its own. Same pixels either way."""


def frames_to_tensor(arrays: list[np.ndarray], return_uint8: bool) -> torch.Tensor:
    """Stack RGB ``(H, W, 3)`` arrays into ``(T, 3, H, W)``, uint8 or float32 in [0, 1]."""
    stacked = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
    return stacked if return_uint8 else stacked.to(torch.float32).div_(255)


class FileVideoDecoder:
    """One open MP4 of a byte source; not thread-safe (one per thread or behind a lock)."""

    def __init__(self, source: ByteSource, path: str) -> None:
        self.path = path
        self._source = source
        self._where = f"{source.url}/{path}"
        self._checked_spans: set[tuple[float, float]] = set()
        self._open(detect_errors=True)

    def _open(self, detect_errors: bool) -> None:
        """Open the file; with ``detect_errors``, damage the decoder detects fails decoding
        (:data:`ERROR_DETECTION`) instead of being concealed."""
        self._file = open_buffered(self._source, self.path)
        try:
            self._container = av.open(self._file, mode="r")
        except av.FFmpegError as exc:
            self._file.close()
            raise VideoIndexError(f"{self._where}: cannot open video: {exc}") from None
        if not self._container.streams.video:
            self.close()
            raise VideoIndexError(f"{self._where}: no video stream")
        self._stream = self._container.streams.video[0]
        self._detects_errors = detect_errors
        if detect_errors:
            self._stream.codec_context.options = dict(ERROR_DETECTION)
        self._time_base = self._stream.time_base

    @property
    def end_time(self) -> float | None:
        """End of the stream in seconds (start + duration), when the container says."""
        stream = self._stream
        if stream.duration is not None and stream.time_base is not None:
            return float(((stream.start_time or 0) + stream.duration) * stream.time_base)
        if self._container.duration is not None:
            return self._container.duration / av.time_base
        return None

    def check_span(self, start: float, stop: float, episode: int, key: str, slack_s: float) -> None:
        """Raise if ``[start, stop)`` of ``episode`` reaches past the end of this file."""
        if (start, stop) in self._checked_spans:
            return
        end = self.end_time
        if end is not None and stop > end + slack_s:
            raise MetadataError(
                f"episode {episode}: meta/episodes places its {key} frames at [{start}, {stop}) s of "
                f"{self._where}, but that video ends at {end} s"
            )
        self._checked_spans.add((start, stop))

    def close(self) -> None:
        self._container.close()
        self._file.close()

    def _reports_clean_errors(self, start_key: av.Packet | None) -> bool:
        """Whether decoding from ``start_key`` can report errors on a clean file: an H.264 key frame
        that is not an IDR picture (see :func:`h264_keys_are_idr`)."""
        context = self._stream.codec_context
        if context.name != "h264":
            return False
        config = bytes(context.extradata or b"")
        if start_key is None:
            return True
        data = bytes(start_key)
        return not h264_keys_are_idr(data, [0], [len(data)], config)

    def decode(
        self, timestamps: Sequence[float], tolerance_s: float, return_uint8: bool = True, depth: bool = False
    ) -> torch.Tensor:
        """Frames nearest to ``timestamps`` (seconds on the file's timeline), ``(T, C, H, W)``.

        With ``depth``, the 12-bit codes of a depth camera, ``(T, 1, H, W)`` uint16 (see
        :mod:`lerobot_nodes.format.depth`); ``return_uint8`` does not apply to them.
        """
        first, last = min(timestamps), max(timestamps)
        assert self._time_base is not None
        self._container.seek(round(first / self._time_base) - 1, backward=True, any_frame=False, stream=self._stream)
        loaded: list[np.ndarray] = []
        loaded_ts: list[float] = []
        start_key: av.Packet | None = None
        try:
            # What container.decode(stream) does (demux, decode each packet, the flush packet
            # last), with the key frame decoding starts from at hand.
            for packet in self._container.demux(self._stream):
                if start_key is None:
                    start_key = packet
                for frame in packet.decode():
                    if frame.pts is None:
                        continue
                    current = float(frame.pts * self._time_base)
                    loaded.append(depth_codes(frame) if depth else frame.to_ndarray(format="rgb24"))
                    loaded_ts.append(current)
                    if current >= last:
                        break
                else:
                    continue
                break
        except av.FFmpegError as exc:
            if self._detects_errors and self._reports_clean_errors(start_key):
                # Open-GOP H.264 from a recovery-point key frame: FFmpeg reports errors of clean
                # files there; this file is decoded as LeRobot does, concealing, from now on.
                self.close()
                self._open(detect_errors=False)
                return self.decode(timestamps, tolerance_s, return_uint8, depth)
            after = f", after the frame at {loaded_ts[-1]:.6f} s" if loaded_ts else ""
            raise VideoDecodeError(
                f"{self._where}: decoding failed reading frames for [{first:.6f}, {last:.6f}] s{after}: {exc}; "
                "the video's samples are damaged"
            ) from None
        if not loaded:
            raise FrameTimestampError(f"No frames could be decoded from {self._where} in [{first}, {last}] s")
        query = np.asarray(timestamps, dtype=np.float64)
        times = np.asarray(loaded_ts, dtype=np.float64)
        distance = np.abs(query[:, None] - times[None, :])
        nearest = distance.argmin(axis=1)
        best = distance[np.arange(len(query)), nearest]
        if not np.all(best <= tolerance_s):
            raise tolerance_error(timestamps, loaded_ts, best, tolerance_s, self._where)
        picked = [loaded[i] for i in nearest]
        return codes_to_tensor(picked) if depth else frames_to_tensor(picked, return_uint8)


class FileVideoDecoderCache:
    """A small LRU of open :class:`FileVideoDecoder` per thread of each process.

    Decoders inherited through ``fork`` are kept referenced but never used or closed in the
    child: closing an FFmpeg decoder whose threads lived in the parent crashes the child.
    """

    def __init__(self, source: ByteSource, capacity: int = 8) -> None:
        self.source = source
        self.capacity = capacity
        self._caches: dict[tuple[int, int], OrderedDict[str, FileVideoDecoder]] = {}
        self._lock = threading.Lock()

    def get(self, path: str) -> FileVideoDecoder:
        key = (os.getpid(), threading.get_ident())
        with self._lock:
            cache = self._caches.setdefault(key, OrderedDict())
        decoder = cache.get(path)
        if decoder is None:
            decoder = cache[path] = FileVideoDecoder(self.source, path)
            while len(cache) > self.capacity:
                cache.popitem(last=False)[1].close()
        cache.move_to_end(path)
        return decoder

    def __getstate__(self) -> dict:
        return {"source": self.source, "capacity": self.capacity}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["source"], state["capacity"])  # type: ignore[misc]
