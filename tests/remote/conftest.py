"""Fixtures of the remote tests: a loopback Hub per test and one small generated dataset per session."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import huggingface_hub.constants
import pytest

from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.hub import LoopbackHub


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LeRobot v3.0 dataset of 3 short episodes and 2 cameras (read-only: the hub serves it from disk)."""
    return write_dataset(tmp_path_factory.mktemp("remote") / "small", episode_lengths=[20, 25, 15])


@pytest.fixture
def hub_client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain HTTP reads, no telemetry call.

    huggingface_hub reads these variables once, at import, so the constants it checks on each call
    are patched too; endpoints are always passed explicitly (``HF_ENDPOINT`` would come too late).
    """
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    # raising=False: huggingface_hub before 1.0 (the 0.30 floor) has no HF_HUB_DISABLE_XET.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True, raising=False)


def _hub_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("loopback-hub-")]


@pytest.fixture
def make_loopback_hub(hub_client_env: None) -> Iterator[Callable[..., LoopbackHub]]:
    """Start hubs with custom settings; every one is stopped, and all its threads ended, after the test."""
    hubs: list[LoopbackHub] = []

    def make(**settings: object) -> LoopbackHub:
        hub = LoopbackHub(**settings).start()  # type: ignore[arg-type]
        hubs.append(hub)
        return hub

    yield make
    for hub in hubs:
        hub.stop()
    deadline = time.monotonic() + 5.0
    while _hub_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _hub_threads(), f"loopback hub threads outlived the test: {_hub_threads()}"


@pytest.fixture
def loopback_hub(make_loopback_hub: Callable[..., LoopbackHub]) -> LoopbackHub:
    """A running hub with default settings (302 to the CDN, no latency, no faults), empty."""
    return make_loopback_hub()
