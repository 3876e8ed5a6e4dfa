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

from ..errors import FrameTimestampError, MetadataError, VideoIndexError
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
        self._where = f"{source.url}/{path}"
        self._file = open_buffered(source, path)
        try:
            self._container = av.open(self._file, mode="r")
        except av.FFmpegError as exc:
            self._file.close()
            raise VideoIndexError(f"{self._where}: cannot open video: {exc}") from None
        if not self._container.streams.video:
            self.close()
            raise VideoIndexError(f"{self._where}: no video stream")
        self._stream = self._container.streams.video[0]
        self._time_base = self._stream.time_base
        self._checked_spans: set[tuple[float, float]] = set()

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
        try:
            for frame in self._container.decode(self._stream):
                if frame.pts is None:
                    continue
                current = float(frame.pts * self._time_base)
                loaded.append(depth_codes(frame) if depth else frame.to_ndarray(format="rgb24"))
                loaded_ts.append(current)
                if current >= last:
                    break
        except av.FFmpegError as exc:
            raise VideoIndexError(f"{self._where}: decoding failed near {first:.4f} s: {exc}") from None
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
