"""Opening a mixture from LeRobot's list arguments: ``repo_id=[...]``, ``root=[...]``, ``revision=[...]``.

Each dataset is opened exactly as it would be alone (:func:`~lerobot_nodes.sources.resolve.open_source`,
the node's byte cache for remote stores, :func:`~lerobot_nodes.format.meta.load_meta`), so any mix
of Hub repos, buckets, fsspec URLs and local folders works; then they become one
:class:`~lerobot_nodes.format.mixture.MixtureMeta` over a
:class:`~lerobot_nodes.sources.mixture.MixtureSource`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..sources import ByteSource
from ..sources.http_range import HttpOptions
from ..sources.mixture import MixtureSource
from ..sources.range_cache import ByteRangeCache
from ..sources.resolve import open_source
from .meta import DatasetMeta, load_meta, select_episodes
from .mixture import MixtureMeta, build_mixture_meta

RootArgument = str | os.PathLike[str] | ByteSource


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def is_mixture(repo_id: Any, root: Any) -> bool:
    """Whether LeRobot's ``repo_id`` / ``root`` arguments name several datasets (a list, even of one)."""
    return _is_list(repo_id) or _is_list(root)


@dataclass(frozen=True)
class DatasetRequest:
    """One dataset of a mixture, as LeRobot's arguments name it."""

    repo_id: str | None
    root: RootArgument | None
    revision: str | None
    repo_type: str

    @property
    def name(self) -> str:
        """How messages, ``episodes=`` and ``rename_map`` name it: its ``repo_id``, else its root."""
        if self.repo_id is not None:
            return self.repo_id
        if isinstance(self.root, ByteSource):
            return self.root.url
        return os.fspath(self.root)  # type: ignore[arg-type]


@dataclass(frozen=True)
class MixtureRequest:
    """The datasets of a mixture, from aligned lists (a single value applies to every dataset)."""

    datasets: tuple[DatasetRequest, ...]

    @classmethod
    def of(cls, repo_id: Any, root: Any, revision: Any, repo_type: Any) -> MixtureRequest:
        lists = {
            name: value
            for name, value in (
                ("repo_id", repo_id),
                ("root", root),
                ("revision", revision),
                ("repo_type", repo_type),
            )
            if _is_list(value)
        }
        sizes = {name: len(value) for name, value in lists.items()}
        count = max(sizes.values(), default=0)
        if count == 0:
            raise ConfigError("a mixture needs at least one dataset: repo_id (or root) is an empty list")
        uneven = {name: size for name, size in sizes.items() if size != count}
        if uneven:
            raise ConfigError(
                f"the lists of a mixture must be aligned (one entry per dataset): got lengths "
                f"{', '.join(f'{name}={size}' for name, size in sizes.items())}"
            )

        def entry(value: Any, i: int) -> Any:
            return value[i] if _is_list(value) else value

        if not _is_list(repo_id) and repo_id is not None:
            raise ConfigError(
                f"repo_id={repo_id!r} names one dataset but root is a list: give repo_id as a list too"
            )
        if root is not None and not _is_list(root):
            # LeRobot's MultiLeRobotDataset rule: one root is the folder holding every repo_id.
            if isinstance(root, ByteSource):
                raise ConfigError(
                    "one ByteSource cannot be the root of several datasets: give root as a list"
                )
            parent = os.fspath(root).rstrip("/")
            root = [f"{parent}/{name}" for name in repo_id]
        datasets = []
        for i in range(count):
            request = DatasetRequest(
                entry(repo_id, i), entry(root, i), entry(revision, i), entry(repo_type, i) or "dataset"
            )
            if request.repo_id is None and request.root is None:
                raise ConfigError(f"dataset {i} of the mixture has neither a repo_id nor a root")
            datasets.append(request)
        return cls(tuple(datasets))

    @property
    def names(self) -> list[str]:
        return [dataset.name for dataset in self.datasets]


def select_mixture_episodes(meta: MixtureMeta, episodes: Mapping[str, Sequence[int]] | None) -> list[int]:
    """The global episodes of ``episodes`` (``{dataset name: its episodes}``; a dataset not named, or
    ``None``, selects all of its episodes), each dataset's selection checked as LeRobot checks one."""
    if episodes is not None and not isinstance(episodes, Mapping):
        raise ConfigError(
            f"episodes for a mixture is a {{dataset: [episodes]}} dict (as LeRobot's MultiLeRobotDataset takes it), "
            f"got {type(episodes).__name__}; datasets are {list(meta.names)}"
        )
    chosen = dict(episodes or {})
    unknown = sorted(set(chosen) - set(meta.names))
    if unknown:
        raise ConfigError(
            f"episodes names {unknown}, which are not datasets of this mixture ({list(meta.names)})"
        )
    selected = []
    for i, (name, part) in enumerate(zip(meta.names, meta.parts, strict=True)):
        local = select_episodes(part, chosen.get(name))
        selected.append(np.asarray(local, dtype=np.int64) + int(meta.episode_offsets[i]))
    return np.concatenate(selected).tolist()


def open_mixture(
    request: MixtureRequest,
    episodes: Mapping[str, Sequence[int]] | Sequence[int] | None,
    rename_map: Mapping[str, Mapping[str, str]] | None,
    *,
    token: str | bool | None,
    http: HttpOptions,
    byte_cache: Callable[[], ByteRangeCache | None],
) -> tuple[MixtureSource, MixtureMeta, list[int]]:
    """The source, metadata and selected global episodes of a mixture. ``byte_cache`` makes the
    node's disk byte cache (called once, when some dataset is remote)."""
    sources: list[ByteSource] = []
    metas: list[DatasetMeta] = []
    cache: list[ByteRangeCache | None] = []
    for dataset in request.datasets:
        source = open_source(
            dataset.root,
            repo_id=dataset.repo_id,
            revision=dataset.revision,
            repo_type=dataset.repo_type,
            token=token,
            http=http,
        )
        if source.caches_bytes:
            if not cache:
                cache.append(byte_cache())
            source.use_byte_cache(cache[0])
        sources.append(source)
        # Files are checked for the episodes a rank reads, when it opens their indexes (dataset_doctor.open_checked).
        metas.append(load_meta(source, repo_id=dataset.repo_id, check_files=False))
    mixture_source = MixtureSource(sources)
    if cache:
        mixture_source.use_byte_cache(cache[0])  # the remote datasets' cache, which the mixture reports
    meta = build_mixture_meta(mixture_source, request.names, metas, rename_map)
    return mixture_source, meta, select_mixture_episodes(meta, episodes)  # type: ignore[arg-type]
