"""Parallel sample assembly and video decode, with an LRU of open clip decoders.

:class:`DecodeMapper` pulls :class:`SampleTask` items and submits each to a pool of
``num_threads`` threads; ``next()`` returns at once a :class:`PendingSample` (the schedule
item and a future of the sample). :class:`~lerobot_nodes.nodes.ordered_buffer.OrderedBuffer`
bounds how many are pending and releases them in schedule order. A sample is assembled with
:func:`lerobot_nodes.sample.assemble.assemble_sample`, the code the map-style reader uses, so both
return the same keys in the same order with the same values. Behind a batcher, a decode thread
makes only the sample's camera frames (:func:`lerobot_nodes.sample.assemble.camera_frames`) and the batcher
gathers the rows of the whole batch (:mod:`lerobot_nodes.sample.batch_rows`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Container, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import torch
from torchdata.nodes import BaseNode

from ..batch_memory.batch_slots import BatchPlace, BatchSlots
from ..fetch.episode_fetch import EpisodePayload, add_context
from ..metrics import MetricsSink, NullMetrics, recorder
from ..mp4.decode import CodecContextPool, DecodedFrameBudget, VideoDecodeError
from ..mp4.layout import Clip
from ..sample.assemble import SampleSpec, assemble_sample, camera_frames
from ..sample.batch_rows import PartialSample
from .pool_sampler import ScheduleItem
from .prefetcher import SampleTask


class ClipDecoderLike(Protocol):
    """A decoder of one clip (``mp4.ClipDecoder`` satisfies it); ``depth=True`` is passed only
    for the depth cameras (``SampleSpec.depth_videos``), ``out`` (a numpy array to write the
    frames into, see :class:`~lerobot_nodes.batch_memory.batch_slots.BatchSlots`) only when batches
    are assembled in place."""

    def frames_at(
        self,
        timestamps_s: Any,
        tolerance_s: float = ...,
        return_uint8: bool = ...,
        *,
        depth: bool = ...,
        out: Any = ...,
    ) -> torch.Tensor: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class BadSample:
    """A schedule item whose episode is bad (``streaming_bad_episodes=skip``): its decode raised
    ``reason`` (:class:`VideoDecodeError`, with the notes naming episode and frame), or ``reason`` is
    None because the episode was already known bad and the item was not decoded.
    :class:`~lerobot_nodes.nodes.bad_episode_filter.BadEpisodeFilter` drops it."""

    episode: int
    frame: int
    reason: str | None = None
    placed: bool = False
    """Whether the item was handed a place in a batch (:class:`BatchSlots`) before it was found bad."""


DecodedSample = dict[str, Any] | PartialSample
"""What a decode thread makes of a schedule item: the whole sample, or its cameras with the rows deferred."""

MaybeBadSample = DecodedSample | BadSample
"""A decode thread's result when bad episodes are skipped: a sample, or the mark of a bad one."""


def error_text(exc: BaseException) -> str:
    """``exc``'s message and its notes (episode, frame, hints) on one line."""
    parts = [str(exc), *getattr(exc, "__notes__", ())]
    # Some notes carry their own leading separator (they read as a continuation after a traceback).
    stripped = (part.strip().removeprefix(";").strip() for part in parts)
    return "; ".join(part for part in stripped if part)

ClipDecoderFactory = Callable[[Clip], ClipDecoderLike]
"""``clip -> decoder``: the clip's bytes are ``clip.data``, its sample layout ``clip.layout``."""


def _default_decoder_factory(
    frame_budget: DecodedFrameBudget,
    window_frames: int | None = None,
    context_pool: CodecContextPool | None = None,
    open_runs: int = 1,
    asked_once: bool = False,
) -> ClipDecoderFactory:
    """``open_runs`` > 1: a short-GOP clip's decoder reads ahead (``ClipDecoder.reads_ahead``) and
    serves all open runs, keeping each run's window and its frame read ahead. ``asked_once``: every
    camera window is the anchor's own frame (``SampleSpec.camera_frames_asked_once``), so a decoder
    drops a frame once returned."""
    from ..mp4 import ClipDecoder
    from ..mp4.decode import DEFAULT_FRAME_CACHE_SIZE, frames_to_keep, reads_ahead

    def factory(clip: Clip) -> ClipDecoderLike:
        kept = DEFAULT_FRAME_CACHE_SIZE if window_frames is None else frames_to_keep(clip.layout, window_frames)
        ahead = open_runs > 1 and reads_ahead(clip.layout)
        if ahead:
            kept = open_runs * (kept + 1)
        return ClipDecoder(
            clip,
            frame_budget=frame_budget,
            frame_cache_size=kept,
            context_pool=context_pool,
            read_ahead=ahead,
            asked_once=asked_once,
        )

    return factory


class DecoderLRU:
    """At most ``capacity`` idle clip decoders, keyed by (episode, camera); thread-safe.

    A decoder is used by one thread at a time, and each (episode, camera) has at most one
    decoder: :meth:`checkout` waits while another thread uses it, then takes the idle one (or
    builds it), so an episode's decoder keeps its position across the episode's anchors
    instead of a second decoder seeking back. :meth:`checkin` returns it and closes the least
    recently used beyond capacity. :meth:`retire` closes an episode's decoders once its last
    sample is decoded. Decoders in use are not counted, so the total is at most ``capacity`` +
    the number of decode threads. ``factory`` receives the :class:`Clip`; decoded frames the
    decoders keep are charged to ``frame_budget`` when the factory is the default one, which
    keeps :func:`~lerobot_nodes.mp4.decode.frames_to_keep` frames per decoder for camera
    windows spanning ``window_frames`` frames (None: the decoder's default), and with ``asked_once``
    (every camera window the anchor's own frame) drop a frame once it is returned.

    ``per_key`` > 1 (the schedule keeps that many anchor runs of an episode open, see
    :func:`~lerobot_nodes.nodes.pool_sampler.interleave_runs`): up to that many idle decoders per
    (episode, camera), one per open run. :meth:`checkout` with ``at`` (the first timestamp asked)
    takes the one that continues there cheapest without a seek (``continues_to``), else opens
    another while the key has fewer than ``per_key``, else takes its least recently used one. With the
    default factory, a short-GOP AV1 clip's decoder reads each GOP ahead
    (:func:`~lerobot_nodes.mp4.decode.reads_ahead`) and keeps ``per_key`` x (window + 1) frames: it
    serves every open run and no second one is opened (a seek there costs the key frame a new
    decoder would decode). Which decoder serves a query only changes what is decoded, never a frame.

    With the default factory, a closed decoder's codec context (flushed, with its RGB converter)
    goes to ``contexts`` (:class:`~lerobot_nodes.mp4.decode.CodecContextPool`) and the next decoder
    of the same codec configuration starts on it instead of opening its own: an episode's decoders
    are closed together when it retires and the next episode opens as many, so with ``per_key``
    decoders per camera that setup would otherwise be paid ``per_key`` times per episode and
    camera. The pool keeps at most ``capacity`` contexts (as many as idle decoders): contexts are
    only created when none is free, so the contexts alive never exceed the most decoders ever open
    at once by more than that.
    """

    def __init__(
        self,
        capacity: int,
        factory: ClipDecoderFactory | None = None,
        frame_budget: DecodedFrameBudget | None = None,
        window_frames: int | None = None,
        per_key: int = 1,
        asked_once: bool = False,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"decoder cache capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._factory = factory
        self.frame_budget = frame_budget if frame_budget is not None else DecodedFrameBudget(None)
        self.window_frames = window_frames
        self.asked_once = asked_once
        self.per_key = max(1, int(per_key))
        self._idle: OrderedDict[tuple[int, str, int], ClipDecoderLike] = OrderedDict()
        # The idle slots of each (episode, camera), least recently used first: a checkout looks at
        # its key's few decoders, not at every idle one.
        self._idle_of: dict[tuple[int, str], OrderedDict[tuple[int, str, int], None]] = {}
        self._busy: set[tuple[int, str]] = set()
        self._retired: set[int] = set()
        self._serial = 0
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)
        self.contexts = CodecContextPool(capacity)
        self.opened = 0
        self._reach: dict[int, int] = {}

    def read_ahead(self, episode: int, frames: int) -> None:
        """The decoders of ``episode`` keep ``frames`` decoded frames more (its anchor runs are stranded:
        ``ScheduleItem.reach``), from the next one opened; forgotten when the episode retires."""
        self._reach[episode] = int(frames)

    def checkout(
        self, episode: int, key: str, clip: Clip, at: float | None = None
    ) -> tuple[tuple[int, str, int], ClipDecoderLike]:
        with self._lock:
            while (episode, key) in self._busy:
                self._returned.wait()
            self._busy.add((episode, key))
            of_key = self._idle_of.get((episode, key))
            mine = list(of_key) if of_key else []  # LRU first
            if mine and (self.per_key == 1 or at is None):
                slot = mine[-1]
                return slot, self._pop(slot)
            if mine:
                best, best_cost = None, None
                for slot in mine:
                    continues = getattr(self._idle[slot], "continues_to", None)
                    cost = continues(at) if continues is not None else None
                    if cost is not None and (best_cost is None or cost < best_cost):
                        best, best_cost = slot, cost
                        if cost == 0:
                            break  # the frame is kept: nothing is cheaper
                if best is not None:
                    return best, self._pop(best)
                if len(mine) >= self.per_key or getattr(self._idle[mine[0]], "reads_ahead", False):
                    return mine[0], self._pop(mine[0])
            self._serial += 1
            slot = (episode, key, self._serial)
            factory = self._factory
            if factory is None:
                factory = self._factory = _default_decoder_factory(
                    self.frame_budget, self.window_frames, self.contexts, self.per_key, self.asked_once
                )
            self.opened += 1
        try:
            decoder = factory(clip)
            reach = self._reach.get(episode, 0)
            keep_ahead = getattr(decoder, "keep_ahead", None)
            if reach and keep_ahead is not None:
                keep_ahead(reach)
            return slot, decoder
        except BaseException:
            with self._lock:
                self._busy.discard((episode, key))
                self._returned.notify_all()
            raise

    def checkin(self, slot: tuple[int, str, int], decoder: ClipDecoderLike) -> None:
        evicted: list[ClipDecoderLike] = []
        with self._lock:
            self._busy.discard((slot[0], slot[1]))
            self._returned.notify_all()
            if slot[0] in self._retired:
                evicted.append(decoder)
            else:
                self._idle[slot] = decoder
                self._idle_of.setdefault((slot[0], slot[1]), OrderedDict())[slot] = None
                while len(self._idle) > self.capacity:
                    evicted.append(self._pop(next(iter(self._idle))))
        for old in evicted:
            old.close()

    def _pop(self, slot: tuple[int, str, int]) -> ClipDecoderLike:
        """Take ``slot``'s idle decoder out of both indexes (the lock held)."""
        of_key = self._idle_of[(slot[0], slot[1])]
        del of_key[slot]
        if not of_key:
            del self._idle_of[(slot[0], slot[1])]
        return self._idle.pop(slot)

    def retire(self, episode: int) -> None:
        with self._lock:
            self._retired.add(episode)
            self._reach.pop(episode, None)
            slots = [slot for slot in self._idle if slot[0] == episode]
            closing = [self._pop(slot) for slot in slots]
        for decoder in closing:
            decoder.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._idle)

    def clear(self, keep_contexts: bool = False) -> None:
        """Close every idle decoder; their codec contexts stay in :attr:`contexts` with
        ``keep_contexts`` (a reset: the next epoch opens as many decoders again), else are dropped."""
        with self._lock:
            closing = list(self._idle.values())
            self._idle.clear()
            self._idle_of.clear()
            self._retired.clear()
            self._reach.clear()
        for decoder in closing:
            decoder.close()
        if not keep_contexts:
            self.contexts.clear()


def _frames_into(
    decoder: ClipDecoderLike, queries: list[float], out: np.ndarray, tolerance_s: float, return_uint8: bool
) -> np.ndarray:
    """RGB frames written into ``out`` when they fit (``out`` returned), else a new array;
    ``ClipDecoder.frames_into`` where the decoder has it, else its ``frames_at(..., out=out)``."""
    into = getattr(decoder, "frames_into", None)
    if into is not None:
        return cast(np.ndarray, into(queries, out, tolerance_s, return_uint8))
    frames = decoder.frames_at(queries, tolerance_s, return_uint8, out=out).numpy()
    same = frames.__array_interface__["data"][0] == out.__array_interface__["data"][0] and frames.shape == out.shape
    return out if same else frames


class SampleAssembler:
    """Builds the sample of one schedule item from its episode payload.

    Video frames are decoded from the episode's clips at file time ``from_timestamp + t``,
    exactly the timestamps the map-style reader decodes. With ``defer_rows`` (batches assembled
    by a :class:`~lerobot_nodes.nodes.batcher.SampleBatcher`, no image transforms) only the
    camera frames are made here: the result is a :class:`~lerobot_nodes.sample.batch_rows.PartialSample`
    whose data columns the batcher gathers for the whole batch.
    """

    def __init__(
        self, spec: SampleSpec, *, tolerance_s: float = 1e-4, return_uint8: bool = False, defer_rows: bool = False
    ) -> None:
        self.spec = spec
        self.tolerance_s = tolerance_s
        self.return_uint8 = return_uint8
        self.defer_rows = defer_rows

    def __call__(
        self,
        payload: EpisodePayload,
        frame: int,
        decoders: DecoderLRU,
        destination: Mapping[str, BatchPlace] | None = None,
    ) -> AssembledSample:
        """The sample of ``frame``; camera frames go into ``destination[key]`` where given (its place in a batch)."""
        counts = AssembledSample(sample={})

        def decode(key: str, timestamps: list[float]) -> torch.Tensor | BatchPlace:
            start = payload.clip_starts[key]
            queries = [start + t for t in timestamps]
            slot, decoder = decoders.checkout(payload.episode, key, payload.clips[key], min(queries))
            before = getattr(decoder, "samples_decoded", None)
            try:
                frames: torch.Tensor | BatchPlace
                if key in self.spec.depth_videos:
                    frames = decoder.frames_at(queries, self.tolerance_s, self.return_uint8, depth=True)
                elif destination is not None and key in destination:
                    place = destination[key]
                    written = _frames_into(decoder, queries, place.frames, self.tolerance_s, self.return_uint8)
                    if written is place.frames:
                        # Deferred rows: the place, which the batcher takes with the whole batch at
                        # once; else the sample's view of the batch storage, which it recognises.
                        frames = place if self.defer_rows else place.tensor()
                    else:
                        frames = torch.from_numpy(written)
                else:
                    frames = decoder.frames_at(queries, self.tolerance_s, self.return_uint8)
            finally:
                decoders.checkin(slot, decoder)
            after = getattr(decoder, "samples_decoded", None)
            counts.frames_delivered += len(timestamps)
            counts.frames_decoded += after - before if before is not None and after is not None else len(timestamps)
            return frames

        if self.defer_rows:
            cameras = camera_frames(self.spec, payload.data, frame, decode)
            counts.sample = PartialSample(self.spec, cameras, payload.data, frame)
        else:
            counts.sample = assemble_sample(self.spec, payload.data, frame, decode)
        return counts


@dataclass
class AssembledSample:
    """A sample (or, with deferred rows, its camera frames), the video frames it returned and the
    frames the codec decoded for it."""

    sample: DecodedSample
    frames_delivered: int = 0
    frames_decoded: int = 0


class PendingSample:
    """A schedule item whose sample is being assembled; :meth:`result` waits for it."""

    __slots__ = ("item", "future")

    def __init__(self, item: ScheduleItem, future: Future[MaybeBadSample]) -> None:
        self.item = item
        self.future = future

    def result(self) -> MaybeBadSample:
        return self.future.result()

    def cancel(self) -> None:
        self.future.cancel()


class DecodeMapper(BaseNode[PendingSample]):
    """Submits every sample task to ``num_threads`` decode threads; returns pending samples.

    Each thread waits for its episode's payload (a *refill stall* when it is not there yet),
    assembles the sample (delta windows with pad masks, video frames through the decoder
    LRU, image transforms) and releases its hold on the episode's bytes, whatever happens.
    With ``slots`` (:class:`BatchSlots`), each sample's camera frames are written into its place
    in the batch it will be part of, assigned in submission (= schedule) order.
    Each (episode, camera) has one decoder, which keeps its position between the episode's
    anchors and keeps the frames a camera window spanning ``camera_window_frames`` frames
    can ask for again, none once returned with ``frames_asked_once`` (see :class:`DecoderLRU`); the decoded frames all decoders keep are
    bounded by ``decoded_frame_budget_bytes`` (``None``: unbounded) and reported as gauges (``decoded_resident_bytes``/``_frames``,
    ``peak_decoded_bytes``/``_frames``, ``decoded_budget_bytes``) next to ``frames_decoded``
    and ``frames_delivered``.
    With ``decoders_per_clip`` > 1 (the schedule's open anchor runs per episode), each (episode,
    camera) keeps up to that many decoders, one per open run, or one reading ahead on AV1 with
    GOPs of at most 2 frames (:class:`DecoderLRU`).
    Errors keep their type (e.g. ``FrameTimestampError``) and gain a note naming the episode
    and frame. With ``skip_bad`` (``streaming_bad_episodes=skip``: the episodes known bad, a set
    the :class:`~lerobot_nodes.nodes.bad_episode_filter.BadEpisodeFilter` after the ordered buffer
    fills on the consumer thread, which also calls :meth:`next`), a :class:`VideoDecodeError`
    makes the sample a :class:`BadSample` instead of raising, and a task of an episode already in
    ``skip_bad`` is not decoded (nor given a place in a batch): it is a :class:`BadSample` at once.
    State: the source state after the last submitted task. ``reset`` and
    ``close`` cancel payload waits and join the threads before touching the source.
    """

    SOURCE_KEY = "source"

    def __init__(
        self,
        source: BaseNode[SampleTask],
        assemble: Callable[[EpisodePayload, int, DecoderLRU], AssembledSample],
        *,
        num_threads: int = 2,
        decoder_cache_size: int = 64,
        decoder_factory: ClipDecoderFactory | None = None,
        decoded_frame_budget_bytes: int | None = None,
        metrics: MetricsSink | None = None,
        decode_error_hint: Callable[[], str] | None = None,
        slots: BatchSlots | None = None,
        camera_window_frames: int | None = None,
        frames_asked_once: bool = False,
        decoders_per_clip: int = 1,
        skip_bad: Container[int] | None = None,
    ) -> None:
        super().__init__()
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self.source = source
        self.assemble = assemble
        self.num_threads = num_threads
        self.frame_budget = DecodedFrameBudget(decoded_frame_budget_bytes)
        self.decoders = DecoderLRU(
            decoder_cache_size,
            decoder_factory,
            self.frame_budget,
            camera_window_frames,
            per_key=decoders_per_clip,
            asked_once=frames_asked_once,
        )
        self.metrics = metrics or NullMetrics()
        self._record = recorder(self.metrics)
        if decoded_frame_budget_bytes is not None:
            self.metrics.set("decoded_budget_bytes", decoded_frame_budget_bytes)
        # What to do about a decode error whose cause may be a stale cached index (see sidecar.cache).
        self.decode_error_hint = decode_error_hint
        # Where each sample's camera frames go when batches are assembled in place (else None).
        self.slots = slots
        self.skip_bad = skip_bad
        self._executor: ThreadPoolExecutor | None = None
        self._cancelled = threading.Event()
        self._gop_reported = False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._stop_threads(keep_contexts=True)
        self._cancelled = threading.Event()
        if self.slots is not None:
            self.slots.reset()
        self.source.reset(initial_state[self.SOURCE_KEY] if initial_state is not None else None)

    def next(self) -> PendingSample:
        task = next(self.source)
        if self.skip_bad is not None and task.episode in self.skip_bad:
            return self._known_bad(task)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.num_threads, thread_name_prefix="lerobot-nodes-decode")
        destination = self.slots.next_slot(task.episode) if self.slots is not None else None
        future = self._executor.submit(self._run, task, self._cancelled, destination)
        return PendingSample(task.item, future)

    def may_run_ahead(self) -> bool:
        """Whether the next sample may be submitted ahead of the consumer (see
        :meth:`~lerobot_nodes.batch_memory.batch_slots.BatchSlots.may_start_ahead`)."""
        return self.slots is None or self.slots.may_start_ahead()

    def get_state(self) -> dict[str, Any]:
        return {self.SOURCE_KEY: self.source.state_dict()}

    def _known_bad(self, task: SampleTask) -> PendingSample:
        """The mark of a task whose episode is known bad: no decode, the episode's bytes released."""
        item = task.item
        task.done()
        if item.last_of_episode:
            self.decoders.retire(item.episode)
        future: Future[MaybeBadSample] = Future()
        future.set_result(BadSample(item.episode, item.frame))
        return PendingSample(item, future)

    def close(self) -> None:
        """Join the decode threads, close every decoder, then close the source."""
        self._stop_threads()
        close = getattr(self.source, "close", None)
        if close is not None:
            close()

    def _stop_threads(self, keep_contexts: bool = False) -> None:
        self._cancelled.set()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        self.decoders.clear(keep_contexts)

    def _report_gop(self, payload: EpisodePayload) -> None:
        """The ``gop_frames`` gauge (frames between key frames of the first clip, the median), once:
        the batch-mixing figures count same-batch pairs within one GOP with it."""
        self._gop_reported = True
        for clip in payload.clips.values():
            keys = np.flatnonzero(np.asarray(clip.layout.keyframes))
            gop = int(np.median(np.diff(keys))) if len(keys) > 1 else len(clip.layout)
            self.metrics.set("gop_frames", gop)
            return

    def _run(
        self, task: SampleTask, cancelled: threading.Event, destination: Mapping[str, BatchPlace] | None = None
    ) -> MaybeBadSample:
        item = task.item
        try:
            # A fetch error is shared by every sample of its episode and already names the
            # episode, file and byte ranges: it is raised as is.
            if not task.payload_ready():
                stalled = time.perf_counter()
                payload = task.wait_payload(cancelled)
                self.metrics.add("refill_stalls", 1)
                self.metrics.add("refill_stall_seconds", time.perf_counter() - stalled)
            else:
                payload = task.wait_payload(cancelled)
            if not self._gop_reported:
                self._report_gop(payload)
            if item.reach:
                self.decoders.read_ahead(item.episode, item.reach)
            started = time.perf_counter()
            try:
                if destination is None:
                    assembled = self.assemble(payload, item.frame, self.decoders)
                else:
                    assembled = self.assemble(payload, item.frame, self.decoders, destination)  # type: ignore[call-arg]
            except Exception as exc:
                add_context(exc, f"while assembling episode {item.episode}, frame {item.frame} (schedule item {item.seq})")
                if isinstance(exc, VideoDecodeError) and self.decode_error_hint is not None:
                    add_context(exc, self.decode_error_hint())
                if self.skip_bad is not None and isinstance(exc, VideoDecodeError):
                    # Its decoders may hold a broken codec state: the episode's later samples are dropped anyway.
                    self.decoders.retire(item.episode)
                    return BadSample(item.episode, item.frame, error_text(exc), placed=destination is not None)
                raise
            if assembled.frames_delivered:
                budget = self.frame_budget
                self._record(
                    {
                        "decode_seconds": time.perf_counter() - started,
                        "frames_decoded": assembled.frames_decoded,
                        "frames_delivered": assembled.frames_delivered,
                        "samples": 1,
                    },
                    {
                        "decoded_resident_bytes": budget.resident_bytes,
                        "decoded_resident_frames": budget.resident_frames,
                        "peak_decoded_bytes": budget.peak_bytes,
                        "peak_decoded_frames": budget.peak_frames,
                    },
                )
            else:
                self.metrics.add("samples", 1)
            return assembled.sample
        finally:
            task.done()
            if item.last_of_episode:
                self.decoders.retire(item.episode)


def apply_image_transforms(spec: SampleSpec, transforms: Callable[[Any], Any]) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A map function applying ``transforms`` to the camera keys of a sample (not depth), as LeRobot does.

    For graphs that apply transforms on the consumer thread (``num_workers=0``), so a fixed
    seed gives the same augmentations run to run.
    """

    def apply(sample: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(sample)
        for key in spec.video_keys + spec.image_keys:
            if key in out and key not in spec.depth_keys:
                out[key] = transforms(out[key])
        return out

    return apply
