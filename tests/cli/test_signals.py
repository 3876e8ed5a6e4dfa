"""A termination signal is never lost, whatever the main thread runs when it arrives."""

from __future__ import annotations

import os
import signal
import sys
import weakref

import pytest

from lerobot_nodes.cli.signals import Stopped, raise_if_stopped, stopping_on_signals


class Holder:
    """Something a finalizer is attached to (a received batch's array, in the loader)."""


def _signal_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):  # the handler runs here, inside the finalizer, at a bytecode boundary
        pass


def test_a_signal_that_arrives_inside_a_finalizer_stops_at_the_next_batch() -> None:
    unraisable: list[object] = []
    previous_hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        with stopping_on_signals():
            holder = Holder()
            weakref.finalize(holder, _signal_self)
            del holder  # the finalizer runs now and the signal lands in it
            with pytest.raises(Stopped) as stopped:
                raise_if_stopped()  # what the streaming loop calls once per batch
            assert stopped.value.signum == signal.SIGTERM
    finally:
        sys.unraisablehook = previous_hook
    assert unraisable == []  # nothing raised into the finalizer, nothing printed and dropped


def test_a_signal_elsewhere_raises_at_once_and_once() -> None:
    with stopping_on_signals(), pytest.raises(Stopped):
        _signal_self()
    with stopping_on_signals():  # a new block starts with nothing pending
        raise_if_stopped()
