"""Sample comparison for parity checks (streaming vs. map-style, remote vs. local)."""

from __future__ import annotations

from typing import Any

import torch


def assert_samples_equal(expected: dict[str, Any], actual: dict[str, Any], where: str = "") -> None:
    """Same keys in the same order, equal tensors (dtype and shape included), equal other values."""
    assert list(expected) == list(actual), f"{where}: keys {list(expected)} != {list(actual)}"
    for key, value in expected.items():
        other = actual[key]
        if isinstance(value, torch.Tensor):
            assert isinstance(other, torch.Tensor), f"{where}: {key} is not a tensor"
            assert value.dtype == other.dtype and value.shape == other.shape, f"{where}: {key} dtype/shape"
            assert torch.equal(value, other), f"{where}: {key} differs"
        else:
            assert value == other, f"{where}: {key}: {value!r} != {other!r}"
