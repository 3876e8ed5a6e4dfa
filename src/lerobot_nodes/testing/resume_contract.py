"""The save/restore contract every node of a streaming graph keeps, as one reusable check.

Like torchdata's ``run_test_save_load_state``: a node saved with ``state_dict()`` after any
number of items, and restored into a fresh node with ``reset(state)``, yields exactly what the
uninterrupted node yields from that point on, to the end of the epoch and through the next
epoch. Per-node tests, and anyone writing a node of their own (see ``notebooks/``), call
:func:`assert_resumes_exactly` with a factory of fresh nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from torchdata.nodes import BaseNode

T = TypeVar("T")


def _drain(node: BaseNode[T], consume: Callable[[T], Any]) -> list[Any]:
    out = []
    while True:
        try:
            out.append(consume(next(node)))
        except StopIteration:
            return out


def assert_resumes_exactly(
    make_node: Callable[[], BaseNode[T]],
    cuts: Iterable[int],
    *,
    epochs: int = 2,
    consume: Callable[[T], Any] = lambda item: item,
    close: Callable[[BaseNode[T]], None] = lambda node: None,
) -> list[list[Any]]:
    """Check the contract at every cut (items into an epoch) of each of ``epochs`` epochs.

    ``consume`` turns a yielded item into the value compared (and may release it, as a
    training loop would); ``close`` stops a node's threads. Returns the uninterrupted run's
    values per epoch. A cut past an epoch's end is clamped to it.
    """
    reference_node = make_node()
    reference: list[list[Any]] = []
    for epoch in range(epochs):
        if epoch:
            reference_node.reset()
        reference.append(_drain(reference_node, consume))
    close(reference_node)
    for epoch in range(epochs):
        for cut in sorted({min(int(c), len(reference[epoch])) for c in cuts}):
            run = make_node()
            for _ in range(epoch):
                _drain(run, consume)
                run.reset()
            head = [consume(next(run)) for _ in range(cut)]
            state = run.state_dict()
            close(run)
            resumed = make_node()
            resumed.reset(state)
            where = f"epoch {epoch}, restored after {cut} items"
            assert head + _drain(resumed, consume) == reference[epoch], where
            if epoch + 1 < epochs:
                resumed.reset()
                assert _drain(resumed, consume) == reference[epoch + 1], f"{where}: the next epoch differs"
            close(resumed)
    return reference
