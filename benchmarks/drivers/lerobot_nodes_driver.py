"""Driver A: this project's loader, run under the project's venv (``/work/venv``).

The adapter has two implementations; ``IMPLEMENTATION`` picks one:

* ``"streaming"``: ``lerobot_nodes.StreamingLeRobotDataset`` + ``streaming_dataloader`` (a
  ``StatefulDataLoader``), configured as ``lerobot-nodes train --dataset.streaming=true`` builds
  it (``max_num_shards`` from ``num_workers``, ``seed``, ``return_uint8=True``, default
  ``StreamingConfig``; batches assembled in the workers; workers from the package's
  forkserver, ``--mp-context`` applies to the other loaders only);
* ``"map_style_placeholder"``: ``lerobot_nodes.MapStyleLeRobotDataset`` + ``DataLoader`` with a
  seeded shuffle. A PLACEHOLDER, used only until the streaming dataset lands: it is this
  project's ``--dataset.streaming=false`` path, not what issue 7 measures. Every result it
  produces is labelled ``PLACEHOLDER`` by the harness.

Switching A to the real streaming dataset is the one-line change below.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from typing import Any

import _driver_common as common
import torch

from lerobot_nodes import MapStyleLeRobotDataset

IMPLEMENTATION = "streaming"


def build_streaming(config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from lerobot_nodes import StreamingConfig, StreamingLeRobotDataset, streaming_dataloader
    from lerobot_nodes.loader import start_worker_context

    torch.manual_seed(config["seed"])
    if config["num_workers"] > 0:
        start_worker_context()  # as lerobot-nodes train and stream do before building the dataset
    # --dataset.streaming_* flags of a benchmark (bench_remote.py's HTTP flags), defaults otherwise.
    flags = json.loads(os.environ.get("LEROBOT_NODES_BENCH_FLAGS") or "{}")
    dataset = StreamingLeRobotDataset(
        config["repo_id"],
        root=config["root"],
        delta_timestamps=config["delta_timestamps"],
        tolerance_s=1e-4,
        max_num_shards=max(1, config["num_workers"]),
        seed=config["seed"],
        return_uint8=True,
        config=StreamingConfig(**flags),
    )
    loader = streaming_dataloader(
        dataset,
        config["batch_size"],
        config["num_workers"],
        pin_memory=False,
        **({"prefetch_factor": config["prefetch_factor"]} if config["num_workers"] > 0 else {}),
    )
    info = {"label": "lerobot_nodes StreamingLeRobotDataset + streaming_dataloader", "placeholder": False}
    return loader, info


def build_map_style_placeholder(config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(config["seed"])
    dataset = SpawnableMapStyle(
        config["repo_id"],
        root=config["root"],
        delta_timestamps=config["delta_timestamps"],
        tolerance_s=1e-4,
        return_uint8=True,
    )
    generator = torch.Generator().manual_seed(config["seed"])
    loader = torch.utils.data.DataLoader(
        dataset,
        num_workers=config["num_workers"],
        batch_size=config["batch_size"],
        shuffle=True,
        generator=generator,
        pin_memory=False,
        drop_last=False,
        **common.worker_kwargs(config),
    )
    info = {
        "label": "PLACEHOLDER lerobot_nodes MapStyleLeRobotDataset + DataLoader (not streaming)",
        "placeholder": True,
        "epoch_samples": len(dataset),
    }
    return loader, info


class SpawnableMapStyle(MapStyleLeRobotDataset):
    """Pickles for ``spawn`` DataLoader workers (the lock and caches are rebuilt per process)."""

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_lock"] = None
        state["_tables"] = OrderedDict()
        state["_episode_cache"] = OrderedDict()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


BUILDERS = {"streaming": build_streaming, "map_style_placeholder": build_map_style_placeholder}


if __name__ == "__main__":
    common.main(BUILDERS[IMPLEMENTATION])
