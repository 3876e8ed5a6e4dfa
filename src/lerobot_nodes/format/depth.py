"""Depth cameras, read back exactly as LeRobot 0.6.1 reads them.

How LeRobot stores a depth camera (a feature whose ``info`` has ``is_depth_map: true``, which
its writer sets for a ``(H, W, 1)`` camera): each depth map (``uint16`` millimetres or float
metres, recorded once as ``info["depth_unit"]``) is quantised to 12-bit codes,
``rint(norm * 4095)`` clipped to ``[0, 4095]``, where ``norm`` is
``(log(d + shift) - log(depth_min + shift)) / (log(depth_max + shift) - log(depth_min + shift))``
(``use_log``, the default) or ``(d - depth_min) / (depth_max - depth_min)``; the codes are
encoded as ``gray12le`` video (default HEVC via libx265 ``lossless=1``). ``depth_min``,
``depth_max``, ``shift`` (metres) and ``use_log`` are kept in the feature's ``info`` as
``video.depth_min`` ... (defaults 0.01, 10.0, 3.5, true).

How LeRobot reads it (``dataset_reader._query_videos``, PyAV backend whatever ``video_backend``
says): frames are converted with ``to_ndarray(format="gray12le")`` (``(T, 1, H, W)`` ``uint16``
codes, never RGB, whatever ``return_uint8``), then ``dequantize_depth`` runs on the torch tensor:
float32 ``codes * scale + offset``, ``exp() - shift`` when logarithmic, clamped to
``[depth_min, depth_max]`` metres; for ``depth_output_unit="mm"`` (the default) then
``* 1000``, rounded and clamped to ``[0, 65535]``, still float32. Image transforms skip depth
cameras. :func:`dequantize` repeats those torch operations one for one, so the values are the
same bits as LeRobot's (on the same torch build).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
import torch

from ..errors import ConfigError, MetadataError

DEPTH_QMAX = 4095
"""Largest 12-bit code (LeRobot's ``DEPTH_QMAX``)."""
DEPTH_UNITS = ("mm", "m")
DEFAULT_DEPTH_UNIT = "mm"
"""LeRobot's default ``depth_output_unit``."""
MM_PER_METRE = 1000.0
_UINT16_MAX = 65535
DEPTH_PIX_FMT = "gray12le"


@dataclass(frozen=True)
class DepthQuantization:
    """The quantiser of one depth camera, as LeRobot's ``DepthEncoderConfig`` reads it from ``info``."""

    depth_min: float = 0.01
    depth_max: float = 10.0
    shift: float = 3.5
    use_log: bool = True

    @classmethod
    def from_feature(cls, key: str, feature: Mapping[str, Any]) -> DepthQuantization:
        info = feature.get("info") or {}
        values: dict[str, Any] = {}
        for name in ("depth_min", "depth_max", "shift", "use_log"):
            value = info.get(f"video.{name}")
            if value is not None:
                values[name] = value
        try:
            quantization = cls(
                depth_min=float(values.get("depth_min", cls.depth_min)),
                depth_max=float(values.get("depth_max", cls.depth_max)),
                shift=float(values.get("shift", cls.shift)),
                use_log=bool(values.get("use_log", cls.use_log)),
            )
        except (TypeError, ValueError):
            raise MetadataError(f"depth camera {key}: unreadable quantisation in info.json: {values}") from None
        if quantization.use_log and quantization.depth_min + quantization.shift <= 0:
            raise MetadataError(
                f"depth camera {key}: depth_min + shift must be positive for logarithmic quantisation, got "
                f"depth_min={quantization.depth_min} + shift={quantization.shift}"
            )
        return quantization


def check_depth_unit(unit: str) -> str:
    if unit not in DEPTH_UNITS:
        raise ConfigError(f"depth_output_unit must be 'mm' or 'm', got {unit!r}")
    return unit


def depth_codes(frame: av.VideoFrame) -> np.ndarray:
    """The 12-bit codes of a decoded depth frame, ``(H, W)`` ``uint16``: LeRobot's call."""
    return frame.to_ndarray(format=DEPTH_PIX_FMT)


def codes_to_tensor(arrays: list[np.ndarray]) -> torch.Tensor:
    """Stack ``(H, W)`` codes into LeRobot's ``(T, 1, H, W)`` ``uint16`` tensor."""
    return torch.from_numpy(np.stack(arrays)[:, None])


def dequantize(codes: torch.Tensor, quantization: DepthQuantization, unit: str = DEFAULT_DEPTH_UNIT) -> torch.Tensor:
    """LeRobot's ``dequantize_depth`` (torch path) of ``(..., 1, H, W)`` codes: float32 ``unit``s."""
    q = quantization
    if q.use_log:
        log_min = math.log(q.depth_min + q.shift)
        log_max = math.log(q.depth_max + q.shift)
        scale = (log_max - log_min) / DEPTH_QMAX
        offset = log_min
    else:
        scale = (q.depth_max - q.depth_min) / DEPTH_QMAX
        offset = q.depth_min
    if codes.ndim >= 3:
        codes = codes.squeeze(-3) if codes.shape[-3] == 1 else codes.squeeze(-1)
    buf = codes.to(dtype=torch.float32, copy=True)
    buf.mul_(scale).add_(offset)
    if q.use_log:
        buf.exp_().sub_(q.shift)
    buf.clamp_(q.depth_min, q.depth_max)
    buf.unsqueeze_(-3)
    if unit == "m":
        return buf
    buf.mul_(MM_PER_METRE).round_().clamp_(0.0, _UINT16_MAX)
    return buf
