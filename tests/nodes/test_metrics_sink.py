"""One call records a decoded sample's counters and gauges, as the calls one by one would."""

from __future__ import annotations

from lerobot_nodes.metrics import NullMetrics, WorkerCounters, WorkerMetrics, recorder

AMOUNTS = {"decode_seconds": 0.25, "frames_decoded": 3, "frames_delivered": 2, "samples": 1}
GAUGES = {"decoded_resident_bytes": 4096, "peak_decoded_frames": 7, "reserved_bytes": 900}


def test_update_equals_adds_and_sets_one_by_one() -> None:
    together, one_by_one = WorkerCounters(2, shared=False), WorkerCounters(2, shared=False)
    for _ in range(3):
        WorkerMetrics(together, row=1).update(AMOUNTS, GAUGES)
        metrics = WorkerMetrics(one_by_one, row=1)
        for name, amount in AMOUNTS.items():
            metrics.add(name, amount)
        for name, value in GAUGES.items():
            metrics.set(name, value)
    WorkerMetrics(together, row=1).update({}, {"reserved_bytes": 100})
    WorkerMetrics(one_by_one, row=1).set("reserved_bytes", 100)
    assert together.totals() == one_by_one.totals()
    totals = together.totals()
    assert totals["frames_decoded"] == 9 and totals["samples"] == 3
    assert totals["reserved_bytes"] == 100 and totals["peak_reserved_bytes"] == 900


class AddSetOnly:
    """A sink written before ``update`` existed: only the protocol's two methods."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []

    def add(self, name: str, amount: float = 1.0) -> None:
        self.calls.append(("add", name, amount))

    def set(self, name: str, value: float) -> None:
        self.calls.append(("set", name, value))


def test_recorder_falls_back_to_add_and_set() -> None:
    sink = AddSetOnly()
    recorder(sink)(AMOUNTS, GAUGES)
    assert sink.calls == [("add", k, v) for k, v in AMOUNTS.items()] + [("set", k, v) for k, v in GAUGES.items()]
    null = NullMetrics()
    assert recorder(null) == null.update
    null.update(AMOUNTS, GAUGES)  # counts nothing, raises nothing
