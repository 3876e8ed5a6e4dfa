"""``EpisodePoolSampler.fast_forward`` (resume replay) reaches exactly the state of as many ``next()`` calls."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_nodes.fetch import ByteBudget

from .helpers import make_sampler


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=12),
    pool_size=st.integers(1, 5),
    strategy=st.sampled_from(("remaining", "round_robin")),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 3),
    budgeted=st.booleans(),
    data=st.data(),
)
def test_fast_forward_equals_next(lengths, pool_size, strategy, seed, epoch, budgeted, data):
    episodes = list(range(len(lengths)))
    costs = {e: data.draw(st.integers(0, 100)) for e in episodes} if budgeted else None
    budget = ByteBudget(worker_bytes=150, rank_bytes=10_000) if budgeted else None
    options = {"pool_size": pool_size, "strategy": strategy, "seed": seed, "costs": costs, "budget": budget, "initial_epoch": epoch}
    cut = data.draw(st.integers(0, sum(lengths)))
    stepped = make_sampler(episodes, lengths, **options)
    stepped.reset(None)
    for _ in range(cut):
        next(stepped)
    skipped = make_sampler(episodes, lengths, **options)
    skipped.reset(None)
    skipped.fast_forward(cut)
    assert skipped.state_dict() == stepped.state_dict()
    assert skipped.state_after(cut, epoch) == stepped.state_dict()
    rest = [(i.episode, i.frame) for i in stepped]
    assert [(i.episode, i.frame) for i in skipped] == rest
