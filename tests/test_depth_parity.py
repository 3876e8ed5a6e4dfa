"""Depth cameras: the map-style and streaming readers return what LeRobot 0.6.1 returned.

``tests/data/lerobot-writer-tiny-depth`` was written by LeRobot's own writer (one RGB camera and
one depth camera, HEVC ``gray12le`` 12-bit codes) and its goldens read back by LeRobot's map-style
dataset; ``tests/data/make_lerobot_depth_fixture.py`` made both.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_nodes import MapStyleLeRobotDataset
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.format.depth import DepthQuantization, dequantize

DATA = Path(__file__).resolve().parent / "data"
ROOT = DATA / "lerobot-writer-tiny-depth"
GOLDEN = DATA / "lerobot-writer-tiny-depth-golden"
DEPTH = "observation.images.depth"
RGB = "observation.images.rgb"
MANIFEST = json.loads((GOLDEN / "manifest.json").read_text())
CONFIGS = list(MANIFEST["configs"])


@pytest.fixture(autouse=True)
def private_index_cache(tmp_path, monkeypatch):
    """Sidecar indexes go to a temporary LeRobot home, never the user's cache."""
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lerobot-home"))


def _exp_rounding(quantization: DepthQuantization, unit: str) -> float:
    """How far a float depth in ``unit`` may lie from a golden made on another CPU: logarithmic
    quantisation computes ``exp(...) - shift`` in float32, and the last bit of ``exp`` is the
    CPU's (LeRobot 0.6.1's own ``dequantize_depth`` on an AVX-512 Xeon differs from these goldens,
    made elsewhere, by one ulp of ``exp`` for ~1.5 % of codes, and from this package by none).
    Millimetres are rounded, linear quantisation has no ``exp``: both stay exact."""
    if unit != "m" or not quantization.use_log:
        return 0.0
    return float(np.spacing(np.float32(quantization.depth_max + quantization.shift)))


DEPTH_QUANTIZATION = DepthQuantization.from_feature(
    DEPTH, json.loads((ROOT / "meta" / "info.json").read_text())["features"][DEPTH]
)


def _assert_equal_up_to_exp_rounding(got: np.ndarray, reference: np.ndarray, tolerance: float, where) -> None:
    if tolerance == 0.0:
        assert np.array_equal(got, reference), where
    else:
        assert np.max(np.abs(got.astype(np.float64) - reference.astype(np.float64))) <= tolerance, where


def _assert_is_golden(sample, index, spec, golden):
    expected = spec["samples"][str(index)]
    assert list(sample) == list(expected), f"key order differs at index {index}"
    for key, value in sample.items():
        if expected[key]["kind"] != "tensor":
            assert value == expected[key]["value"], (index, key)
            continue
        reference = golden[f"{index}/{key}"]
        assert isinstance(value, torch.Tensor), (index, key)
        assert value.numpy().dtype == reference.dtype, (index, key)
        assert tuple(value.shape) == reference.shape, (index, key)
        tolerance = _exp_rounding(DEPTH_QUANTIZATION, spec["depth_output_unit"]) if key == DEPTH else 0.0
        _assert_equal_up_to_exp_rounding(value.numpy(), reference, tolerance, (index, key))


@pytest.mark.parametrize("config", CONFIGS)
def test_map_style_reproduces_every_golden_sample(config):
    spec = MANIFEST["configs"][config]
    dataset = MapStyleLeRobotDataset(
        root=ROOT,
        delta_timestamps=spec["delta_timestamps"],
        return_uint8=spec["return_uint8"],
        depth_output_unit=spec["depth_output_unit"],
    )
    golden = np.load(GOLDEN / spec["npz_file"])
    compared = set()
    for index in MANIFEST["indices"]:
        _assert_is_golden(dataset[index], index, spec, golden)
        compared.update(f"{index}/{key}" for key in spec["samples"][str(index)] if f"{index}/{key}" in golden)
    assert compared == set(golden.files), "every golden array is compared"


@pytest.mark.parametrize("config", ["diffusion", "none_m"])
def test_one_streaming_epoch_is_the_goldens_and_the_map_style_samples(config):
    spec = MANIFEST["configs"][config]
    options = {
        "delta_timestamps": spec["delta_timestamps"],
        "return_uint8": spec["return_uint8"],
        "depth_output_unit": spec["depth_output_unit"],
    }
    streaming = StreamingLeRobotDataset(
        root=ROOT,
        seed=3,
        config=StreamingConfig(streaming_episode_pool_size=2, streaming_prefetch_episodes=2),
        **options,
    )
    reference = MapStyleLeRobotDataset(root=ROOT, **options)
    golden = np.load(GOLDEN / spec["npz_file"])
    seen = set()
    try:
        for sample in streaming:
            index = int(sample["index"])
            assert index not in seen
            seen.add(index)
            if str(index) in spec["samples"]:
                _assert_is_golden(sample, index, spec, golden)
            expected = reference[index]
            assert list(sample) == list(expected)
            for key, value in expected.items():
                same = torch.equal(sample[key], value) if isinstance(value, torch.Tensor) else sample[key] == value
                assert same, key
    finally:
        streaming.close()  # its graph's threads must not outlive the test (tests/nodes counts them)
    assert seen == set(range(len(reference)))


def test_depth_is_float_whatever_return_uint8_and_rgb_is_not_depth():
    as_uint8 = MapStyleLeRobotDataset(root=ROOT, return_uint8=True)[11]
    as_float = MapStyleLeRobotDataset(root=ROOT)[11]
    assert as_uint8[DEPTH].dtype == torch.float32 and as_uint8[DEPTH].shape == (1, 48, 64)
    assert torch.equal(as_uint8[DEPTH], as_float[DEPTH])
    assert torch.equal(as_float[RGB], as_uint8[RGB].float() / 255)
    millimetres = as_uint8[DEPTH]
    assert torch.equal(millimetres, millimetres.round()) and millimetres.min() >= 10 and millimetres.max() <= 10000


def test_image_transforms_skip_the_depth_camera():
    dataset = MapStyleLeRobotDataset(root=ROOT, return_uint8=True, image_transforms=lambda frame: frame * 0)
    plain = MapStyleLeRobotDataset(root=ROOT, return_uint8=True)
    assert torch.equal(dataset[3][DEPTH], plain[3][DEPTH])
    assert not dataset[3][RGB].any()


def test_lerobot_dequantisation_of_every_code():
    dequantised = MANIFEST["dequantize"]
    golden = np.load(GOLDEN / dequantised["npz_file"])
    codes = torch.from_numpy(golden["codes"])
    for name, params in dequantised["quantizers"].items():
        for unit in ("mm", "m"):
            got = dequantize(codes, DepthQuantization(**params), unit)
            reference = golden[f"{name}/{unit}"]
            assert got.dtype == torch.float32 and tuple(got.shape) == reference.shape, (name, unit)
            tolerance = _exp_rounding(DepthQuantization(**params), unit)
            _assert_equal_up_to_exp_rounding(got.numpy(), reference, tolerance, (name, unit))


def test_unknown_depth_unit_is_a_config_error():
    with pytest.raises(ConfigError, match="depth_output_unit"):
        MapStyleLeRobotDataset(root=ROOT, depth_output_unit="cm")


@pytest.mark.parametrize("return_uint8", [True, False])
def test_batches_assembled_in_the_reader_are_the_map_style_samples(return_uint8):
    # RGB frames are decoded straight into their batch (uint8, or float32 / 255); the depth
    # camera is dequantised per sample and collated.
    spec = MANIFEST["configs"]["diffusion"]
    options = {"delta_timestamps": spec["delta_timestamps"], "return_uint8": return_uint8}
    streaming = StreamingLeRobotDataset(
        root=ROOT,
        seed=3,
        config=StreamingConfig(streaming_episode_pool_size=2, streaming_prefetch_episodes=2),
        batch_size=5,
        **options,
    )
    reference = MapStyleLeRobotDataset(root=ROOT, **options)
    seen = []
    try:
        for batch in streaming:
            for position, index in enumerate(batch["index"].tolist()):
                seen.append(index)
                expected = reference[index]
                assert list(batch) == list(expected)
                for key, value in expected.items():
                    got = batch[key][position]
                    same = torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value
                    assert same, (key, index)
    finally:
        streaming.close()
    assert sorted(seen) == list(range(len(reference)))
