"""Decoded samples held ahead of the consumer and released strictly in schedule order.

:class:`OrderedBuffer` keeps up to ``max_ahead`` pending samples submitted to the decode
threads and returns them in the order they were scheduled, whatever order they finish in.
It also makes the graph's state exact: right after pulling each pending sample it snapshots
its source's state, and it adopts that snapshot when (and only when) the sample is returned.
Samples decoded ahead are therefore never part of the state; after a restore they are
scheduled and decoded again (the torchdata snapshot pattern, on the consumer thread).

A snapshot walks the node chain below, so a consumer that only asks for the state at batch
boundaries (:class:`~lerobot_nodes.nodes.batcher.SampleBatcher`) sets ``snapshot_every`` to
its batch size: the buffer then snapshots after every ``snapshot_every``-th sample since the
last reset and after the last sample of each episode (so also after an epoch's last sample),
O(1) per sample, and has a state only at those points.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from torchdata.nodes import BaseNode

from ..errors import GraphFailedError
from .decode_mapper import MaybeBadSample, PendingSample
from .pool_sampler import ScheduleItem


@dataclass
class _Slot:
    pending: PendingSample | None
    snapshot: dict[str, Any] | None
    error: BaseException | None = None


class OrderedBuffer(BaseNode[MaybeBadSample]):
    """Returns samples in schedule order with at most ``max_ahead`` pending at once.

    ``last_item`` is the schedule item of the sample returned last (what the nodes after it
    know a sample by without reading its columns).

    Errors: an error of any stage is raised at its place in the order (earlier samples are
    returned first). After that, every ``next()`` raises :class:`GraphFailedError` naming the
    first error, so a failed graph never hangs and never silently skips a sample; the state
    still points before the failed sample, so a resume retries it.

    A source with ``may_run_ahead()`` (a :class:`~lerobot_nodes.nodes.decode_mapper.DecodeMapper`
    assembling batches in a worker's recycled segments) is pulled ahead of the consumer only while
    it says so, and always when nothing is pending: that decides when a sample is submitted, never
    which one, so the order and the state are the same.
    """

    SOURCE_KEY = "source"
    NUM_YIELDED_KEY = "num_yielded"

    def __init__(self, source: BaseNode[PendingSample], max_ahead: int = 8, snapshot_every: int = 1) -> None:
        super().__init__()
        if max_ahead < 1:
            raise ValueError(f"max_ahead must be >= 1, got {max_ahead}")
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        self.source = source
        self.max_ahead = max_ahead
        self.snapshot_every = snapshot_every
        self._slots: deque[_Slot] = deque()
        self._snapshot: dict[str, Any] | None = None
        self._num_yielded = 0
        self._snapshot_at = 0  # the num_yielded the snapshot describes
        self._pulled = 0  # samples pulled from the source since the last reset
        self._exhausted = False
        self._failure: BaseException | None = None
        self.last_item: ScheduleItem | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._cancel_pending()
        self._exhausted = False
        self._failure = None
        self._pulled = 0
        self.last_item = None
        if initial_state is not None:
            self.source.reset(initial_state[self.SOURCE_KEY])
            self._snapshot = initial_state[self.SOURCE_KEY]
            self._num_yielded = int(initial_state[self.NUM_YIELDED_KEY])
        else:
            self.source.reset(None)
            self._snapshot = self.source.state_dict()
            self._num_yielded = 0
        self._snapshot_at = self._num_yielded

    def next(self) -> MaybeBadSample:
        if self._failure is not None:
            raise GraphFailedError(
                f"the streaming graph stopped after an error ({type(self._failure).__name__}: {self._failure}); "
                "reset it (or restore a state) to continue"
            ) from self._failure
        self._fill()
        if not self._slots:
            raise StopIteration
        slot = self._slots.popleft()
        try:
            if slot.error is not None:
                raise slot.error
            assert slot.pending is not None
            sample = slot.pending.result()
        except BaseException as exc:
            self._failure = exc
            self._cancel_pending()
            raise
        self._num_yielded += 1
        self.last_item = slot.pending.item
        if slot.snapshot is not None:
            self._snapshot = slot.snapshot
            self._snapshot_at = self._num_yielded
        return sample

    def get_state(self) -> dict[str, Any]:
        if self._snapshot_at != self._num_yielded:
            raise RuntimeError(
                f"this OrderedBuffer snapshots every {self.snapshot_every} samples and at episode ends; "
                f"it has no state after {self._num_yielded} samples (the last is after {self._snapshot_at})"
            )
        return {self.SOURCE_KEY: self._snapshot, self.NUM_YIELDED_KEY: self._num_yielded}

    def close(self) -> None:
        """Cancel pending samples and close the graph below."""
        self._cancel_pending()
        close = getattr(self.source, "close", None)
        if close is not None:
            close()

    def _fill(self) -> None:
        while (
            not self._exhausted
            and len(self._slots) < self.max_ahead
            and (not self._slots or self._may_run_ahead())
        ):
            try:
                pending = next(self.source)
                self._pulled += 1
                boundary = self._pulled % self.snapshot_every == 0 or pending.item.last_of_episode
                snapshot = self.source.state_dict() if boundary else None
            except StopIteration:
                self._exhausted = True
            except Exception as exc:
                # Raised in schedule order, after the samples pulled before it.
                self._exhausted = True
                self._slots.append(_Slot(pending=None, snapshot=None, error=exc))
            else:
                self._slots.append(_Slot(pending=pending, snapshot=snapshot))

    def _may_run_ahead(self) -> bool:
        """Whether the source lets a sample be pulled ahead of the consumer (a source without
        ``may_run_ahead`` always does). Pulled while the buffer is empty regardless: the consumer
        is waiting for it."""
        may_run_ahead = getattr(self.source, "may_run_ahead", None)
        return may_run_ahead is None or bool(may_run_ahead())

    def _cancel_pending(self) -> None:
        for slot in self._slots:
            if slot.pending is not None:
                slot.pending.cancel()
        self._slots.clear()
