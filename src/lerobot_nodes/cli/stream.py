"""``lerobot-nodes stream``: a LeRobot-style training data loop over the streaming dataset.

It builds ``StreamingLeRobotDataset`` + ``StatefulDataLoader`` exactly as training does,
consumes ``--steps`` batches with a progress bar, and can save a checkpoint and resume from
it to show exact resume. ``--record`` writes the (episode, frame) of every consumed sample, and
its dataset first when a mixture streams (``--dataset.repo_id='["OWNER/A","OWNER/B"]'``).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..config import StreamingConfig
from ..dataset import StreamingLeRobotDataset
from ..errors import ConfigError
from ..format.meta import load_meta
from ..loader import shutdown_dataloader, start_worker_context, streaming_dataloader
from ..map_style import MapStyleLeRobotDataset
from ..resume.identity import check_identity
from ..sample.assemble import SampleSpec
from ..sources.resolve import open_source
from ..workers.lifeline import GuardedWorkerInit
from .console import plural
from .flags import (
    DATASET_FLAGS,
    DEFAULT_WINDOW,
    EACH_CAMERA,
    POLICY_WINDOWS,
    TRAINING_FLAGS,
    WINDOWS,
    with_defaults,
)
from .limits import ensure_open_file_limit
from .signals import WORKERS_STOP_WITHIN_S, Stopped, raise_if_stopped

CHECKPOINT_VERSION = 1
TRAINING_STEP_FILE = "training_step.json"
"""What LeRobot training saves in ``checkpoints/<step>/training_state/``: ``{"step": N, ...}``."""


def policy_window(name: str, fps: int, video_keys: list[str], has_state: bool) -> dict[str, list[float]] | None:
    """``delta_timestamps`` of the benchmark policies: ACT-like or diffusion-like; ``none`` reads single frames."""
    if name == "none":
        return None
    if name not in POLICY_WINDOWS:
        raise ConfigError(f"--window must be one of {', '.join(WINDOWS)}, got {name!r}")
    window = {}
    for key, offsets in POLICY_WINDOWS[name].items():
        if key == EACH_CAMERA:
            keys = video_keys
        elif key == "observation.state" and not has_state:
            keys = []
        else:
            keys = [key]
        window.update({k: [i / fps for i in offsets] for k in keys})
    return window


def apply_delta_timestamps(
    dataset: StreamingLeRobotDataset, delta_timestamps: dict[str, list[float]] | None
) -> None:
    """Give an opened ``dataset`` its ``delta_timestamps``, before any iteration, checked as its constructor
    checks them: for windows that depend on the opened metadata (a mixture's fps and shared cameras are
    known only once every dataset is open), so no metadata is read twice."""
    SampleSpec.from_meta(dataset.meta, delta_timestamps, dataset.tolerance_s, depth_output_unit=dataset.depth_output_unit)
    dataset.delta_timestamps = None if delta_timestamps is None else dict(delta_timestamps)


def use_policy_window(dataset: StreamingLeRobotDataset, window: str) -> None:
    """Give ``dataset`` the ``--window`` policy window, from the metadata it opened."""
    meta = dataset.meta
    apply_delta_timestamps(
        dataset, policy_window(window, meta.fps, meta.video_keys, "observation.state" in meta.features)
    )


def sample_keys(batch: dict[str, Any]) -> list[list[int]]:
    """What ``--record`` writes per sample: ``[episode, frame]``, or ``[dataset_index, episode, frame]``
    when the batch comes from a mixture (its samples carry ``dataset_index``)."""
    columns = [batch["episode_index"].tolist(), batch["frame_index"].tolist()]
    if "dataset_index" in batch:
        columns.insert(0, batch["dataset_index"].tolist())
    return [[int(value) for value in key] for key in zip(*columns, strict=True)]


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
    training_options: dict[str, Any],
    *,
    window: str = DEFAULT_WINDOW,
    save_checkpoint: str | None = None,
    checkpoint_every: int | None = None,
    resume: str | None = None,
    record: str | None = None,
    quiet: bool = False,
) -> int:
    """Stream ``training_options["steps"]`` batches; the option dicts hold the flags given (see ``flags``)."""
    from ..testing import ensure_demo_dataset

    if checkpoint_every is not None and not save_checkpoint:
        raise ConfigError("--checkpoint-every needs --save-checkpoint=PATH: the file the checkpoints are saved to")
    config = StreamingConfig(**streaming_options)
    options = with_defaults(dataset_options, DATASET_FLAGS)
    training = with_defaults(training_options, TRAINING_FLAGS)
    batch_size, num_workers, steps = training["batch_size"], training["num_workers"], training["steps"]
    ensure_open_file_limit(num_workers)
    # Read before any worker process starts or dataset opens: an unusable checkpoint is one line at once.
    checkpoint = load_checkpoint(resume) if resume and options["streaming"] else None
    root, repo_id = options["root"], options["repo_id"]
    if num_workers > 0 and options["streaming"]:
        start_worker_context()  # forked while this process is plain: before s3fs's thread (s3:// roots)
    if root is None and repo_id is None:
        root = str(ensure_demo_dataset())
    mixture = isinstance(repo_id, list) or isinstance(root, list)
    if window not in WINDOWS:  # before any dataset opens
        raise ConfigError(f"--window must be one of {', '.join(WINDOWS)}, got {window!r}")
    common = {
        "episodes": options["episodes"],
        "delta_timestamps": options["delta_timestamps"],
        "tolerance_s": options["tolerance_s"],
        "return_uint8": options["return_uint8"],
        "depth_output_unit": options["depth_output_unit"],
    }
    if not options["streaming"]:
        if mixture:
            raise ConfigError(
                "--dataset.streaming=false reads one dataset map-style: a list --dataset.repo_id/--dataset.root "
                "(a mixture) streams only"
            )
        source = open_source(root, repo_id=repo_id, revision=options["revision"], repo_type=options["repo_type"])
        if common["delta_timestamps"] is None:
            meta = load_meta(source)
            common["delta_timestamps"] = policy_window(
                window, meta.fps, meta.video_keys, "observation.state" in meta.features
            )
        return _run_map_style({**common, "root": source, "repo_id": repo_id}, batch_size, num_workers, steps, quiet)

    if checkpoint is not None and int(checkpoint["step"]) >= steps:
        print(f"checkpoint is at step {checkpoint['step']}, --steps={steps} is already reached: nothing to stream")
        return 0
    seed = training["seed"]
    if checkpoint is not None and "seed" in checkpoint and "seed" not in training_options:
        seed = checkpoint["seed"]
    dataset = StreamingLeRobotDataset(
        **common,
        root=root,
        repo_id=repo_id,
        revision=options["revision"],
        repo_type=options["repo_type"],
        rename_map=options["streaming_rename_map"],
        seed=seed,
        max_num_shards=max(1, num_workers),
        config=config,
    )
    try:
        if common["delta_timestamps"] is None:
            use_policy_window(dataset, window)
        _stream_steps(
            dataset, batch_size, num_workers, steps, training["log_freq"], checkpoint, save_checkpoint,
            checkpoint_every, record, quiet,
        )
    finally:
        dataset.counters.close()
    return 0


def _stream_steps(
    dataset: StreamingLeRobotDataset,
    batch_size: int,
    num_workers: int,
    steps: int,
    log_freq: int,
    checkpoint: dict[str, Any] | None,
    save_checkpoint: str | None,
    checkpoint_every: int | None,
    record: str | None,
    quiet: bool,
) -> None:
    loader = streaming_dataloader(dataset, batch_size=batch_size, num_workers=num_workers)
    num_workers = loader.num_workers
    start_step = 0
    replayed_from = None
    if checkpoint is not None:
        start_step, replayed_from = _restore(checkpoint, dataset, loader, batch_size, num_workers)
    if not quiet:
        print(dataset.meta.summary())
        print(
            f"streaming {plural(len(dataset.episodes), 'episode')}, {plural(dataset.num_frames, 'frame')}"
            + (f" ({plural(len(dataset.skipped), 'episode')} of this rank skipped as bad)" if len(dataset.skipped) else "")
            + ": "
            f"batch_size={batch_size} "
            f"num_workers={num_workers} seed={dataset.seed} steps={start_step}..{steps}"
        )
    step = start_step
    stopped = False
    try:
        # Both close on an error too, so the error line starts on a line of its own.
        with (
            open(record, "a") if record else contextlib.nullcontext() as recorder,
            tqdm(total=steps, initial=start_step, disable=quiet, unit="batch", dynamic_ncols=True) as progress,
            logging_redirect_tqdm(),  # log lines above the bar, in the root logger's format
        ):
            while step < steps:
                for batch in dataset.metrics.timed(loader):
                    raise_if_stopped()
                    step += 1
                    if step == start_step + 1 and not quiet:
                        progress.write("first batch: " + describe_batch(batch))
                    if recorder is not None:
                        recorder.write(json.dumps({"step": step, "samples": sample_keys(batch)}) + "\n")
                        recorder.flush()
                    report = dataset.metrics.report()
                    progress.set_postfix(samples_per_s=f"{report.samples_per_second:.1f}", refresh=False)
                    progress.update(1)
                    if log_freq and step % log_freq == 0:
                        logging.getLogger("lerobot_nodes").info("step %d: %s", step, report.line())
                    if save_checkpoint and (step == steps or (checkpoint_every and step % checkpoint_every == 0)):
                        _save(save_checkpoint, loader, dataset, step, batch_size, num_workers, replayed_from)
                    if step >= steps:
                        break
    except Stopped as stop:
        stopped = True
        stop.detail = f"after step {step} of {steps}; DataLoader workers shut down"
        raise
    finally:
        # Workers first: they write the shared counters the caller then releases.
        shutdown_dataloader(loader, within_s=WORKERS_STOP_WITHIN_S if stopped else None)
    if not quiet:
        print("end of run:")
        print(dataset.metrics.report().table())


def load_checkpoint(path: str) -> dict[str, Any]:
    """A checkpoint saved by ``--save-checkpoint``, or LeRobot's ``training_step.json`` (a file, or the
    checkpoint folder holding ``training_state/training_step.json``)."""
    file = _training_step_file(Path(path))
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"--resume={path}: no such checkpoint file") from None
    except OSError as error:
        raise ConfigError(f"--resume={path}: cannot read the checkpoint: {error.strerror or error}") from None
    if data.lstrip()[:1] == b"{":
        return _training_step(file, data)
    try:
        checkpoint = torch.load(io.BytesIO(data), weights_only=False)
    except Exception as exc:  # torch.load fails in many ways on a file that is not one of its archives
        raise ConfigError(
            f"--resume={file} is neither a checkpoint saved by --save-checkpoint nor LeRobot's {TRAINING_STEP_FILE}: "
            f"{error_summary(exc)}"
        ) from exc
    if not isinstance(checkpoint, dict) or "step" not in checkpoint:
        raise ConfigError(f"--resume={file} is not a checkpoint saved by --save-checkpoint: it has no 'step'")
    return checkpoint


def _training_step_file(path: Path) -> Path:
    """``path``, or the ``training_step.json`` inside a LeRobot checkpoint folder."""
    if not path.is_dir():
        return path
    for candidate in (path / "training_state" / TRAINING_STEP_FILE, path / TRAINING_STEP_FILE):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"--resume={path} is a folder without training_state/{TRAINING_STEP_FILE} or {TRAINING_STEP_FILE}")


def _training_step(file: Path, data: bytes) -> dict[str, Any]:
    """LeRobot's ``{"step": N, ...}``: the step, and whatever of batch size, world size and seed it records."""
    try:
        content = json.loads(data)
    except ValueError as exc:
        raise ConfigError(f"--resume={file} is not valid JSON: {exc}") from None
    step = content.get("step") if isinstance(content, dict) else None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"--resume={file} has no step: expected LeRobot's {TRAINING_STEP_FILE}, {{\"step\": N, ...}}")
    checkpoint: dict[str, Any] = {"step": step}
    # LeRobot versions name the number of data-parallel processes differently.
    for key in ("dp_world_size", "num_processes", "world_size"):
        if isinstance(content.get(key), int):
            checkpoint["world_size"] = content[key]
            break
    for key in ("batch_size", "seed", "num_workers"):
        if isinstance(content.get(key), int):
            checkpoint[key] = content[key]
    return checkpoint


def error_summary(error: BaseException) -> str:
    """The first line of ``error``'s message (torch.load's can run over many lines)."""
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


REPLAYED_KEY = "replayed_from"
"""Checkpoint key: the step and topology a run was replayed from when it resumed in another topology."""


def _save(
    path: str,
    loader: Any,
    dataset: StreamingLeRobotDataset,
    step: int,
    batch_size: int,
    num_workers: int,
    replayed_from: dict[str, Any] | None = None,
) -> None:
    payload = {
        REPLAYED_KEY: replayed_from,
        "version": CHECKPOINT_VERSION,
        "step": step,
        "batch_size": batch_size,
        "num_workers": num_workers,
        "world_size": dataset.world_size,
        "seed": dataset.seed,
        "dataset": dataset.checkpoint_identity(),
        "dataloader": loader.state_dict(),
    }
    _atomic_save(payload, Path(path))


def _restore(
    checkpoint: dict[str, Any], dataset: StreamingLeRobotDataset, loader: Any, batch_size: int, num_workers: int
) -> tuple[int, dict[str, Any] | None]:
    """Resume from ``checkpoint``: the step to continue from, and what later checkpoints record as
    :data:`REPLAYED_KEY` (a step replay in another topology makes later steps unreplayable)."""
    step = int(checkpoint["step"])
    topology = {"batch_size": batch_size, "num_workers": num_workers, "world_size": dataset.world_size}
    changed = [name for name, now in topology.items() if name in checkpoint and int(checkpoint[name]) != now]
    replayed = checkpoint.get(REPLAYED_KEY)
    if "dataloader" not in checkpoint or changed:
        if replayed is not None:
            raise ConfigError(
                f"this checkpoint's run resumed step {replayed['step']} of a run of another topology ({replayed}): "
                "its step cannot be replayed through two topologies. Resume it with its own batch size, world "
                f"size and --num_workers ({', '.join(f'{k}={checkpoint[k]}' for k in topology)}): that is exact"
            )
        # A LeRobot training_step.json-like checkpoint, or a loader state of another topology: a loader
        # state holds only its own rank's position, so every rank derives every old rank's position
        # from the step and the old topology (the batch size, workers and world size it records).
        dataset.resume_from_step(
            step,
            int(checkpoint.get("batch_size", batch_size)),
            int(checkpoint.get("num_workers", num_workers)),
            world_size=checkpoint.get("dp_world_size", checkpoint.get("world_size")),
            seed=checkpoint.get("seed"),
            identity=checkpoint.get("dataset"),
        )
        dataset.plan_resume(num_workers, batch_size)
        if changed:
            replayed = {"step": step, **{name: checkpoint.get(name) for name in topology}}
        return step, replayed
    # Checked here too, so another dataset fails before any worker starts.
    check_identity(checkpoint.get("dataset"), dataset.identity)
    loader.load_state_dict(checkpoint["dataloader"])
    return step, replayed


def _run_map_style(common: dict[str, Any], batch_size: int, num_workers: int, steps: int, quiet: bool) -> int:
    """``--dataset.streaming=false``: LeRobot's map-style reading, with the same summary and report."""
    from torch.utils.data import DataLoader, RandomSampler

    from ..metrics import StreamingMetrics

    dataset = MapStyleLeRobotDataset(**common)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        sampler=RandomSampler(dataset),
        worker_init_fn=GuardedWorkerInit() if num_workers > 0 else None,
    )
    metrics = StreamingMetrics()
    if not quiet:
        print(dataset.meta.summary())
        print(f"reading {plural(len(dataset.episodes), 'episode')}, {plural(dataset.num_frames, 'frame')} map-style "
              "(--dataset.streaming=false): "
              f"batch_size={batch_size} num_workers={num_workers} steps=0..{steps}")
    step = 0
    with tqdm(total=steps, disable=quiet, unit="batch") as progress:
        while step < steps:
            for _ in metrics.timed(loader):
                raise_if_stopped()
                step += 1
                progress.update(1)
                if step >= steps:
                    break
    if not quiet:
        print("end of run (map-style: the streaming counters stay at zero):")
        print(metrics.report().table())
    return 0
