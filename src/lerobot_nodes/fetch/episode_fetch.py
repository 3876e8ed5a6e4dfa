"""The I/O of one episode: its Parquet rows and one mini-MP4 clip per camera, by byte range.

:class:`EpisodeFetcher` plans (from the Parquet footer and the video index, no payload read)
and fetches (range reads, then Parquet decode and clip materialisation). The exact byte cost
of an episode, the sum of its clip sizes, is known from the plans before anything is fetched.

Video indexes come from an injectable :data:`VideoIndexProvider`: by default the sidecar's
``open_video_indexes`` (cached, lock-protected builds) when that module is available, else one
``mp4.read_index_from_source`` per file.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import EpisodeFetchError, LeRobotNodesError
from ..format.episode_data import EpisodeData
from ..format.meta import DatasetMeta
from ..format.parquet import EpisodeRowsPlan, EpisodeTableReader
from ..mp4.index import VideoIndex
from ..mp4.layout import Clip
from ..mp4.plan import clip_gop_starts, plan_clip
from ..sources import ByteRange, ByteSource
from .row_groups import DEFAULT_MAX_BYTES, RowsRead, SharedRowGroups

VideoIndexProvider = Callable[[Sequence[str]], Mapping[str, VideoIndex]]
"""``video paths -> {path: index}``: opens the indexes of the given video files."""

ClipMaterializer = Callable[[Any, list[bytes]], bytes]
"""``(plan, fetched chunks of plan.byte_ranges) -> clip bytes``."""


def default_index_provider(source: ByteSource, meta: DatasetMeta, lock_timeout_s: float = 1800.0) -> VideoIndexProvider:
    """The sidecar's cached indexes when available, else indexes read from each MP4's ``moov``."""
    try:
        from ..sidecar import open_video_indexes
    except ImportError:
        return direct_index_provider(source)

    def from_sidecar(paths: Sequence[str]) -> Mapping[str, VideoIndex]:
        return open_video_indexes(source, meta, list(paths), lock_timeout_s=lock_timeout_s)

    return from_sidecar


def preferring_opened(provider: VideoIndexProvider, opened: Mapping[str, VideoIndex]) -> VideoIndexProvider:
    """``provider``, serving the indexes already in ``opened`` without asking it again."""

    def provide(paths: Sequence[str]) -> Mapping[str, VideoIndex]:
        missing = [path for path in paths if path not in opened]
        found: dict[str, VideoIndex] = dict(provider(missing)) if missing else {}
        found.update((path, opened[path]) for path in paths if path in opened)
        return found

    return provide


def direct_index_provider(source: ByteSource) -> VideoIndexProvider:
    """Indexes parsed from each file's ``moov`` (a small head read, then the ``moov``; no cache)."""
    from ..mp4 import read_index_from_source

    def from_moov(paths: Sequence[str]) -> Mapping[str, VideoIndex]:
        return {path: read_index_from_source(source, path) for path in paths}

    return from_moov


def _default_materializer() -> ClipMaterializer:
    from ..mp4 import materialize_clip

    return materialize_clip


@dataclass(frozen=True)
class ClipRequest:
    """One camera's clip of one episode: where it is, its span and its plan."""

    key: str
    path: str
    from_s: float
    to_s: float
    plan: Any

    @property
    def size(self) -> int:
        return int(self.plan.size)


@dataclass
class EpisodePayload:
    """Everything decoding one episode needs: its rows and one clip per camera."""

    episode: int
    data: EpisodeData
    clips: dict[str, Clip] = field(default_factory=dict)
    """Per camera, the materialised clip with the layout its plan made (decoders need no ``moov`` parse)."""
    clip_starts: dict[str, float] = field(default_factory=dict)
    """``from_timestamp`` of each camera's span: file time = this + episode-relative time."""
    clip_bytes: int = 0
    """Bytes of the materialised clips: what the byte budget counted."""
    planned_bytes: int = 0
    """Bytes the plans said to read (Parquet row groups and clip sample ranges)."""
    fetched_bytes: int = 0
    """Bytes the source actually returned."""


def describe_ranges(ranges: Sequence[ByteRange], limit: int = 3) -> str:
    """``[a, b), [c, d) and 4 more`` for error messages."""
    shown = ", ".join(f"[{start}, {end})" for start, end in ranges[:limit])
    more = f" and {len(ranges) - limit} more" if len(ranges) > limit else ""
    return f"byte ranges {shown}{more}" if ranges else "no byte range"


PLANS_KEPT = 256
"""Episodes whose clip plans an :class:`EpisodeFetcher` keeps (pool, prefetch and admission look-ahead fit)."""


class EpisodeFetcher:
    """Plans and fetches episodes of one dataset; thread-safe.

    ``episodes`` (optional) are the episodes this reader will touch: the first index request
    opens the indexes of all their video files at once (one provider call), so a sidecar is
    looked up once per worker, not once per file; and a data-Parquet row group several of them
    share is read once per epoch, kept (at most ``row_group_bytes``) until the last of them is
    fetched (:class:`~lerobot_nodes.fetch.row_groups.SharedRowGroups`).
    """

    def __init__(
        self,
        source: ByteSource,
        meta: DatasetMeta,
        *,
        episodes: Sequence[int] | None = None,
        index_provider: VideoIndexProvider | None = None,
        materialize: ClipMaterializer | None = None,
        lock_timeout_s: float = 1800.0,
        row_group_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.source = source
        self.meta = meta
        self.video_keys = list(meta.video_keys)
        self.rows = EpisodeTableReader(source, meta)
        self.shared_rows = SharedRowGroups(self.rows, episodes, max_bytes=row_group_bytes)
        self._episodes = list(episodes) if episodes is not None else None
        self._index_provider = index_provider
        self._lock_timeout_s = lock_timeout_s
        self._materialize = materialize
        self._indexes: dict[str, VideoIndex] = {}
        self._lock = threading.Lock()
        # Each episode is planned once: its price (the byte budget), its GOP runs (the schedule)
        # and its fetch use the same plans. Recent episodes only: plans hold their clip headers.
        self._plans: OrderedDict[int, list[ClipRequest]] = OrderedDict()
        self._plans_lock = threading.Lock()

    # -- planning (no payload I/O) --------------------------------------------------------
    def index(self, path: str) -> VideoIndex:
        with self._lock:
            found = self._indexes.get(path)
            if found is not None:
                return found
            provider = self._index_provider
            if provider is None:
                provider = self._index_provider = default_index_provider(self.source, self.meta, self._lock_timeout_s)
            wanted = {path}
            if self._episodes is not None:
                wanted |= set(self.meta.video_files(self._episodes))
            wanted -= set(self._indexes)
            try:
                opened = provider(sorted(wanted))
            except Exception as exc:
                names = sorted(wanted)
                more = f" and {len(names) - 3} more" if len(names) > 3 else ""
                add_context(exc, f"while opening the video indexes of {', '.join(names[:3])}{more}")
                raise
            missing = sorted(wanted - set(opened))
            if missing:
                raise EpisodeFetchError(f"the video index provider returned no index for {', '.join(missing)}")
            self._indexes.update(opened)
            return self._indexes[path]

    def clip_requests(self, episode: int) -> list[ClipRequest]:
        """One planned clip per camera of ``episode``, from the indexes alone; planned once and
        kept for the last :data:`PLANS_KEPT` episodes asked for."""
        with self._plans_lock:
            planned = self._plans.get(episode)
            if planned is not None:
                self._plans.move_to_end(episode)
                return planned
        requests = self._plan_clips(episode)
        with self._plans_lock:
            self._plans[episode] = requests
            while len(self._plans) > PLANS_KEPT:
                self._plans.popitem(last=False)
        return requests

    def _plan_clips(self, episode: int) -> list[ClipRequest]:
        requests = []
        for key in self.video_keys:
            path = self.meta.video_file(episode, key)
            from_s, to_s = self.meta.video_span(episode, key)
            index = self.index(path)
            try:
                plan = plan_clip(index, from_s, to_s)
            except LeRobotNodesError as exc:
                add_context(exc, f"episode {episode}, camera {key}: planning its clip [{from_s}, {to_s}) s of {path}")
                raise
            requests.append(ClipRequest(key=key, path=path, from_s=from_s, to_s=to_s, plan=plan))
        return requests

    def gop_starts(self, episode: int) -> list[Any]:
        """Per camera, the episode frames where a new GOP starts (see ``mp4.plan.gop_starts``); indexes only."""
        return [clip_gop_starts(self.index(request.path), request.plan) for request in self.clip_requests(episode)]

    def cost(self, episode: int) -> int:
        """Exact bytes of the materialised clips of ``episode`` (what the byte budget counts)."""
        return sum(request.size for request in self.clip_requests(episode))

    # -- fetching ----------------------------------------------------------------------------
    def fetch(self, episode: int) -> EpisodePayload:
        """Range-read the rows and every camera's clip concurrently, then decode the rows and
        materialise the clips. A failed read raises the first error in that order (rows, cameras).

        Row groups the episode shares with other episodes of this reader come from (or go to)
        :attr:`shared_rows`: each is read once per epoch."""
        rows_plan = self._rows_plan(episode)
        requests = self.clip_requests(episode) if self.video_keys else []

        def read_rows() -> RowsRead:
            return self.shared_rows.fetch(
                episode, rows_plan, lambda path, ranges: self._read(episode, "Parquet rows", path, ranges)
            )

        def read_clip(request: ClipRequest) -> Callable[[], list[bytes]]:
            return lambda: self._read(episode, f"the {request.key} clip", request.path, list(request.plan.byte_ranges))

        reads: list[Callable[[], Any]] = [read_rows, *(read_clip(r) for r in requests)]
        rows_read, *clips_chunks = self._run_all(reads)
        try:
            data = self.rows.decode_pieces(episode, rows_plan, rows_read.pieces, self.rows.footer(rows_plan.path))
        except Exception as exc:
            raise EpisodeFetchError(
                f"episode {episode}: decoding its Parquet rows from {rows_plan.path} "
                f"({describe_ranges(rows_plan.byte_ranges)}, row groups {rows_plan.row_groups}) failed: {exc}"
            ) from exc
        payload = EpisodePayload(
            episode=episode, data=data, planned_bytes=rows_read.read_bytes, fetched_bytes=rows_read.read_bytes
        )
        if requests:
            materialize = self._materialize or _default_materializer()
            for request, clip_chunks in zip(requests, clips_chunks, strict=True):
                ranges = list(request.plan.byte_ranges)
                try:
                    clip = Clip(materialize(request.plan, clip_chunks), request.plan.layout)
                except Exception as exc:
                    raise EpisodeFetchError(
                        f"episode {episode}: building the {request.key} clip from {request.path} "
                        f"({describe_ranges(ranges)}) failed: {exc}"
                    ) from exc
                payload.clips[request.key] = clip
                payload.clip_starts[request.key] = request.from_s
                payload.clip_bytes += len(clip)
                payload.planned_bytes += sum(end - start for start, end in ranges)
                payload.fetched_bytes += sum(len(chunk) for chunk in clip_chunks)
        return payload

    def _run_all(self, reads: list[Callable[[], Any]]) -> list[Any]:
        """Every read, concurrently when there are several (one thread each, joined before
        returning): an episode's latency is its slowest file, not their sum. Results (and the
        first error) in the order given."""
        if len(reads) == 1:
            return [reads[0]()]
        with ThreadPoolExecutor(max_workers=len(reads), thread_name_prefix="lerobot-nodes-fetch-file") as pool:
            futures = [pool.submit(read) for read in reads]
            return [future.result() for future in futures]

    def _rows_plan(self, episode: int) -> EpisodeRowsPlan:
        try:
            return self.rows.plan(episode)
        except Exception as exc:
            path = self.meta.data_file(episode)
            raise EpisodeFetchError(f"episode {episode}: planning its Parquet rows in {path} failed: {exc}") from exc

    def _read(self, episode: int, what: str, path: str, ranges: list[ByteRange]) -> list[bytes]:
        if not ranges:
            return []
        try:
            return self.source.read_ranges(path, ranges)
        except Exception as exc:
            raise EpisodeFetchError(
                f"episode {episode}: reading {what} from {self.source.url.rstrip('/')}/{path} "
                f"({describe_ranges(ranges)}) failed: {exc}"
            ) from exc


def add_context(exc: BaseException, context: str) -> None:
    """Attach ``context`` to ``exc`` as a note, keeping its type (e.g. ``FrameTimestampError``)."""
    if hasattr(exc, "add_note"):
        exc.add_note(context)
