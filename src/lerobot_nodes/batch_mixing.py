"""How mixed delivered batches are, next to a uniform random shuffle of the same selection.

Two figures per run, computed from each delivered batch's ``episode_index`` and ``frame_index``
(a few numpy operations per batch, in the training process):

* **distinct episodes per batch**, the mean over batches;
* **near pairs**: the share of same-batch sample pairs that come from one episode and lie within
  :data:`NEAR_FRAMES` frames of each other (``|frame_a - frame_b| <= 5``), and the share within
  one GOP (``|frame_a - frame_b| < gop``) where the GOP size is known.

:func:`uniform_mixing` gives the same figures for a uniform random shuffle of the selection (every
frame once per epoch, batches cut from a random permutation, as ``DataLoader(shuffle=True)``
makes them): in closed form from the episode lengths alone, so it is cheap for millions of
episodes (numpy over the distinct lengths, no per-episode Python object).

* A batch of ``B`` frames drawn without replacement holds episode ``e`` (length ``L``, of ``N``
  frames in all) with probability ``1 - C(N - L, B) / C(N, B)``; the expected distinct episodes
  are the sum over episodes.
* Each same-batch pair of a shuffle is a uniform pair of distinct frames, so the share of near
  pairs is the count of frame pairs of one episode within ``k`` frames, ``sum_e sum_{d=1..k}
  (L_e - d)``, over ``N (N - 1) / 2``, whatever the batch size.

:class:`MixingTally` accumulates the measured figures; :class:`BatchMixing` is what a report
shows. Imports numpy only (the metrics floor).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrays import sorted_unique

NEAR_FRAMES = 5
"""Frames apart at most for a same-batch pair of one episode to count as a near pair."""

MAX_TRACKED_DISTANCE = 4096
"""Same-episode pair distances are counted exactly up to this many frames (GOPs are far shorter)."""


def near_pair_count(lengths: Sequence[int] | np.ndarray, within: int) -> int:
    """Unordered pairs of distinct frames of one episode at most ``within`` frames apart, over all episodes."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if within <= 0 or lengths.size == 0:
        return 0
    values, counts = np.unique(lengths, return_counts=True)
    m = np.minimum(int(within), np.maximum(values - 1, 0))
    per_episode = m * values - m * (m + 1) // 2  # sum_{d=1..m} (L - d)
    return int(np.sum(per_episode * counts))


def expected_distinct_episodes(lengths: Sequence[int] | np.ndarray, batch_size: int) -> float:
    """Expected distinct episodes in a batch of ``batch_size`` frames drawn without replacement."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    lengths = lengths[lengths > 0]
    total = int(lengths.sum())
    size = min(int(batch_size), total)
    if size <= 0:
        return 0.0
    values, counts = np.unique(lengths, return_counts=True)
    steps = np.arange(size, dtype=np.float64)
    # P(no frame of an episode of length L) = prod_i (N - L - i) / (N - i), i < B.
    numerators = (total - values[:, None]).astype(np.float64) - steps[None, :]
    with np.errstate(divide="ignore"):
        logs = np.where(numerators > 0, np.log(np.maximum(numerators, 1.0)), -np.inf).sum(axis=1)
    logs -= np.log(total - steps).sum()
    absent = np.exp(logs)
    return float(np.sum(counts * (1.0 - absent)))


@dataclass(frozen=True)
class UniformMixing:
    """The figures of a uniform random shuffle (see the module)."""

    distinct_episodes: float
    near_pairs: float
    gop_pairs: float | None = None


def uniform_mixing(
    lengths: Sequence[int] | np.ndarray, batch_size: int, near: int = NEAR_FRAMES, gop: int | None = None
) -> UniformMixing:
    """Distinct episodes per batch of ``batch_size`` and near-pair shares of a uniform shuffle of ``lengths``."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    total = int(lengths.sum())
    pairs = total * (total - 1) // 2

    def share(within: int) -> float:
        return near_pair_count(lengths, within) / pairs if pairs else float("nan")

    return UniformMixing(
        distinct_episodes=expected_distinct_episodes(lengths, batch_size),
        near_pairs=share(near),
        gop_pairs=share(int(gop) - 1) if gop else None,
    )


_TRIU: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _pair_indices(size: int) -> tuple[np.ndarray, np.ndarray]:
    found = _TRIU.get(size)
    if found is None:
        found = _TRIU[size] = np.triu_indices(size, 1)
    return found


def as_index_array(value: Any) -> np.ndarray | None:
    """A batch column (tensor, array, list) as a flat int64 array; None when it is not one."""
    try:
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 - a column of another kind (e.g. a CUDA tensor): not counted
        return None
    if array.dtype.kind not in "iub":
        return None
    return array.reshape(-1).astype(np.int64, copy=False)


class MixingTally:
    """The measured figures over the batches :meth:`observe` saw (see the module).

    Per batch: the distinct episodes, the number of sample pairs, and a histogram of the frame
    distances of its same-episode pairs, so the share within any distance (5 frames, one GOP)
    is read at report time.
    """

    def __init__(self) -> None:
        self.batches = 0
        self.samples = 0
        self.distinct_sum = 0
        self.pairs = 0
        self.batch_sizes: dict[int, int] = {}
        self._distances = np.zeros(MAX_TRACKED_DISTANCE + 2, dtype=np.int64)

    def observe(self, episode_index: Any, frame_index: Any) -> bool:
        """Count one batch from its columns; False (nothing counted) when they are not index arrays."""
        episodes, frames = as_index_array(episode_index), as_index_array(frame_index)
        if episodes is None or frames is None or episodes.shape != frames.shape or episodes.size == 0:
            return False
        size = int(episodes.size)
        self.batches += 1
        self.samples += size
        self.distinct_sum += int(sorted_unique(episodes).size)
        self.batch_sizes[size] = self.batch_sizes.get(size, 0) + 1
        if size > 1:
            left, right = _pair_indices(size)
            self.pairs += int(left.size)
            same = episodes[left] == episodes[right]
            if same.any():
                distance = np.abs(frames[left[same]] - frames[right[same]])
                np.minimum(distance, MAX_TRACKED_DISTANCE + 1, out=distance)
                self._distances += np.bincount(distance, minlength=self._distances.size)
        return True

    def observe_batch(self, batch: Any) -> bool:
        """:meth:`observe` of a collated batch's ``episode_index`` and ``frame_index`` (False if absent)."""
        if not isinstance(batch, Mapping) or "episode_index" not in batch or "frame_index" not in batch:
            return False
        return self.observe(batch["episode_index"], batch["frame_index"])

    def pairs_within(self, frames: int) -> int:
        """Same-batch pairs of one episode at most ``frames`` apart (0 apart included)."""
        if frames < 0:
            return 0
        return int(self._distances[: min(int(frames), MAX_TRACKED_DISTANCE) + 1].sum())

    def figures(
        self,
        lengths: Sequence[int] | np.ndarray | None = None,
        gop: int | None = None,
        near: int = NEAR_FRAMES,
    ) -> BatchMixing:
        """The measured figures, with the uniform baseline of ``lengths`` (the selection) when given."""

        def share(within: int) -> float:
            return self.pairs_within(within) / self.pairs if self.pairs else float("nan")

        uniform_distinct = uniform_near = uniform_gop = float("nan")
        if lengths is not None and self.batches:
            counts = self.batch_sizes
            lengths = np.asarray(lengths, dtype=np.int64)
            base = uniform_mixing(lengths, max(counts), near, gop)
            uniform_near = base.near_pairs
            uniform_gop = base.gop_pairs if base.gop_pairs is not None else float("nan")
            # The batches' own sizes (an epoch's last batch is short).
            uniform_distinct = (
                sum(expected_distinct_episodes(lengths, size) * count for size, count in counts.items())
                / self.batches
            )
        return BatchMixing(
            batches=self.batches,
            batch_size=max(self.batch_sizes) if self.batch_sizes else 0,
            distinct_episodes=self.distinct_sum / self.batches if self.batches else float("nan"),
            near_pairs=share(near),
            gop_pairs=share(int(gop) - 1) if gop else float("nan"),
            uniform_distinct_episodes=uniform_distinct,
            uniform_near_pairs=uniform_near,
            uniform_gop_pairs=uniform_gop,
            near_frames=near,
            gop_frames=int(gop) if gop else 0,
        )


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.2f} %"


def _num(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1f}"


@dataclass(frozen=True)
class BatchMixing:
    """Batch-mixing figures of a run and of a uniform shuffle of the same selection and batch size.

    ``near_pairs``/``gop_pairs``: shares of same-batch pairs from one episode within
    ``near_frames`` frames / within one GOP (``gop_frames``; 0 when unknown, the shares NaN).
    """

    batches: int = 0
    batch_size: int = 0
    distinct_episodes: float = float("nan")
    near_pairs: float = float("nan")
    gop_pairs: float = float("nan")
    uniform_distinct_episodes: float = float("nan")
    uniform_near_pairs: float = float("nan")
    uniform_gop_pairs: float = float("nan")
    near_frames: int = NEAR_FRAMES
    gop_frames: int = 0

    def line(self) -> str:
        gop = (
            f", within one GOP ({self.gop_frames}) {_pct(self.gop_pairs)} (uniform {_pct(self.uniform_gop_pairs)})"
            if self.gop_frames
            else ""
        )
        return (
            f"batch mixing: {_num(self.distinct_episodes)} episodes per batch (uniform "
            f"{_num(self.uniform_distinct_episodes)}), same-episode pairs within {self.near_frames} frames "
            f"{_pct(self.near_pairs)} (uniform {_pct(self.uniform_near_pairs)}){gop}"
        )

    def rows(self) -> list[tuple[str, str]]:
        rows = [
            (
                "distinct episodes per batch (uniform)",
                f"{_num(self.distinct_episodes)} ({_num(self.uniform_distinct_episodes)})",
            ),
            (
                f"pairs of one episode within {self.near_frames} frames (uniform)",
                f"{_pct(self.near_pairs)} ({_pct(self.uniform_near_pairs)})",
            ),
        ]
        if self.gop_frames:
            rows.append(
                (
                    f"pairs of one episode within one GOP of {self.gop_frames} (uniform)",
                    f"{_pct(self.gop_pairs)} ({_pct(self.uniform_gop_pairs)})",
                )
            )
        return rows

    def as_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}
