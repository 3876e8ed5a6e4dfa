"""The I/O of a mixture's episodes: each routed to its dataset's own :class:`EpisodeFetcher`.

A global episode of a :class:`~lerobot_nodes.format.mixture.MixtureMeta` is planned and fetched by
the fetcher of the dataset it belongs to, with that dataset's source, metadata (its kept features,
its own names), MP4 indexes and sidecars, exactly as when the dataset is read alone. The payload
then travels under the mixture's names: its rows are renamed and tagged with the dataset index
and task offset (:class:`~lerobot_nodes.format.mixture.MixtureEpisodeData`), its clips keyed by
the mixture's camera names. Plans, prices and GOP runs are the dataset fetcher's, computed once.

:func:`open_episode_fetcher` is the one place a graph (or a resume replay) gets its fetcher:
an :class:`EpisodeFetcher` for one dataset, a :class:`MixtureFetcher` for a mixture.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from ..format.meta import DatasetMeta
from ..format.mixture import MixtureMeta, mixture_episode_data, split_part_path
from ..mp4.index import VideoIndex
from ..sources import ByteSource
from ..sources.mixture import MixtureSource
from .episode_fetch import (
    EpisodeFetcher,
    EpisodePayload,
    VideoIndexProvider,
    default_index_provider,
    preferring_opened,
)


class MixtureFetcher:
    """Plans and fetches the global episodes of a mixture; thread-safe.

    ``episodes`` (global) are the ones this reader touches: each dataset's fetcher is told its
    own share (its indexes opened together, its shared row groups kept), and is made on first use,
    so a reader holds fetchers only for the datasets it reads. ``opened_indexes`` are keyed by
    mixture paths (``"<i>/videos/..."``).
    """

    def __init__(
        self,
        source: MixtureSource,
        meta: MixtureMeta,
        *,
        episodes: Sequence[int] | None = None,
        opened_indexes: Mapping[str, VideoIndex] | None = None,
        lock_timeout_s: float = 1800.0,
    ) -> None:
        self.source = source
        self.meta = meta
        self.video_keys = list(meta.video_keys)
        count = len(meta.parts)
        self._episodes: list[list[int] | None] = (
            [local.tolist() for local in meta.split_episodes(episodes)]
            if episodes is not None
            else [None] * count
        )
        self._opened: list[dict[str, VideoIndex]] = [{} for _ in range(count)]
        for path, index in (opened_indexes or {}).items():
            part, rest = split_part_path(path)
            self._opened[part][rest] = index
        self._lock_timeout_s = lock_timeout_s
        self._fetchers: list[EpisodeFetcher | None] = [None] * count
        self._lock = threading.Lock()

    def part(self, index: int) -> EpisodeFetcher:
        """The fetcher of dataset ``index`` (made on first use)."""
        with self._lock:
            fetcher = self._fetchers[index]
            if fetcher is None:
                source, meta = self.source.parts[index], self.meta.parts[index]
                provider: VideoIndexProvider = default_index_provider(source, meta, self._lock_timeout_s)
                if self._opened[index]:
                    provider = preferring_opened(provider, self._opened[index])
                fetcher = self._fetchers[index] = EpisodeFetcher(
                    source,
                    meta,
                    episodes=self._episodes[index],
                    index_provider=provider,
                    lock_timeout_s=self._lock_timeout_s,
                )
            return fetcher

    def index(self, path: str) -> VideoIndex:
        """The MP4 index of mixture path ``path``."""
        part, rest = split_part_path(path)
        return self.part(part).index(rest)

    def gop_starts(self, episode: int) -> list[Any]:
        part, local = self.meta.part_of(episode)
        return self.part(part).gop_starts(local)

    def cost(self, episode: int) -> int:
        part, local = self.meta.part_of(episode)
        return self.part(part).cost(local)

    def fetch(self, episode: int) -> EpisodePayload:
        """The payload of global ``episode``, under the mixture's names."""
        part, local = self.meta.part_of(episode)
        payload = self.part(part).fetch(local)
        columns = self.meta.columns[part]
        data = mixture_episode_data(payload.data, columns, part, self.meta.parts[part].tasks)
        clips = {columns.mixture_name(key) or key: clip for key, clip in payload.clips.items()}
        starts = {columns.mixture_name(key) or key: start for key, start in payload.clip_starts.items()}
        return dataclasses.replace(payload, episode=int(episode), data=data, clips=clips, clip_starts=starts)


AnyEpisodeFetcher = EpisodeFetcher | MixtureFetcher


def open_episode_fetcher(
    source: ByteSource,
    meta: DatasetMeta,
    *,
    episodes: Sequence[int] | None,
    index_provider: VideoIndexProvider | None = None,
    opened_indexes: Mapping[str, VideoIndex] | None = None,
    lock_timeout_s: float = 1800.0,
) -> AnyEpisodeFetcher:
    """The fetcher of ``episodes`` of ``meta``: the dataset's own (``index_provider``, default the
    sidecar's indexes, serving ``opened_indexes`` as they are), or for a mixture one routing to each
    dataset's (which cannot take an injected provider: each dataset has its own)."""
    if isinstance(meta, MixtureMeta):
        if index_provider is not None or not isinstance(source, MixtureSource):
            raise ConfigError(
                "a mixture is read through its MixtureSource with each dataset's own index provider"
            )
        return MixtureFetcher(
            source, meta, episodes=episodes, opened_indexes=opened_indexes, lock_timeout_s=lock_timeout_s
        )
    provider = index_provider
    if provider is None and opened_indexes:
        provider = preferring_opened(default_index_provider(source, meta, lock_timeout_s), opened_indexes)
    return EpisodeFetcher(
        source, meta, episodes=episodes, index_provider=provider, lock_timeout_s=lock_timeout_s
    )
