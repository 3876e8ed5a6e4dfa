"""``lerobot-nodes stream``: a LeRobot-style training data loop over the streaming dataset.

It builds ``StreamingLeRobotDataset`` + ``StatefulDataLoader`` exactly as training does,
consumes ``--steps`` batches with a progress bar, and can save a checkpoint and resume from
it to show exact resume. ``--record`` writes the (episode, frame) of every consumed sample.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..config import StreamingConfig
from ..dataset import StreamingLeRobotDataset, batch_samples, shutdown_dataloader, streaming_dataloader
from ..errors import ConfigError
from ..lifeline import GuardedWorkerInit
from ..map_style import MapStyleLeRobotDataset
from ..meta import load_meta
from ..sources.resolve import open_source
from .signals import Stopped, raise_if_stopped

WINDOWS = ("none", "act", "diffusion")
CHECKPOINT_VERSION = 1


def policy_window(name: str, fps: int, video_keys: list[str], has_state: bool) -> dict[str, list[float]] | None:
    """``delta_timestamps`` of the benchmark policies: ACT-like or diffusion-like."""
    if name == "none":
        return None
    if name == "act":
        window = {"action": [i / fps for i in range(50)]}
        window.update({key: [0.0] for key in video_keys})
        return window
    if name == "diffusion":
        observation = [-1 / fps, 0.0]
        window = {key: list(observation) for key in video_keys}
        if has_state:
            window["observation.state"] = list(observation)
        window["action"] = [i / fps for i in range(-1, 15)]
        return window
    raise ConfigError(f"--window must be one of {', '.join(WINDOWS)}, got {name!r}")


def describe_batch(batch: dict[str, Any]) -> str:
    """``key: dtype[shape]`` of every entry of a collated batch."""
    parts = []
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            parts.append(f"{key}: {str(value.dtype).removeprefix('torch.')}{list(value.shape)}")
        else:
            parts.append(f"{key}: {type(value).__name__}[{len(value)}]")
    return ", ".join(parts)


def _atomic_save(payload: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(payload, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def run_stream(
    dataset_options: dict[str, Any],
    streaming_options: dict[str, Any],
    training: dict[str, Any],
    *,
    window: str = "act",
    save_checkpoint: str | None = None,
    checkpoint_every: int = 0,
    resume: str | None = None,
    record: str | None = None,
    quiet: bool = False,
) -> int:
    from ..testing import ensure_demo_dataset

    batch_size = int(training.get("batch_size", 8))
    num_workers = int(training.get("num_workers", 2))
    steps = int(training.get("steps", 50))
    seed = training.get("seed", 1000)
    log_freq = int(training.get("log_freq", 0))
    root = dataset_options.get("root")
    repo_id = dataset_options.get("repo_id")
    if root is None and repo_id is None:
        root = str(ensure_demo_dataset())
    source = open_source(
        root, repo_id=repo_id, revision=dataset_options.get("revision"), repo_type=dataset_options.get("repo_type", "dataset")
    )
    delta_timestamps = dataset_options.get("delta_timestamps")
    if delta_timestamps is None:
        meta = load_meta(source)
        delta_timestamps = policy_window(window, meta.fps, meta.video_keys, "observation.state" in meta.features)
    common = {
        "root": source,
        "repo_id": repo_id,
        "episodes": dataset_options.get("episodes"),
        "delta_timestamps": delta_timestamps,
        "tolerance_s": dataset_options.get("tolerance_s", 1e-4),
        "return_uint8": dataset_options.get("return_uint8", True),
    }
    if not dataset_options.get("streaming", True):
        return _run_map_style(common, batch_size, num_workers, steps, quiet)

    checkpoint = torch.load(resume, weights_only=False) if resume else None
    if checkpoint is not None and "seed" in checkpoint and "seed" not in training:
        seed = checkpoint["seed"]
    dataset = StreamingLeRobotDataset(
        **common, seed=seed, max_num_shards=max(1, num_workers), config=StreamingConfig(**streaming_options)
    )
    loader = streaming_dataloader(dataset, batch_size=batch_size, num_workers=num_workers)
    num_workers = loader.num_workers
    start_step = 0
    if checkpoint is not None:
        start_step = _restore(checkpoint, dataset, loader, batch_size, num_workers)
    if not quiet:
        print(dataset.meta.summary())
        print(
            f"streaming {len(dataset.episodes)} episodes, {dataset.num_frames} frames: batch_size={batch_size} "
            f"num_workers={num_workers} seed={dataset.seed} steps={start_step}..{steps}"
        )
    recorder = open(record, "a") if record else None  # noqa: SIM115 - closed in finally
    step = start_step
    try:
        with tqdm(total=steps, initial=start_step, disable=quiet, unit="batch", dynamic_ncols=True) as progress:
            while step < steps:
                for batch in dataset.metrics.timed(loader, batch_samples):
                    raise_if_stopped()
                    step += 1
                    if step == start_step + 1 and not quiet:
                        progress.write("first batch: " + describe_batch(batch))
                    if recorder is not None:
                        pairs = list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=False))
                        recorder.write(json.dumps({"step": step, "samples": pairs}) + "\n")
                        recorder.flush()
                    report = dataset.metrics.report()
                    progress.set_postfix(samples_per_s=f"{report.samples_per_second:.1f}", refresh=False)
                    progress.update(1)
                    if log_freq and step % log_freq == 0:
                        logging.getLogger("lerobot_nodes").info("step %d: %s", step, report.line())
                    if save_checkpoint and (step == steps or (checkpoint_every and step % checkpoint_every == 0)):
                        _save(save_checkpoint, loader, dataset, step, batch_size, num_workers)
                    if step >= steps:
                        break
        if not quiet:
            print("end of run:")
            print(dataset.metrics.report().table())
    except Stopped as stop:
        stop.detail = f"after step {step} of {steps}; DataLoader workers shut down"
        raise
    finally:
        # Workers first: they write the shared counters the last line releases.
        shutdown_dataloader(loader)
        if recorder is not None:
            recorder.close()
        dataset.counters.close()
    return 0


def _save(path: str, loader: Any, dataset: StreamingLeRobotDataset, step: int, batch_size: int, num_workers: int) -> None:
    payload = {
        "version": CHECKPOINT_VERSION,
        "step": step,
        "batch_size": batch_size,
        "num_workers": num_workers,
        "world_size": dataset.world_size,
        "seed": dataset.seed,
        "dataloader": loader.state_dict(),
    }
    _atomic_save(payload, Path(path))


def _restore(checkpoint: dict[str, Any], dataset: StreamingLeRobotDataset, loader: Any, batch_size: int, num_workers: int) -> int:
    step = int(checkpoint["step"])
    if "dataloader" not in checkpoint:
        # A LeRobot training_step.json-like checkpoint: derive each worker's offset from the step.
        dataset.resume_from_step(
            step,
            int(checkpoint["batch_size"]),
            int(checkpoint.get("num_workers", num_workers)),
            world_size=checkpoint.get("dp_world_size", checkpoint.get("world_size")),
            seed=checkpoint.get("seed"),
        )
        return step
    changed = {
        name: (checkpoint[name], now)
        for name, now in (("batch_size", batch_size), ("num_workers", num_workers), ("world_size", dataset.world_size))
        if int(checkpoint[name]) != now
    }
    if changed:
        details = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
        raise ConfigError(
            f"cannot resume {details} exactly: batch ownership and boundaries change with world size, batch size and "
            "--num_workers. Resume with the checkpoint's values"
        )
    loader.load_state_dict(checkpoint["dataloader"])
    return step


def _run_map_style(common: dict[str, Any], batch_size: int, num_workers: int, steps: int, quiet: bool) -> int:
    from torch.utils.data import DataLoader, RandomSampler

    dataset = MapStyleLeRobotDataset(**common)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        sampler=RandomSampler(dataset),
        worker_init_fn=GuardedWorkerInit() if num_workers > 0 else None,
    )
    step = 0
    with tqdm(total=steps, disable=quiet, unit="batch") as progress:
        while step < steps:
            for _ in loader:
                raise_if_stopped()
                step += 1
                progress.update(1)
                if step >= steps:
                    break
    return 0
