"""Where nodes count what they do (``lerobot_nodes.metrics.WorkerMetrics`` fits this protocol)."""

from __future__ import annotations

from typing import Protocol


class MetricsSink(Protocol):
    """``add`` grows a counter; ``set`` overwrites a gauge (reserved/resident bytes)."""

    def add(self, name: str, amount: float = 1.0) -> None: ...

    def set(self, name: str, value: float) -> None: ...


class NullMetrics:
    """Counts nothing."""

    def add(self, name: str, amount: float = 1.0) -> None:
        pass

    def set(self, name: str, value: float) -> None:
        pass
