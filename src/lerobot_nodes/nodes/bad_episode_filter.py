"""Episodes found bad while decoding, dropped in delivery order (``streaming_bad_episodes=skip``).

The schedule is never changed: the sampler still schedules a damaged episode, so the order (and
the resume) of every good episode does not depend on when, or whether, the damage is found.
The decode step marks a sample whose decode failed (:class:`~lerobot_nodes.nodes.decode_mapper.BadSample`)
instead of raising, and :class:`BadEpisodeFilter`, right after the ordered buffer, drops it and
every later sample of its episode. Dropping in delivery order is what makes the state exact: the
bad set in a state is exactly the episodes whose failing sample was delivered before it, so a
restore drops the same samples the uninterrupted run dropped; an episode that fails after the
state is found again by the restored run's decode, at the same sample.
"""

from __future__ import annotations

import logging
from collections.abc import MutableSet
from typing import Any

from torchdata.nodes import BaseNode

from ..batch_memory.batch_slots import BatchSlots
from ..metrics import BAD_EPISODES_FOUND, BAD_SAMPLES_DROPPED, MetricsSink, NullMetrics
from .decode_mapper import BadSample, DecodedSample
from .ordered_buffer import OrderedBuffer

logger = logging.getLogger(__name__)


class BadEpisodeFilter(BaseNode[DecodedSample]):
    """The samples of ``source`` (an :class:`OrderedBuffer`) in order, without those of episodes found bad.

    Guarantees: a :class:`BadSample` whose episode is not yet bad makes it bad (logged once, with the
    error naming file, episode and frame, and counted); every sample of a bad episode after that is
    dropped, in this epoch and the later ones (a :class:`BadSample` or a sample decoded before the
    damage was found); every other sample is returned unchanged, in order. Samples of the episode
    delivered before its failing one stay delivered.

    ``slots``: where the decode step places samples in their batches, when it does; a dropped
    sample's position is given back (:meth:`BatchSlots.forget_place`), so only the batches in flight
    at a drop are copied by the batcher, not every later one.

    ``bad`` is the set of episodes found bad, shared with the decode step (which stops decoding
    them, see ``DecodeMapper(skip_bad=...)``) and, through the dataset, with a graph rebuilt in the
    same process; only this node changes it, on the consumer thread. ``reset(None)`` (the next
    epoch) keeps it, a state restores it.

    State: ``{SOURCE_KEY: the buffer's state, BAD_KEY: the bad episodes, sorted}``. A state of the
    versions before this node (the buffer's own) restores with no bad episode.
    """

    SOURCE_KEY = "source"
    BAD_KEY = "bad_episodes"

    def __init__(
        self,
        source: OrderedBuffer,
        bad: MutableSet[int] | None = None,
        *,
        metrics: MetricsSink | None = None,
        slots: BatchSlots | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.bad: MutableSet[int] = set() if bad is None else bad
        self.slots = slots
        self.metrics = metrics or NullMetrics()

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is not None:
            if self.BAD_KEY in initial_state:
                found, below = initial_state[self.BAD_KEY], initial_state[self.SOURCE_KEY]
            else:
                found, below = (), initial_state
            # Before the source: the decode step reads the set for the first tasks it is given.
            self.bad.clear()
            self.bad |= {int(e) for e in found}
            self.source.reset(below)
        else:
            self.source.reset(None)
        self._count_found()

    def next(self) -> DecodedSample:
        while True:
            sample = next(self.source)
            if isinstance(sample, BadSample):
                if sample.episode not in self.bad:
                    self._found(sample)
                self._dropped(sample.placed)
                continue
            item = self.source.last_item
            if item is not None and item.episode in self.bad:  # decoded before the damage was found
                self._dropped(placed=True)
                continue
            return sample

    def get_state(self) -> dict[str, Any]:
        return {self.SOURCE_KEY: self.source.state_dict(), self.BAD_KEY: sorted(self.bad)}

    def close(self) -> None:
        self.source.close()

    def _dropped(self, placed: bool) -> None:
        """Count a dropped sample; one that held a place in a batch gives its position back (``slots``)."""
        self.metrics.add(BAD_SAMPLES_DROPPED, 1)
        if placed and self.slots is not None:
            self.slots.forget_place()

    def _found(self, sample: BadSample) -> None:
        self.bad.add(sample.episode)
        self._count_found()
        logger.warning(
            "--dataset.streaming_bad_episodes=skip: episode %d is bad from frame %d on (found while decoding); "
            "its samples delivered before stay delivered, the rest of it is skipped in this epoch and the next: %s",
            sample.episode, sample.frame, sample.reason,
        )  # fmt: skip

    def _count_found(self) -> None:
        self.metrics.set(BAD_EPISODES_FOUND, len(self.bad))
