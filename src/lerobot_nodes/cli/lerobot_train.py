"""LeRobot's own trainer (``lerobot.scripts.lerobot_train``) reading through this package's streaming loader.

:func:`run_lerobot_train` runs LeRobot's training entry point with the command line it is given,
unchanged. While it runs, four names LeRobot's trainer looks up are replaced (:data:`HOOKS`);
each replacement hands over to LeRobot's original when the run is not ``--dataset.streaming=true``:

- ``lerobot_train.make_train_eval_datasets(cfg)``: returns a :class:`TrainerDataset`, LeRobot's
  own ``LeRobotDatasetMetadata`` (what the policy, the processors and the log read) in front of a
  :class:`~lerobot_nodes.StreamingLeRobotDataset` built from the same config: repo_id, root,
  revision, repo_type, episodes, ``delta_timestamps`` from LeRobot's ``resolve_delta_timestamps``,
  image transforms, ``--seed``, ``--tolerance_s``, ``max_num_shards`` from ``--num_workers`` and
  the ``--dataset.streaming_*`` options. With ``--dataset.eval_split`` the held-out episodes
  (LeRobot's rule, :func:`split_train_eval`) go to LeRobot's map-style ``LeRobotDataset``, as LeRobot does.
- ``accelerate.Accelerator``: a subclass whose ``prepare`` replaces the DataLoader the trainer
  built over that dataset with the ``StatefulDataLoader`` of :func:`~lerobot_nodes.streaming_dataloader`
  (Accelerate would re-wrap it and, with several processes, dispatch or split the batches of a
  dataset that already shards by rank). On ``--resume=true`` the loader state saved beside the
  checkpoint is loaded (exact), else the step offset of ``training_step.json`` is used.
- ``lerobot_train.should_save_checkpoint``: at each checkpoint step, every rank writes its loader
  state to ``<checkpoint>/training_state/lerobot_nodes_loader_rank<R>.pt`` (atomically).
- ``lerobot_train.MetricsTracker``: the training log line and its wandb dict carry the streaming
  metrics.

:func:`check_lerobot` verifies that every hooked name still exists, with the signature these
replacements expect, and that LeRobot's ``train`` still uses it: a LeRobot upgrade that changes
one fails loudly (:class:`~lerobot_nodes.errors.LeRobotIncompatibleError`) instead of silently
training on LeRobot's loader. LeRobot is imported lazily: this module imports without it.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import importlib.metadata
import inspect
import io
import json
import logging
import math
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset
from torchdata.nodes.samplers.utils import get_rank_and_world_size

from ..atomic import atomic_write
from ..config import StreamingConfig
from ..dataset import StreamingLeRobotDataset
from ..errors import ConfigError, LeRobotIncompatibleError
from ..format.mixture import MixtureMeta
from ..format.mixture_open import MixtureRequest, is_mixture
from ..loader import loader_batch_size, shutdown_dataloader, start_worker_context, streaming_dataloader
from .flags import dataset_list, parse_list
from .stream import apply_delta_timestamps, sample_keys

logger = logging.getLogger("lerobot_nodes.cli.lerobot_train")

MINIMUM_LEROBOT = (0, 6, 1)
TESTED_LEROBOT = "0.6.1"
TRAINER_MODULE = "lerobot.scripts.lerobot_train"
RECORD_ENV = "LEROBOT_NODES_RECORD"
"""A file: each rank appends ``{"rank": R, "step": N, "samples": [[episode, frame], ...]}`` per batch the trainer
takes (``[dataset_index, episode, frame]`` per sample for a mixture)."""
RENAME_MAP_KEY = "streaming_rename_map"
"""``--dataset.streaming_rename_map``'s key in the streaming options (and in the saved loader state)."""
TRAINING_STATE_DIR = "training_state"
TRAINING_STEP_FILE = "training_step.json"
LOADER_STATE_VERSION = 1
STREAMING_PREFIX = "streaming/"
"""Prefix of the streaming metrics in the wandb dict."""


def loader_state_file(rank: int) -> str:
    """The name of rank ``rank``'s loader state in a checkpoint's ``training_state/`` folder."""
    return f"lerobot_nodes_loader_rank{rank}.pt"


@dataclasses.dataclass(frozen=True)
class Hook:
    """A name LeRobot's trainer looks up, replaced during the run; ``parameters`` is the signature relied on."""

    module: str
    name: str
    parameters: tuple[str, ...]
    method: str | None = None
    """Check the signature of this method of the class instead of the object itself."""

    def target(self) -> Any:
        found = getattr(importlib.import_module(self.module), self.name, None)
        if found is None:
            raise LeRobotIncompatibleError(f"{self.module}.{self.name} is gone: {_upgrade_hint()}")
        return found

    def check(self) -> None:
        target = self.target()
        function = getattr(target, self.method) if self.method else target
        names = tuple(p for p in inspect.signature(function).parameters if p != "self")
        if names[: len(self.parameters)] != self.parameters:
            where = f"{self.module}.{self.name}" + (f".{self.method}" if self.method else "")
            raise LeRobotIncompatibleError(
                f"{where} takes ({', '.join(names)}), expected "
                f"({', '.join(self.parameters)}): {_upgrade_hint()}"
            )


HOOKS: tuple[Hook, ...] = (
    Hook(TRAINER_MODULE, "make_train_eval_datasets", ("cfg",)),
    Hook(TRAINER_MODULE, "should_save_checkpoint", ("step", "save_freq", "total_steps")),
    Hook(
        TRAINER_MODULE,
        "MetricsTracker",
        ("batch_size", "num_frames", "num_episodes", "metrics", "initial_step", "accelerator"),
        method="__init__",
    ),
    Hook("accelerate", "Accelerator", ("args", "device_placement"), method="prepare"),
)
"""What is replaced while LeRobot's trainer runs."""

USED: tuple[Hook, ...] = (
    Hook("lerobot.datasets.factory", "resolve_delta_timestamps", ("cfg", "ds_meta")),
    Hook("lerobot.datasets.dataset_metadata", "LeRobotDatasetMetadata", ("repo_id", "root", "revision"), "__init__"),
    Hook("lerobot.common.train_utils", "get_step_checkpoint_dir", ("output_dir", "total_steps", "step")),
    Hook("lerobot.transforms", "ImageTransforms", ("cfg",), method="__init__"),
)
"""LeRobot functions called as LeRobot's own dataset factory calls them."""

TRAIN_USES = ("make_train_eval_datasets", "should_save_checkpoint", "MetricsTracker", "Accelerator", "cycle")
"""Names LeRobot's ``train()`` must still look up for the hooks to take effect."""


def _upgrade_hint() -> str:
    return (
        f"lerobot-nodes train supports LeRobot {TESTED_LEROBOT} (this is {lerobot_version() or 'not installed'}); "
        f"install lerobot=={TESTED_LEROBOT} or run LeRobot's lerobot-train"
    )


def lerobot_version() -> str | None:
    try:
        return importlib.metadata.version("lerobot")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    numbers = []
    for part in version.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        numbers.append(int(digits or 0))
    return tuple(numbers)


def check_lerobot() -> str:
    """LeRobot's version, after checking that everything :data:`HOOKS` and :data:`USED` rely on is there.

    Raises :class:`LeRobotIncompatibleError` naming what is missing or changed.
    """
    version = lerobot_version()
    if sys.version_info < (3, 12):
        raise LeRobotIncompatibleError(
            f"lerobot-nodes train runs LeRobot's trainer, which needs Python >= 3.12 (this is "
            f"{sys.version.split()[0]}): make a Python 3.12 venv, then from this repository's clone: "
            "pip install -e '.[lerobot]'"
        )
    if version is None:
        raise LeRobotIncompatibleError(
            "lerobot-nodes train runs LeRobot's trainer: it needs LeRobot >= 0.6.1 with its training extra; "
            "from this repository's clone: pip install -e '.[lerobot]' (or pip install 'lerobot[training]>=0.6.1')"
        )
    if _release(version) < MINIMUM_LEROBOT:
        raise LeRobotIncompatibleError(f"LeRobot {version} is too old: {_upgrade_hint()}")
    try:
        trainer = importlib.import_module(TRAINER_MODULE)
        for hook in (*HOOKS, *USED):
            hook.check()
    except ImportError as error:
        raise LeRobotIncompatibleError(f"cannot import LeRobot's trainer: {error}; pip install 'lerobot[training]'") from error
    train = inspect.unwrap(trainer.train)
    missing = [name for name in TRAIN_USES if name not in train.__code__.co_names]
    if missing:
        raise LeRobotIncompatibleError(f"LeRobot's train() no longer uses {', '.join(missing)}: {_upgrade_hint()}")
    return version


LIST_FIELDS = ("repo_id", "root", "revision")
"""``DatasetConfig`` fields a mixture gives as lists (``--dataset.repo_id='["OWNER/A","OWNER/B"]'``)."""


def lerobot_list(flag: str, value: Any) -> Any:
    """``value`` of a :data:`LIST_FIELDS` field as a list when it spells one, else unchanged.

    LeRobot 0.6.1's parser reads ``--dataset.repo_id='["A","B"]'`` into its ``str`` field as the
    Python text ``"['A', 'B']"`` (and saves that in ``train_config.json``): that text, or JSON, is a list.
    """
    if not isinstance(value, str) or not value.lstrip().startswith("["):
        return value
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return parse_list(flag, value)  # the JSON spelling, as lerobot-nodes stream reads it
    return dataset_list(flag, value, parsed)


def split_train_eval(
    episode_tasks: Sequence[Any], episodes: Iterable[int], eval_split: float
) -> tuple[list[int], list[int]]:
    """LeRobot 0.6.1's ``--dataset.eval_split`` rule: per task (an episode's first task), the last
    ``ceil(n * eval_split)`` of its ``n`` selected episodes are held out for evaluation."""
    by_task: dict[str, list[int]] = {}
    for episode in episodes:
        tasks = episode_tasks[episode]
        by_task.setdefault(tasks[0] if len(tasks) else "", []).append(int(episode))
    train, held_out = [], []
    for group in by_task.values():
        count = math.ceil(len(group) * eval_split)
        train += group[: len(group) - count]
        held_out += group[len(group) - count :]
    if not train:
        raise ConfigError(f"--dataset.eval_split={eval_split} leaves no training episode of {sum(map(len, by_task.values()))}")
    return train, held_out


class TrainerDataset(IterableDataset):  # type: ignore[type-arg]
    """What LeRobot's trainer sees: LeRobot's metadata in front of a :class:`StreamingLeRobotDataset`.

    The trainer reads ``meta`` (LeRobot's ``LeRobotDatasetMetadata``: features, stats, camera
    keys), ``num_frames``, ``num_episodes`` and ``episodes``; its samples come only through the
    loader that ``Accelerator.prepare`` substitutes, never from iterating this object.
    """

    def __init__(self, streaming: StreamingLeRobotDataset, meta: Any) -> None:
        super().__init__()
        self.streaming = streaming
        self.meta = meta

    @property
    def num_frames(self) -> int:
        return self.streaming.num_frames

    @property
    def num_episodes(self) -> int:
        return self.streaming.num_episodes

    @property
    def episodes(self) -> list[int]:
        return self.streaming.episodes

    @property
    def fps(self) -> int:
        return self.streaming.fps

    def __iter__(self) -> Iterator[Any]:
        raise LeRobotIncompatibleError(
            "LeRobot's trainer iterated its own DataLoader instead of the streaming loader: Accelerator.prepare "
            f"was not called on it. {_upgrade_hint()}"
        )


class StreamingTrainLoader:
    """The loader the trainer iterates: the ``StatefulDataLoader``, timed for the metrics and optionally recorded."""

    def __init__(self, loader: Any, dataset: StreamingLeRobotDataset, start_step: int, record: str | None) -> None:
        self.loader = loader
        self.dataset = dataset
        self.step = start_step
        self.record = record

    def __iter__(self) -> Iterator[Any]:
        for batch in self.dataset.metrics.timed(self.loader):
            self.step += 1
            if self.record:
                self._record(batch)
            yield batch

    def _record(self, batch: dict[str, Any]) -> None:
        line = json.dumps({"rank": self.dataset.rank, "step": self.step, "samples": sample_keys(batch)})
        with open(self.record, "a") as stream:  # type: ignore[arg-type]
            stream.write(line + "\n")

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()  # type: ignore[no-any-return]

    @property
    def batch_size(self) -> int:
        return loader_batch_size(self.loader)

    @property
    def num_workers(self) -> int:
        return int(self.loader.num_workers)


class TrainingSession:
    """The streaming side of one ``lerobot-nodes train`` process: the options, the dataset and its loader."""

    def __init__(self, streaming_options: dict[str, Any]) -> None:
        options = dict(streaming_options)
        self.rename_map: dict[str, dict[str, str]] | None = options.pop(RENAME_MAP_KEY, None)
        StreamingConfig(**options)  # impossible values fail before LeRobot starts
        self.streaming_options = options
        self.cfg: Any = None
        self.view: TrainerDataset | None = None
        self.loader: StreamingTrainLoader | None = None
        self.record = os.environ.get(RECORD_ENV) or None

    @property
    def dataset(self) -> StreamingLeRobotDataset | None:
        return self.view.streaming if self.view is not None else None

    # -- make_train_eval_datasets --------------------------------------------------------------
    def make_datasets(self, cfg: Any) -> tuple[TrainerDataset, Any]:
        from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
        from lerobot.datasets.factory import resolve_delta_timestamps

        self.cfg = cfg
        if int(cfg.num_workers) > 0:
            start_worker_context()  # forked before the dataset and the policy: workers need not import torch again
        for name in LIST_FIELDS:
            setattr(cfg.dataset, name, lerobot_list(f"--dataset.{name}", getattr(cfg.dataset, name)))
        if is_mixture(cfg.dataset.repo_id, cfg.dataset.root):
            return self._make_mixture(cfg)
        if self.rename_map is not None:
            raise ConfigError(
                "--dataset.streaming_rename_map renames the features of a mixture's datasets: give "
                "--dataset.repo_id as a list, '[\"OWNER/A\",\"OWNER/B\"]'"
            )
        meta = LeRobotDatasetMetadata(
            cfg.dataset.repo_id, root=cfg.dataset.root, revision=cfg.dataset.revision, repo_type=cfg.dataset.repo_type
        )
        delta_timestamps = resolve_delta_timestamps(cfg.trainable_config, meta)
        episodes, eval_episodes = cfg.dataset.episodes, None
        if cfg.dataset.eval_split:
            selected = episodes if episodes is not None else range(meta.total_episodes)
            episodes, eval_episodes = split_train_eval(meta.episodes["tasks"], selected, cfg.dataset.eval_split)
        dataset = self._streaming_dataset(cfg, episodes, delta_timestamps=delta_timestamps)
        eval_dataset = None
        if eval_episodes is not None:
            # LeRobot evaluates held-out episodes map-style, streaming or not (make_train_eval_datasets).
            from lerobot.datasets.lerobot_dataset import LeRobotDataset

            eval_dataset = LeRobotDataset(
                cfg.dataset.repo_id,
                root=cfg.dataset.root,
                episodes=eval_episodes,
                delta_timestamps=delta_timestamps,
                image_transforms=None,
                revision=cfg.dataset.revision,
                video_backend=cfg.dataset.video_backend,
                return_uint8=True,
                tolerance_s=cfg.tolerance_s,
            )
            logger.info("train/eval split: %d streamed training episodes, %d held out", len(episodes), len(eval_episodes))
        self._use_imagenet_stats(cfg, (meta, *([eval_dataset.meta] if eval_dataset is not None else [])))
        self.view = TrainerDataset(dataset, meta)
        logger.info(
            "streaming %d episodes, %d frames with lerobot_nodes (seed %s, %s)",
            dataset.num_episodes, dataset.num_frames, dataset.seed,
            ", ".join(f"{k}={v}" for k, v in dataset.config.as_dict().items()),
        )
        return self.view, eval_dataset

    def _streaming_dataset(
        self,
        cfg: Any,
        episodes: Any,
        delta_timestamps: Any = None,
        rename_map: Any = None,
    ) -> StreamingLeRobotDataset:
        """The training dataset as LeRobot's ``make_dataset`` would build it from ``cfg``, streaming."""
        from lerobot.transforms import ImageTransforms

        enabled = cfg.dataset.image_transforms.enable
        return StreamingLeRobotDataset(
            cfg.dataset.repo_id,
            root=cfg.dataset.root,
            episodes=episodes,
            image_transforms=ImageTransforms(cfg.dataset.image_transforms) if enabled else None,
            delta_timestamps=delta_timestamps,
            tolerance_s=cfg.tolerance_s,
            revision=cfg.dataset.revision,
            max_num_shards=max(1, int(cfg.num_workers)),
            seed=cfg.seed,
            return_uint8=True,
            repo_type=cfg.dataset.repo_type,
            config=StreamingConfig(**self._options(cfg)),
            rename_map=rename_map,
        )

    def _make_mixture(self, cfg: Any) -> tuple[TrainerDataset, None]:
        """A mixture (``--dataset.repo_id='["A","B"]'``, LeRobot's list spelling, which its parser reads
        as a list): one :class:`StreamingLeRobotDataset` over every dataset. The trainer's metadata is
        LeRobot's ``LeRobotDatasetMetadata`` of the first dataset carrying the mixture's features (renamed,
        the shared ones) and its stats aggregated over every dataset as LeRobot's ``aggregate_stats``
        does, so the policy's normalisation covers the mixture."""
        from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
        from lerobot.datasets.factory import resolve_delta_timestamps

        if cfg.dataset.eval_split:
            raise ConfigError("--dataset.eval_split holds out episodes of one dataset: it is not supported for a mixture")
        first = MixtureRequest.of(
            cfg.dataset.repo_id, cfg.dataset.root, cfg.dataset.revision, cfg.dataset.repo_type
        ).datasets[0]  # LeRobot's metadata of the first dataset holds the mixture's for the trainer
        saved = self._saved_state(cfg)
        rename_map = self.rename_map if self.rename_map is not None else (saved or {}).get(RENAME_MAP_KEY)
        dataset = self._streaming_dataset(cfg, cfg.dataset.episodes, rename_map=rename_map)
        self.rename_map = rename_map
        meta = LeRobotDatasetMetadata(first.repo_id, root=first.root, revision=first.revision, repo_type=first.repo_type)
        mixture = dataset.meta
        assert isinstance(mixture, MixtureMeta)
        meta.info.features = {key: dict(feature) for key, feature in mixture.features.items()}
        meta.info.total_episodes, meta.info.total_frames = mixture.total_episodes, mixture.total_frames
        meta.stats = None if mixture.stats is None else {
            key: {stat: np.asarray(value) for stat, value in values.items()} for key, values in mixture.stats.items()
        }
        apply_delta_timestamps(dataset, resolve_delta_timestamps(cfg.trainable_config, meta))
        self._use_imagenet_stats(cfg, [meta])
        self.view = TrainerDataset(dataset, meta)
        logger.info(
            "streaming a mixture of %d datasets, %d episodes, %d frames with lerobot_nodes (seed %s, %s): %s",
            len(mixture.parts), dataset.num_episodes, dataset.num_frames, dataset.seed,
            ", ".join(f"{k}={v}" for k, v in dataset.config.as_dict().items()),
            ", ".join(f"[{i}] {name}" for i, name in enumerate(mixture.names)),
        )
        return self.view, None

    @staticmethod
    def _use_imagenet_stats(cfg: Any, metas: Iterable[Any]) -> None:
        """ImageNet's stats for every camera but depth ones, when ``--dataset.use_imagenet_stats`` (as LeRobot's make_dataset)."""
        from lerobot.utils.constants import IMAGENET_STATS

        if not cfg.dataset.use_imagenet_stats:
            return
        for stats_of in metas:
            for key in stats_of.camera_keys:
                if key in getattr(stats_of, "depth_keys", ()):
                    continue
                for stats_type, stats in IMAGENET_STATS.items():
                    stats_of.stats[key][stats_type] = torch.tensor(stats, dtype=torch.float32)

    def _options(self, cfg: Any) -> dict[str, Any]:
        """The streaming options: the flags given, else (on resume) those the checkpoint was made with."""
        saved = self._saved_state(cfg)
        options = dict(saved.get("streaming", {})) if saved else {}
        options.pop("max_num_shards", None)
        options.update(self.streaming_options)
        return options

    def _saved_state(self, cfg: Any) -> dict[str, Any] | None:
        if not cfg.resume or cfg.checkpoint_path is None:
            return None
        rank, _ = get_rank_and_world_size()
        path = Path(cfg.checkpoint_path) / TRAINING_STATE_DIR / loader_state_file(rank)
        if not path.is_file():
            return None
        try:
            payload = torch.load(io.BytesIO(path.read_bytes()), weights_only=False)
        except Exception as exc:  # torch.load fails in many ways on a damaged file
            raise ConfigError(f"cannot read the streaming loader state {path}: {str(exc).strip().splitlines()[0]}") from exc
        if not isinstance(payload, dict) or payload.get("version") != LOADER_STATE_VERSION:
            raise ConfigError(f"{path} is not a lerobot_nodes loader state of version {LOADER_STATE_VERSION}")
        payload["path"] = str(path)
        return payload

    # -- Accelerator.prepare -------------------------------------------------------------------
    def is_our_loader(self, candidate: Any) -> bool:
        return self.view is not None and getattr(candidate, "dataset", None) is self.view

    def streaming_loader(self, trainer_loader: Any) -> StreamingTrainLoader:
        """The StatefulDataLoader replacing ``trainer_loader`` (same batch size, workers, collate, pinning),
        restored from the checkpoint on resume."""
        dataset = self.dataset
        assert dataset is not None and self.cfg is not None
        options: dict[str, Any] = {"collate_fn": trainer_loader.collate_fn, "pin_memory": trainer_loader.pin_memory}
        if trainer_loader.num_workers > 0 and trainer_loader.prefetch_factor is not None:
            options["prefetch_factor"] = trainer_loader.prefetch_factor
        loader = streaming_dataloader(
            dataset, batch_size=trainer_loader.batch_size, num_workers=trainer_loader.num_workers, **options
        )
        start_step = self._restore(loader, dataset) if self.cfg.resume else 0
        self.loader = StreamingTrainLoader(loader, dataset, start_step, self.record)
        return self.loader

    def _restore(self, loader: Any, dataset: StreamingLeRobotDataset) -> int:
        step_file = Path(self.cfg.checkpoint_path) / TRAINING_STATE_DIR / TRAINING_STEP_FILE
        try:
            training_step = json.loads(step_file.read_text())
        except (OSError, ValueError) as error:
            raise ConfigError(f"cannot read LeRobot's {step_file}: {error}") from None
        step = int(training_step["step"])
        if step == 0:
            return 0
        saved = self._saved_state(self.cfg)
        current = {"batch_size": loader_batch_size(loader), "num_workers": loader.num_workers, "world_size": dataset.world_size}
        if saved is not None:
            changed = {k: (saved[k], v) for k, v in current.items() if saved.get(k) != v}
            if saved.get("step") != step:
                changed["step"] = (saved.get("step"), step)
            if not changed:
                loader.load_state_dict(saved["dataloader"])
                logger.info("resuming the streaming order exactly after step %d from %s", step, saved["path"])
                return step
            details = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
            logger.warning("%s cannot be resumed exactly (%s): resuming by step offset instead", saved["path"], details)
        else:
            logger.warning(
                "no %s in %s: resuming the streaming order by step offset (exact with the same batch size, world size "
                "and --num_workers)", loader_state_file(dataset.rank), step_file.parent,
            )
        dataset.resume_from_step(
            step,
            int(training_step.get("batch_size") or loader_batch_size(loader)),
            int(saved["num_workers"]) if saved else loader.num_workers,
            world_size=training_step.get("num_processes"),
            identity=saved.get("dataset") if saved else None,  # the checkpointed run's worker split, and a check
        )
        return step

    # -- should_save_checkpoint ----------------------------------------------------------------
    def save(self, step: int) -> None:
        """Write this rank's loader state into the checkpoint folder of ``step`` (atomically)."""
        if self.loader is None or self.cfg is None or not self.cfg.save_checkpoint:
            return
        from lerobot.common.train_utils import get_step_checkpoint_dir

        dataset = self.loader.dataset
        folder = get_step_checkpoint_dir(Path(self.cfg.output_dir), self.cfg.steps, step) / TRAINING_STATE_DIR
        payload = {
            "version": LOADER_STATE_VERSION,
            "step": step,
            "batch_size": loader_batch_size(self.loader),
            "num_workers": self.loader.num_workers,
            "world_size": dataset.world_size,
            "seed": dataset.seed,
            "dataset": dataset.checkpoint_identity(),
            "streaming": dataset.config.as_dict(),
            RENAME_MAP_KEY: self.rename_map,  # not in LeRobot's train_config.json: a resumed mixture reads it here
            "dataloader": self.loader.state_dict(),
        }
        with atomic_write(folder / loader_state_file(dataset.rank)) as stream:
            torch.save(payload, stream)

    # -- MetricsTracker -------------------------------------------------------------------------
    def metrics_line(self) -> str | None:
        dataset = self.dataset
        return dataset.metrics.report().line() if dataset is not None and self.loader is not None else None

    def metrics_dict(self) -> dict[str, float]:
        dataset = self.dataset
        if dataset is None or self.loader is None:
            return {}
        report = dataset.metrics.report()
        values = {
            "samples_per_s": report.samples_per_second,
            **{f"batch_wait_{k}_s": v for k, v in report.batch_wait_s.items()},
            "refill_stalls": report.refill_stalls,
            "refill_stall_s": report.refill_stall_seconds,
            "bytes_fetched": report.bytes_fetched,
            "bytes_planned": report.bytes_planned,
            "reserved_bytes": report.reserved_bytes,
            "resident_bytes": report.resident_bytes,
            "peak_reserved_bytes": report.peak_reserved_bytes,
            "decode_ms_per_frame": report.decode_ms_per_frame,
            "http_requests": report.http_requests,
            "http_retries": report.http_retries,
        }
        return {STREAMING_PREFIX + k: float(v) for k, v in values.items()}

    # -- end of run ----------------------------------------------------------------------------
    def finish(self, succeeded: bool) -> None:
        """Print the end-of-run report (rank 0, after a successful run), then stop the workers."""
        dataset = self.dataset
        if dataset is None:
            return
        if succeeded and self.loader is not None and dataset.rank == 0:
            print("end of run (lerobot_nodes streaming):")
            print(dataset.metrics.report().table())
        if self.loader is not None:
            shutdown_dataloader(self.loader.loader)
        dataset.close()
        dataset.counters.close()


def _accelerator_class(base: type, session: TrainingSession) -> type:
    """``accelerate.Accelerator`` whose ``prepare`` swaps the trainer's DataLoader for the streaming one."""

    class StreamingAccelerator(base):  # type: ignore[misc,valid-type]
        def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
            ours = [session.is_our_loader(arg) for arg in args]
            if not any(ours):
                return super().prepare(*args, device_placement=device_placement)
            others = [arg for arg, mine in zip(args, ours, strict=True) if not mine]
            placement = None
            if device_placement is not None:
                placement = [p for p, mine in zip(device_placement, ours, strict=True) if not mine]
            prepared: Any = super().prepare(*others, device_placement=placement) if others else ()
            prepared = [prepared] if len(others) == 1 else list(prepared)
            result = [session.streaming_loader(arg) if mine else prepared.pop(0) for arg, mine in zip(args, ours, strict=True)]
            return result[0] if len(result) == 1 else tuple(result)

    StreamingAccelerator.__name__ = StreamingAccelerator.__qualname__ = base.__name__
    return StreamingAccelerator


def _metrics_tracker_class(base: type, session: TrainingSession) -> type:
    """LeRobot's ``MetricsTracker`` whose training log line and wandb dict carry the streaming metrics."""

    class StreamingMetricsTracker(base):  # type: ignore[misc,valid-type]
        def _is_training(self) -> bool:
            return "dataloading_s" in self.metrics  # the eval trackers time no data loading

        def __str__(self) -> str:
            text = str(super().__str__())
            line = session.metrics_line() if self._is_training() else None
            return f"{text} | streaming: {line}" if line else text

        def to_dict(self, use_avg: bool = True) -> dict[str, Any]:
            values = dict(super().to_dict(use_avg))
            if self._is_training():
                values.update(session.metrics_dict())
            return values

    StreamingMetricsTracker.__name__ = StreamingMetricsTracker.__qualname__ = base.__name__
    return StreamingMetricsTracker


@contextlib.contextmanager
def patched_trainer(session: TrainingSession) -> Iterator[Any]:
    """LeRobot's trainer module with :data:`HOOKS` replaced; everything is restored on exit."""
    check_lerobot()
    import accelerate

    trainer = importlib.import_module(TRAINER_MODULE)
    original_datasets = trainer.make_train_eval_datasets
    original_should_save = trainer.should_save_checkpoint

    def make_train_eval_datasets(cfg: Any) -> Any:
        if not cfg.dataset.streaming:
            if session.streaming_options:
                logger.warning(
                    "--dataset.streaming=false: LeRobot's map-style loading runs, the --dataset.streaming_* flags "
                    "(%s) are not used", ", ".join(sorted(session.streaming_options)),
                )
            return original_datasets(cfg)
        return session.make_datasets(cfg)

    def should_save_checkpoint(step: int, save_freq: int, total_steps: int) -> bool:
        decision = bool(original_should_save(step, save_freq, total_steps))
        if decision:
            session.save(step)
        return decision

    replacements = {
        (trainer, "make_train_eval_datasets"): make_train_eval_datasets,
        (trainer, "should_save_checkpoint"): should_save_checkpoint,
        (trainer, "MetricsTracker"): _metrics_tracker_class(trainer.MetricsTracker, session),
        (accelerate, "Accelerator"): _accelerator_class(accelerate.Accelerator, session),
    }
    originals = {key: getattr(*key) for key in replacements}
    for (module, name), value in replacements.items():
        setattr(module, name, value)
    try:
        yield trainer
    finally:
        for (module, name), value in originals.items():
            setattr(module, name, value)


def run_lerobot_train(argv: Sequence[str], streaming_options: dict[str, Any]) -> int:
    """Run LeRobot's ``lerobot-train`` with ``argv`` (every LeRobot flag, unchanged) and the streaming options.

    ``--dataset.streaming=true`` (given, or in the config of a resumed checkpoint) trains on the
    streaming loader; otherwise LeRobot's own loading runs as if this package were not there.
    """
    session = TrainingSession(streaming_options)
    saved_argv = sys.argv
    succeeded = False
    try:
        with patched_trainer(session) as trainer:
            sys.argv = ["lerobot-train", *argv]  # LeRobot's parser reads sys.argv
            trainer.main()
        succeeded = True
    finally:
        sys.argv = saved_argv
        session.finish(succeeded)
    return 0
