"""Write ``lerobot-writer-tiny-depth`` with LeRobot's own writer, then its goldens with LeRobot's reader.

Run with a Python that has LeRobot 0.6.1 (not this package's venv)::

    /path/to/lerobot-venv/bin/python tests/data/make_lerobot_depth_fixture.py

It (re)writes ``tests/data/lerobot-writer-tiny-depth/`` and ``tests/data/lerobot-writer-tiny-depth-golden/``.
Nothing of ``lerobot_nodes`` is imported: the dataset is what ``LeRobotDataset.create`` /
``add_frame`` / ``save_episode`` / ``finalize`` wrote, and the goldens are what LeRobot's map-style
``LeRobotDataset`` (``video_backend="pyav"``) returned for it.

The dataset: 30 fps, 3 episodes of 10, 12 and 9 frames, 48x64 pixels, one RGB camera
(``observation.images.rgb``: LeRobot's default RGB encoder, SVT-AV1 ``g=2`` ``crf=30``) and one depth
camera (``observation.images.depth``: shape ``(H, W, 1)``, which LeRobot flags ``is_depth_map``, and
LeRobot's default depth encoder: HEVC via libx265 ``lossless=1``, ``gray12le``, depth quantised to 12
bits on a log scale between 0.01 m and 10 m with shift 3.5 m). The depth frames are ``uint16``
millimetres (what a RealSense gives), so LeRobot records ``depth_unit: "mm"``. All episodes share one
data file and one MP4 per camera, so episodes 1 and 2 start inside their MP4.

Goldens (the same layout as the other ``*-golden`` folders, see ``tests/data/README.md``): the
first, second, middle and last frame of every episode (12 indices) under configurations ``none`` (no ``delta_timestamps``), ``diffusion``
(state and both cameras at ``[-1/fps, 0]``, action at ``-1..4 / fps``; padded at episode edges) and
``none_m`` (as ``none`` with ``depth_output_unit="m"``); all with ``return_uint8=True``. Plus
``dequantize.npz``: LeRobot's ``dequantize_depth`` of every code under three quantisers (linear
and logarithmic, non-default bounds) in both units, for the paths the dataset does not cover. Depth comes back as float32 ``(1, H, W)``
(``(T, 1, H, W)`` for several timestamps), in millimetres (rounded) or metres.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import lerobot
import numpy as np
import torch
from lerobot.datasets.depth_utils import dequantize_depth
from lerobot.datasets.lerobot_dataset import LeRobotDataset

HERE = Path(__file__).resolve().parent
NAME = "lerobot-writer-tiny-depth"
ROOT = HERE / NAME
GOLDEN = HERE / f"{NAME}-golden"
FPS = 30
HEIGHT, WIDTH = 48, 64
LENGTHS = [10, 12, 9]
TASKS = ["reach the cube", "push the cube left"]
RGB = "observation.images.rgb"
DEPTH = "observation.images.depth"

FEATURES = {
    "observation.state": {"dtype": "float32", "shape": (6,), "names": [f"j{i}" for i in range(6)]},
    "action": {"dtype": "float32", "shape": (6,), "names": [f"j{i}" for i in range(6)]},
    RGB: {"dtype": "video", "shape": (HEIGHT, WIDTH, 3), "names": ["height", "width", "channels"]},
    DEPTH: {
        "dtype": "video",
        "shape": (HEIGHT, WIDTH, 1),
        "names": ["height", "width", "channels"],
        "info": {"is_depth_map": True},
    },
}


def rgb_frame(episode: int, frame: int) -> np.ndarray:
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    image = np.stack(
        [(x * 4 + frame * 9) % 256, (y * 5 + episode * 60) % 256, ((x + y) * 2 + frame * 3) % 256], axis=-1
    )
    cx, cy = 8 + 4 * frame, 12 + 10 * episode
    image[(x - cx) ** 2 + (y - cy) ** 2 < 36] = (250, 30, 30)
    return image.astype(np.uint8)


def depth_frame(episode: int, frame: int, rng: np.random.Generator) -> np.ndarray:
    """uint16 millimetres: a tilted floor (400..4400 mm), a moving box, sensor noise, a few holes (0)."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    depth = 400.0 + 4000.0 * y / (HEIGHT - 1) + 300.0 * np.sin(x / 7.0 + frame / 3.0)
    box = (np.abs(x - (10 + 4 * frame)) < 6) & (np.abs(y - (20 + 5 * episode)) < 8)
    depth[box] = 250.0 + 30.0 * episode
    depth += rng.normal(0.0, 3.0, depth.shape)
    depth[rng.random(depth.shape) < 0.01] = 0.0  # missing returns
    return np.clip(np.rint(depth), 0, 65535).astype(np.uint16)[..., None]


def write_dataset() -> None:
    if ROOT.exists():
        shutil.rmtree(ROOT)
    rng = np.random.default_rng(12)
    dataset = LeRobotDataset.create(
        repo_id=f"local/{NAME}", fps=FPS, features=FEATURES, root=ROOT, robot_type="synthetic_depth_arm"
    )
    for episode, length in enumerate(LENGTHS):
        for frame in range(length):
            t = frame / length
            state = np.array([np.sin(t + k + episode) for k in range(6)], dtype=np.float32)
            dataset.add_frame(
                {
                    "observation.state": state,
                    "action": state + np.float32(0.05),
                    RGB: rgb_frame(episode, frame),
                    DEPTH: depth_frame(episode, frame, rng),
                    "task": TASKS[episode % len(TASKS)],
                }
            )
        dataset.save_episode()
    dataset.finalize()


CONFIGS = {
    "none": {"delta_timestamps": None, "return_uint8": True, "depth_output_unit": "mm"},
    "none_m": {"delta_timestamps": None, "return_uint8": True, "depth_output_unit": "m"},
    "diffusion": {
        "delta_timestamps": {
            "observation.state": [-1 / FPS, 0.0],
            RGB: [-1 / FPS, 0.0],
            DEPTH: [-1 / FPS, 0.0],
            "action": [i / FPS for i in range(-1, 5)],
        },
        "return_uint8": True,
        "depth_output_unit": "mm",
    },
}


def write_goldens() -> None:
    if GOLDEN.exists():
        shutil.rmtree(GOLDEN)
    GOLDEN.mkdir()
    # First, second, middle and last frame of every episode.
    starts = np.cumsum([0, *LENGTHS[:-1]])
    indices = [int(s + f) for s, n in zip(starts, LENGTHS, strict=True) for f in (0, 1, n // 2, n - 1)]
    manifest: dict = {
        "format_version": 1,
        "producer": {
            "library": "lerobot",
            "class": "lerobot.datasets.lerobot_dataset.LeRobotDataset (map-style)",
            "video_backend": "pyav",
            "tolerance_s": 1e-4,
            "image_transforms": None,
            "script": "tests/data/make_lerobot_depth_fixture.py",
            "versions": {
                "python": sys.version.split()[0],
                "lerobot": lerobot.__version__,
                "torch": torch.__version__,
                "numpy": np.__version__,
                "av": __import__("av").__version__,
            },
        },
        "indices": indices,
        "configs": {},
    }
    for name, config in CONFIGS.items():
        dataset = LeRobotDataset(
            repo_id=f"local/{NAME}",
            root=ROOT,
            delta_timestamps=config["delta_timestamps"],
            video_backend="pyav",
            return_uint8=config["return_uint8"],
            depth_output_unit=config["depth_output_unit"],
        )
        arrays: dict[str, np.ndarray] = {}
        samples: dict[str, dict] = {}
        for index in indices:
            sample = dataset[index]
            entries: dict[str, dict] = {}
            for key, value in sample.items():
                if isinstance(value, torch.Tensor):
                    array = value.numpy()
                    arrays[f"{index}/{key}"] = array
                    entries[key] = {"kind": "tensor", "dtype": str(array.dtype), "shape": list(array.shape)}
                else:
                    entries[key] = {"kind": type(value).__name__, "value": value}
            samples[str(index)] = entries
        npz = GOLDEN / f"{name}.npz"
        np.savez_compressed(npz, **arrays)
        manifest["configs"][name] = {
            "delta_timestamps": config["delta_timestamps"],
            "return_uint8": config["return_uint8"],
            "depth_output_unit": config["depth_output_unit"],
            "npz_file": npz.name,
            "npz_sha256": hashlib.sha256(npz.read_bytes()).hexdigest(),
            "samples": samples,
        }
    manifest["dequantize"] = write_dequantize_golden()
    (GOLDEN / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


# dequantize.npz: LeRobot's ``dequantize_depth`` of every 12-bit code (``(2, 1, 32, 64)``, codes
# 0..4095 then 4095..0) under non-default quantisers, linear and logarithmic, in mm and m.
DEQUANTIZE = {
    "log_default": {"depth_min": 0.01, "depth_max": 10.0, "shift": 3.5, "use_log": True},
    "log_custom": {"depth_min": 0.2, "depth_max": 6.0, "shift": 0.5, "use_log": True},
    "linear": {"depth_min": 0.1, "depth_max": 4.0, "shift": 3.5, "use_log": False},
}


def write_dequantize_golden() -> dict:
    codes = np.arange(4096, dtype=np.uint16).reshape(1, 1, 64, 64)
    codes = np.concatenate([codes, codes[:, :, ::-1, ::-1]]).reshape(2, 1, 64, 64)
    arrays = {"codes": codes}
    for name, params in DEQUANTIZE.items():
        for unit in ("mm", "m"):
            out = dequantize_depth(torch.from_numpy(codes.copy()), **params, output_unit=unit)
            arrays[f"{name}/{unit}"] = out.numpy()
    npz = GOLDEN / "dequantize.npz"
    np.savez_compressed(npz, **arrays)
    return {"npz_file": npz.name, "quantizers": DEQUANTIZE, "npz_sha256": hashlib.sha256(npz.read_bytes()).hexdigest()}


if __name__ == "__main__":
    write_dataset()
    write_goldens()
    print(f"wrote {ROOT} and {GOLDEN}")
