"""Several LeRobot v3 datasets as one: the metadata of a mixture.

A mixture is one virtual dataset whose episodes are the datasets' episodes one after the other:
global episode ``offsets[i] + e`` is episode ``e`` of dataset ``i``. :class:`MixtureMeta` holds
the concatenated episode table (numpy columns, no Python object per episode), so the sharder,
the pool sampler, the byte budget and resume work on global episodes as they do on one dataset.
Its file paths are those of each dataset prefixed with ``"<i>/"`` (what
:class:`~lerobot_nodes.sources.mixture.MixtureSource` routes); reading an episode's rows and clips
goes through the dataset's own metadata (:attr:`MixtureMeta.parts`).

Features follow LeRobot's ``MultiLeRobotDataset``: each dataset's features are renamed first
(``rename_map``), then only the features every dataset has are kept (the others are dropped with
one log line listing them). Different fps, or a kept feature whose dtype or shape differs between
two datasets, is a :class:`ConfigError` naming both. Stats are aggregated as LeRobot's
``aggregate_stats`` does (:func:`aggregate_stats`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..sources import ByteSource
from .episode_data import EpisodeData
from .meta import DatasetMeta, EpisodeTable, EpisodeTasks, VideoSpans

logger = logging.getLogger("lerobot_nodes.mixture")

REORDERING_CODECS = ("h264", "hevc")
"""Codecs with B-frames: when datasets of a mixture use different codecs for one camera, the
mixture's feature names one of these if any dataset uses it, so settings sized by the codec
(``streaming_graph.open_anchor_runs``) are sized for the most demanding one."""


def part_prefix(index: int) -> str:
    """The path prefix of dataset ``index``'s files in a mixture."""
    return f"{index}/"


def split_part_path(path: str) -> tuple[int, str]:
    """``"<i>/rest"`` -> ``(i, "rest")``; a path without a dataset prefix is a ``ValueError``."""
    head, sep, rest = path.partition("/")
    if not sep or not head.isdigit():
        raise ValueError(
            f"{path!r} is not a mixture path (expected '<dataset index>/<path in that dataset>')"
        )
    return int(head), rest


@dataclass(frozen=True)
class PartColumns:
    """How one dataset's columns become the mixture's: ``renamed`` (its name -> the mixture's, for
    the features kept and renamed) and ``dropped`` (its features the mixture does not have)."""

    renamed: Mapping[str, str]
    dropped: frozenset[str]

    def mixture_name(self, name: str) -> str | None:
        """The mixture's name of this dataset's column ``name`` (None: dropped)."""
        if name in self.dropped:
            return None
        return self.renamed.get(name, name)


@dataclass
class MixtureEpisodeData(EpisodeData):
    """One episode's rows under the mixture's column names, with where it came from.

    ``dataset_index`` is delivered with each sample (as LeRobot's ``MultiLeRobotDataset`` does);
    ``tasks`` are the dataset's own task strings: the rows' ``task_index`` stays the dataset's
    own, as LeRobot returns it, and names one of these.
    """

    dataset_index: int = 0
    tasks: Sequence[str] = ()


def mixture_episode_data(
    data: EpisodeData, columns: PartColumns, dataset_index: int, tasks: Sequence[str]
) -> MixtureEpisodeData:
    """``data`` with its columns renamed and dropped as ``columns`` says (no array is copied)."""
    arrays: dict[str, np.ndarray] = {}
    objects: dict[str, list[Any]] = {}
    order: list[str] = []
    for name in data.column_order:
        target = columns.mixture_name(name)
        if target is None:
            continue
        order.append(target)
        if name in data.arrays:
            arrays[target] = data.arrays[name]
        else:
            objects[target] = data.objects[name]
    return MixtureEpisodeData(
        episode_index=data.episode_index,
        from_index=data.from_index,
        arrays=arrays,
        objects=objects,
        column_order=order,
        dataset_index=dataset_index,
        tasks=tasks,
    )


@dataclass
class MixtureMeta(DatasetMeta):
    """The metadata of a mixture of datasets (see the module docstring).

    ``parts[i]`` is dataset ``i``'s metadata restricted to the kept features (under its own
    names): what reads its files. ``names[i]`` names it in messages and in ``episodes=`` and
    ``rename_map`` dicts; ``columns[i]`` maps its columns to the mixture's; ``episode_offsets``
    (``len(parts) + 1`` entries) bound each dataset's global episodes; ``task_offsets[i]`` is where
    its tasks start in :attr:`tasks`.
    """

    parts: tuple[DatasetMeta, ...] = ()
    names: tuple[str, ...] = ()
    columns: tuple[PartColumns, ...] = ()
    episode_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    task_offsets: tuple[int, ...] = ()
    source_names: tuple[dict[str, str], ...] = ()
    """Per dataset, mixture feature name -> the dataset's own name (every kept feature)."""

    # -- where a global episode lives -------------------------------------------------
    def part_of(self, episode: int) -> tuple[int, int]:
        """``(dataset index, its episode)`` of global ``episode``."""
        e = int(episode)
        if not 0 <= e < int(self.episode_offsets[-1]):
            raise IndexError(f"episode {e} is not in this mixture ({int(self.episode_offsets[-1])} episodes)")
        part = int(np.searchsorted(self.episode_offsets, e, side="right")) - 1
        return part, e - int(self.episode_offsets[part])

    def dataset_indexes(self, episodes: Sequence[int] | np.ndarray) -> np.ndarray:
        """The dataset index of each of ``episodes`` (vectorised)."""
        chosen = np.asarray(episodes, dtype=np.int64)
        return np.searchsorted(self.episode_offsets, chosen, side="right").astype(np.int64) - 1

    def split_episodes(self, episodes: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Per dataset, its local episode ids among the global ``episodes`` (in the order given)."""
        chosen = np.asarray(episodes, dtype=np.int64)
        parts = self.dataset_indexes(chosen)
        return [chosen[parts == i] - int(self.episode_offsets[i]) for i in range(len(self.parts))]

    def dataset_episodes(self, episodes: Sequence[int] | np.ndarray) -> list[list[int]]:
        """Per dataset, its global episode ids among ``episodes`` (in the order given)."""
        return [(local + int(self.episode_offsets[d])).tolist() for d, local in enumerate(self.split_episodes(episodes))]

    # -- file locations (prefixed with the dataset) ------------------------------------
    def data_file(self, episode: int) -> str:
        part, local = self.part_of(episode)
        return part_prefix(part) + self.parts[part].data_file(local)

    def video_file(self, episode: int, video_key: str) -> str:
        part, local = self.part_of(episode)
        return part_prefix(part) + self.parts[part].video_file(local, self.source_names[part][video_key])

    def data_files(self, episodes: Iterable[int] | None = None) -> list[str]:
        chosen = self._split(episodes)
        return sorted(
            part_prefix(i) + path
            for i, local in enumerate(chosen)
            if len(local)
            for path in self.parts[i].data_files(local)
        )

    def video_files(self, episodes: Iterable[int] | None = None) -> list[str]:
        chosen = self._split(episodes)
        return sorted(
            part_prefix(i) + path
            for i, local in enumerate(chosen)
            if len(local)
            for path in self.parts[i].video_files(local)
        )

    def _split(self, episodes: Iterable[int] | None) -> list[Any]:
        if episodes is None:
            return [range(len(part.episodes)) for part in self.parts]
        return [local.tolist() for local in self.split_episodes(list(episodes))]

    def read_episode_columns(self, columns: Sequence[str]) -> Any:
        raise ConfigError(
            "the per-episode columns of meta/episodes are read per dataset of a mixture: use "
            "dataset.meta.parts[i].read_episode_columns(...)"
        )

    def summary(self) -> str:
        lines = [
            f"Mixture of {len(self.parts)} LeRobot datasets, {self.total_episodes} episodes, "
            f"{self.total_frames} frames, fps {self.fps}"
        ]
        for i, (name, part) in enumerate(zip(self.names, self.parts, strict=True)):
            lines.append(f"  [{i}] {name}: {part.total_episodes} episodes, {part.total_frames} frames")
        lines.append(f"  features: {', '.join(self.features)}")
        return "\n".join(lines)


# -- building a mixture -------------------------------------------------------------------


def _renamed_features(name: str, meta: DatasetMeta, renames: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    unknown = sorted(set(renames) - set(meta.features))
    if unknown:
        raise ConfigError(
            f"rename_map for {name} renames {unknown}, which are not features of {name} "
            f"(its features: {sorted(meta.features)})"
        )
    renamed: dict[str, dict[str, Any]] = {}
    for key, feature in meta.features.items():
        target = renames.get(key, key)
        if target in renamed:
            raise ConfigError(f"rename_map for {name} gives two features the name {target!r}")
        renamed[target] = feature
    return renamed


def _codec(feature: Mapping[str, Any]) -> str:
    return str((feature.get("info") or {}).get("video.codec", ""))


def _shared_feature(
    key: str, names: Sequence[str], features: Sequence[Mapping[str, dict[str, Any]]]
) -> dict[str, Any]:
    """The mixture's feature ``key``: the first dataset's, after checking every dataset agrees on
    its dtype and shape (a ``ConfigError`` naming the first two that differ)."""
    first = features[0][key]
    for name, dataset_features in zip(names[1:], features[1:], strict=True):
        other = dataset_features[key]
        for what in ("dtype", "shape"):
            mine = first.get(what)
            theirs = other.get(what)
            if what == "shape":
                mine, theirs = list(mine or ()), list(theirs or ())
            if mine != theirs:
                raise ConfigError(
                    f"feature {key!r} has {what} {mine} in {names[0]} but {theirs} in {name}: datasets of a mixture "
                    "must agree on every shared feature (rename_map aligns names, not shapes)"
                )
    shared = dict(first)
    if first.get("dtype") == "video":
        codecs = [_codec(dataset_features[key]) for dataset_features in features]
        demanding = [codec for codec in codecs if codec in REORDERING_CODECS]
        if demanding and _codec(first) not in REORDERING_CODECS:
            shared["info"] = {**(first.get("info") or {}), "video.codec": demanding[0]}
    return shared


def _concat_tasks(tables: Sequence[EpisodeTasks]) -> EpisodeTasks:
    """Every dataset's episode tasks in one compact table (each dataset's vocabulary appended)."""
    vocabulary: dict[str | None, int] = {}
    ids, lengths = [], []
    for table in tables:
        remap = np.fromiter(
            (vocabulary.setdefault(name, len(vocabulary)) for name in table.names),
            dtype=np.int32,
            count=len(table.names),
        )
        ids.append(remap[table.ids] if len(table.ids) else np.zeros(0, dtype=np.int32))
        lengths.append(np.diff(table.offsets))
    counts = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return EpisodeTasks(offsets, np.concatenate(ids).astype(np.int32, copy=False), list(vocabulary))


def _concat_episodes(
    parts: Sequence[DatasetMeta], source_names: Sequence[Mapping[str, str]], video_keys: Sequence[str]
) -> EpisodeTable:
    lengths = np.concatenate([part.episodes.length for part in parts]).astype(np.int64, copy=False)
    to_index = np.cumsum(lengths)
    videos = {}
    for key in video_keys:
        spans = [part.episodes.videos[names[key]] for part, names in zip(parts, source_names, strict=True)]
        videos[key] = VideoSpans(
            chunk_index=np.concatenate([s.chunk_index for s in spans]),
            file_index=np.concatenate([s.file_index for s in spans]),
            from_timestamp=np.concatenate([s.from_timestamp for s in spans]),
            to_timestamp=np.concatenate([s.to_timestamp for s in spans]),
        )
    return EpisodeTable(
        episode_index=np.arange(len(lengths), dtype=np.int64),
        length=lengths,
        dataset_from_index=to_index - lengths,
        dataset_to_index=to_index,
        data_chunk_index=np.concatenate([part.episodes.data_chunk_index for part in parts]),
        data_file_index=np.concatenate([part.episodes.data_file_index for part in parts]),
        tasks=_concat_tasks([part.episodes.tasks for part in parts]),
        videos=videos,
    )


def build_mixture_meta(
    source: ByteSource,
    names: Sequence[str],
    metas: Sequence[DatasetMeta],
    rename_map: Mapping[str, Mapping[str, str]] | None = None,
) -> MixtureMeta:
    """The metadata of the mixture of ``metas`` (named ``names``, read through ``source``, a
    :class:`~lerobot_nodes.sources.mixture.MixtureSource` over their sources in the same order).

    ``rename_map``: per dataset name, ``{its feature name: the mixture's name}``.
    """
    if len(metas) < 1 or len(names) != len(metas):
        raise ConfigError(
            f"a mixture needs one name per dataset, got {len(names)} names for {len(metas)} datasets"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"the datasets of a mixture must be distinct, got {list(names)}")
    renames = dict(rename_map or {})
    unknown = sorted(set(renames) - set(names))
    if unknown:
        raise ConfigError(
            f"rename_map names {unknown}, which are not datasets of this mixture ({list(names)})"
        )
    for name, meta in zip(names[1:], metas[1:], strict=True):
        if meta.fps != metas[0].fps:
            raise ConfigError(
                f"{names[0]} is recorded at {metas[0].fps} fps but {name} at {meta.fps} fps: the datasets of a "
                "mixture must share one fps"
            )
    renamed = [
        _renamed_features(name, meta, renames.get(name, {})) for name, meta in zip(names, metas, strict=True)
    ]
    shared_keys = [key for key in renamed[0] if all(key in features for features in renamed[1:])]
    if not shared_keys:
        raise ConfigError(f"the datasets {list(names)} have no feature in common")
    features = {key: _shared_feature(key, names, renamed) for key in shared_keys}
    dropped_by_dataset = {
        name: sorted(set(features_i) - set(features)) for name, features_i in zip(names, renamed, strict=True)
    }
    dropped_by_dataset = {name: keys for name, keys in dropped_by_dataset.items() if keys}
    if dropped_by_dataset:
        listed = "; ".join(f"{name}: {', '.join(keys)}" for name, keys in dropped_by_dataset.items())
        logger.warning("features not shared by every dataset of the mixture are dropped (%s)", listed)
    parts, columns, source_names = [], [], []
    for name, meta in zip(names, metas, strict=True):
        to_mixture = {key: renames.get(name, {}).get(key, key) for key in meta.features}
        kept = {key: f for key, f in meta.features.items() if to_mixture[key] in features}
        parts.append(dataclasses.replace(meta, info={**meta.info, "features": kept}))
        columns.append(
            PartColumns(
                renamed={key: target for key, target in to_mixture.items() if target != key and key in kept},
                dropped=frozenset(key for key in meta.features if key not in kept),
            )
        )
        source_names.append({to_mixture[key]: key for key in kept})
    video_keys = [key for key, f in features.items() if f["dtype"] == "video"]
    episodes = _concat_episodes(parts, source_names, video_keys)
    task_offsets = np.concatenate([[0], np.cumsum([len(meta.tasks) for meta in metas])]).astype(int).tolist()
    tasks = [task for meta in metas for task in meta.tasks]
    episode_offsets = np.zeros(len(metas) + 1, dtype=np.int64)
    np.cumsum([len(meta.episodes) for meta in metas], out=episode_offsets[1:])
    robots = {meta.robot_type for meta in metas}
    info = {
        **metas[0].info,
        "features": features,
        "total_episodes": int(episode_offsets[-1]),
        "total_frames": int(episodes.length.sum()),
        "total_tasks": len(tasks),
        "robot_type": metas[0].robot_type if len(robots) == 1 else None,
    }
    stats_list = [
        _renamed_stats(meta.stats, renames.get(name, {})) for name, meta in zip(names, metas, strict=True)
    ]
    stats = (
        None
        if any(s is None for s in stats_list)
        else aggregate_stats([s for s in stats_list if s is not None])
    )
    return MixtureMeta(
        source=source,
        info=info,
        episodes=episodes,
        tasks=tasks,
        stats=stats,
        repo_id=None,
        parts=tuple(parts),
        names=tuple(names),
        columns=tuple(columns),
        episode_offsets=episode_offsets,
        task_offsets=tuple(task_offsets[:-1]),
        source_names=tuple(source_names),
    )


# -- stats ------------------------------------------------------------------------------


def _renamed_stats(
    stats: Mapping[str, Mapping[str, np.ndarray]] | None, renames: Mapping[str, str]
) -> dict[str, dict[str, np.ndarray]] | None:
    if stats is None:
        return None
    return {renames.get(key, key): dict(values) for key, values in stats.items()}


_POOLED = frozenset({"min", "max", "mean", "std", "count"})


def aggregate_feature_stats(stats: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One feature's stats over several datasets, weighted by their ``count`` (LeRobot's rule):
    min of the mins, max of the maxes, the count-weighted mean, the pooled std (parallel
    variance), summed counts, and each quantile ``qNN`` every dataset has as a count-weighted mean."""
    means = np.stack([np.asarray(s["mean"], dtype=np.float64) for s in stats])
    variances = np.stack([np.asarray(s["std"], dtype=np.float64) ** 2 for s in stats])
    counts = np.stack([np.asarray(s["count"]) for s in stats])
    total = counts.sum(axis=0)
    weights = counts.astype(np.float64)
    while weights.ndim < means.ndim:
        weights = np.expand_dims(weights, axis=-1)
    mean = (means * weights).sum(axis=0) / total
    variance = ((variances + (means - mean) ** 2) * weights).sum(axis=0) / total
    aggregated = {
        "min": np.min(np.stack([s["min"] for s in stats]), axis=0),
        "max": np.max(np.stack([s["max"] for s in stats]), axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": total,
    }
    for key in stats[0]:
        if key.startswith("q") and key[1:].isdigit() and all(key in s for s in stats):
            quantiles = np.stack([np.asarray(s[key], dtype=np.float64) for s in stats])
            aggregated[key] = (quantiles * weights).sum(axis=0) / total
    return aggregated


def aggregate_stats(
    stats_list: Sequence[Mapping[str, Mapping[str, np.ndarray]]],
) -> dict[str, dict[str, np.ndarray]]:
    """Stats of several datasets as one, as LeRobot's ``aggregate_stats``: every feature any dataset
    has stats for, each aggregated over the datasets that have it (:func:`aggregate_feature_stats`)."""
    keys = list(dict.fromkeys(key for stats in stats_list for key in stats))
    # A feature whose stats lack one of LeRobot's five (hand-written stats.json) cannot be pooled: skipped.
    keys = [key for key in keys if all(set(stats[key]) >= _POOLED for stats in stats_list if key in stats)]
    return {
        key: aggregate_feature_stats([stats[key] for stats in stats_list if key in stats]) for key in keys
    }
