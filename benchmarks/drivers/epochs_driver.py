"""Several loaders, several epochs each, in one process tree, epochs of the loaders alternating.

Runs under this project's venv (loader ``nodes``: ``lerobot_nodes.StreamingLeRobotDataset`` +
``streaming_dataloader``) or under the LeRobot 0.6.1 venv (loader ``lerobot``: LeRobot's
``StreamingLeRobotDataset`` + ``DataLoader``, built as ``lerobot_streaming_driver.py`` builds it).
Unlike ``_driver_common.main`` (one timed pass), this driver runs whole epochs and stops between
them, so the harness can read the server's request counters per epoch.

Protocol (one line each, on stdout / stdin): prints ``@@READY``; then each phase waits for a
line, runs, and prints ``@@PHASE <json>``; after the last phase it waits for a line and exits.
The phases: the build of every loader of ``config["loaders"]``, in order ("open"); then for
epoch 1..``epochs`` one full epoch of each loader in turn (in reverse order in even epochs
unless ``alternate`` is false). Nothing runs between a ``@@PHASE`` line and the next line read,
so the harness counts each phase's requests on its own. A phase's JSON holds the
loader's name, the phase, samples, wall seconds, CPU seconds of the whole process tree (workers
included) and, for epochs, the time to the first batch.

Config (``argv[1]``, JSON): ``loaders``: list of ``{"name", "kind": "nodes" | "lerobot",
"repo_id", "root" (None: stream from ``$HF_ENDPOINT``), "env": {...}}`` (``env`` is applied
just before the loader is built, e.g. an ``HF_LEROBOT_HOME`` of its own); ``delta_timestamps``,
``num_workers``, ``batch_size``, ``seed``, ``epochs``, ``camera_key``, and for ``nodes`` loaders
``streaming`` (``StreamingConfig`` options).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import _driver_common as common
import torch

PHASE = "@@PHASE "


def build_nodes(spec: dict[str, Any], config: dict[str, Any]) -> Any:
    from lerobot_nodes import StreamingConfig, StreamingLeRobotDataset, streaming_dataloader
    from lerobot_nodes.loader import start_worker_context

    if config["num_workers"] > 0:
        start_worker_context()  # as lerobot-nodes train does before building the dataset
    dataset = StreamingLeRobotDataset(
        spec["repo_id"],
        root=spec["root"],
        delta_timestamps=config["delta_timestamps"],
        tolerance_s=1e-4,
        max_num_shards=max(1, config["num_workers"]),
        seed=config["seed"],
        return_uint8=True,
        config=StreamingConfig(**config.get("streaming", {})),
    )
    return streaming_dataloader(dataset, config["batch_size"], config["num_workers"], pin_memory=False)


def build_lerobot(spec: dict[str, Any], config: dict[str, Any]) -> Any:
    from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

    dataset = StreamingLeRobotDataset(
        spec["repo_id"],
        root=spec["root"],
        delta_timestamps=config["delta_timestamps"],
        tolerance_s=1e-4,
        max_num_shards=max(1, config["num_workers"]),
        seed=config["seed"],
        return_uint8=True,
    )
    options = common.worker_kwargs({**config, "prefetch_factor": 2, "mp_context": "spawn"})
    return torch.utils.data.DataLoader(
        dataset,
        num_workers=config["num_workers"],
        batch_size=config["batch_size"],
        shuffle=False,
        pin_memory=False,
        drop_last=False,
        **options,
    )


BUILDERS = {"nodes": build_nodes, "lerobot": build_lerobot}


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait() -> None:
    sys.stdin.readline()


def run_epoch(loader: Any, camera_key: str, me: int) -> dict[str, Any]:
    cpu = common.tree_cpu(me)
    started = time.perf_counter()
    first: float | None = None
    samples = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - started
        samples += int(batch[camera_key].shape[0])
        del batch
    return {
        "samples": samples,
        "wall_s": time.perf_counter() - started,
        "cpu_s": common.tree_cpu(me) - cpu,
        "ttfb_s": first,
    }


def main() -> None:
    config: dict[str, Any] = json.loads(sys.argv[1])
    torch.manual_seed(config["seed"])
    me = os.getpid()
    emit(common.READY)
    loaders = {}
    for spec in config["loaders"]:
        wait()
        os.environ.update(spec.get("env", {}))
        cpu, started = common.tree_cpu(me), time.perf_counter()
        loaders[spec["name"]] = BUILDERS[spec["kind"]](spec, config)
        emit(
            PHASE
            + json.dumps(
                {
                    "loader": spec["name"],
                    "phase": "open",
                    "samples": 0,
                    "wall_s": time.perf_counter() - started,
                    "cpu_s": common.tree_cpu(me) - cpu,
                }
            )
        )
    names = [spec["name"] for spec in config["loaders"]]
    specs = {spec["name"]: spec for spec in config["loaders"]}
    for epoch in range(1, config["epochs"] + 1):
        # ABBA...: every other epoch runs the loaders in reverse order, so neither always goes first.
        for name in names if epoch % 2 or not config.get("alternate", True) else names[::-1]:
            spec = specs[name]
            wait()
            os.environ.update(spec.get("env", {}))
            row = run_epoch(loaders[name], config["camera_key"], me)
            emit(PHASE + json.dumps({"loader": name, "phase": f"epoch {epoch}", **row}))
    wait()


if __name__ == "__main__":
    main()
