"""Where nodes count what they do (``lerobot_nodes.metrics.WorkerMetrics`` fits this protocol)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

Recorder = Callable[[Mapping[str, float], Mapping[str, float]], None]
"""``(counter amounts, gauge values) -> None``: several ``add`` and ``set`` calls at once."""


class MetricsSink(Protocol):
    """``add`` grows a counter; ``set`` overwrites a gauge (reserved/resident bytes).

    A sink may also have ``update(amounts, gauges)``, doing both for several names at once
    (:func:`recorder` uses it when present: one lock per decoded sample instead of eight).
    """

    def add(self, name: str, amount: float = 1.0) -> None: ...

    def set(self, name: str, value: float) -> None: ...


def recorder(sink: MetricsSink) -> Recorder:
    """``sink.update`` when the sink has it, else the same through ``add`` and ``set``."""
    update = getattr(sink, "update", None)
    if update is not None:
        return update  # type: ignore[no-any-return]

    def record_each(amounts: Mapping[str, float], gauges: Mapping[str, float]) -> None:
        for name, amount in amounts.items():
            sink.add(name, amount)
        for name, value in gauges.items():
            sink.set(name, value)

    return record_each


class NullMetrics:
    """Counts nothing."""

    def add(self, name: str, amount: float = 1.0) -> None:
        pass

    def set(self, name: str, value: float) -> None:
        pass

    def update(self, amounts: Mapping[str, float], gauges: Mapping[str, float]) -> None:
        pass
