"""MapStyleLeRobotDataset returns exactly what LeRobot 0.6.1's map-style dataset returned."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lerobot_nodes import MapStyleLeRobotDataset

CONFIGS = ["none", "act", "diffusion"]
GOLDEN_INDICES = 20  # first, second, middle, second-to-last and last frame of 4 episodes


@pytest.mark.parametrize("config", CONFIGS)
def test_every_golden_sample_is_reproduced(config, lerobot_written):
    manifest = json.loads((lerobot_written.golden / "manifest.json").read_text())
    spec = manifest["configs"][config]
    dataset = MapStyleLeRobotDataset(
        root=lerobot_written.root, delta_timestamps=spec["delta_timestamps"] or None, return_uint8=True
    )
    golden = np.load(lerobot_written.golden / spec["npz_file"])
    assert len(manifest["indices"]) == GOLDEN_INDICES
    compared = set()
    for index in manifest["indices"]:
        sample = dataset[index]
        expected = spec["samples"][str(index)]
        assert list(sample) == list(expected), f"key order differs at index {index}"
        for key, value in sample.items():
            if expected[key]["kind"] != "tensor":
                assert value == expected[key]["value"], (index, key)
                continue
            reference = golden[f"{index}/{key}"]
            compared.add(f"{index}/{key}")
            assert isinstance(value, torch.Tensor)
            assert value.numpy().dtype == reference.dtype, (index, key)
            assert tuple(value.shape) == reference.shape, (index, key)
            assert np.array_equal(value.numpy(), reference), (index, key)
    assert compared == set(golden.files), "every golden array is compared"


def test_float_frames_are_uint8_divided_by_255(lerobot_written):
    as_uint8 = MapStyleLeRobotDataset(root=lerobot_written.root, return_uint8=True)[100]
    as_float = MapStyleLeRobotDataset(root=lerobot_written.root)[100]
    key = "observation.images.top"
    assert as_float[key].dtype == torch.float32
    assert torch.equal(as_float[key], as_uint8[key].float() / 255)


def test_episode_subset_indexes_selected_frames(lerobot_written):
    dataset = MapStyleLeRobotDataset(root=lerobot_written.root, episodes=[3, 1], return_uint8=True)
    lengths = dataset.meta.episodes.length
    assert len(dataset) == lengths[3] + lengths[1]
    assert int(dataset[0]["episode_index"]) == 3 and int(dataset[0]["frame_index"]) == 0
    last = dataset[len(dataset) - 1]
    assert int(last["episode_index"]) == 1 and int(last["frame_index"]) == lengths[1] - 1
    with pytest.raises(IndexError):
        dataset[len(dataset)]
