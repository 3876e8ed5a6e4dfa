"""The default sampling strategy is ``round_robin`` (issue 24): a batch draws on as many resident episodes
as it has samples, so it holds at least as many distinct episodes as a uniform shuffle's, with no pair of
samples of one episode within a few frames; every frame still once per epoch in a seeded order; a run that
leaves the strategy unset resumes a checkpoint with the strategy it was made with (``remaining`` for the
versions before), and a strategy set against the checkpoint's is refused, naming the flag."""

from __future__ import annotations

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from lerobot_nodes import StreamingConfig, StreamingLeRobotDataset, streaming_dataloader
from lerobot_nodes.config import DEFAULT_SAMPLING_STRATEGY
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.resume.identity import SAMPLING_STRATEGY
from lerobot_nodes.testing import write_dataset

EPISODES, LENGTH, BATCH = 400, 10, 32


@pytest.fixture(scope="module")
def many_episodes(tmp_path_factory):
    """400 episodes of 10 frames, no video: the schedule alone decides the mixing."""
    return write_dataset(
        tmp_path_factory.mktemp("many") / "ds", episode_lengths=[LENGTH] * EPISODES, cameras=(), seed=7
    )


def _dataset(root, **options) -> StreamingLeRobotDataset:
    return StreamingLeRobotDataset(root=root, seed=11, config=StreamingConfig(**options))


def _keys(batch) -> list[tuple[int, int]]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))


def _epoch(dataset, batch_size=BATCH, num_workers=0) -> list[tuple[int, int]]:
    return [key for batch in streaming_dataloader(dataset, batch_size, num_workers) for key in _keys(batch)]


def test_a_new_run_samples_round_robin_and_records_it():
    assert StreamingConfig().sampling_strategy == DEFAULT_SAMPLING_STRATEGY == "round_robin"
    assert StreamingConfig(streaming_sampling_strategy="remaining").sampling_strategy == "remaining"
    with pytest.raises(ConfigError, match="streaming_sampling_strategy must be one of remaining, round_robin"):
        StreamingConfig(streaming_sampling_strategy="uniform")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_default_batches_hold_as_many_episodes_as_a_uniform_shuffle(many_episodes, num_workers):
    figures = {}
    for strategy in (None, "remaining"):
        dataset = _dataset(many_episodes, streaming_sampling_strategy=strategy)
        assert dataset.identity[SAMPLING_STRATEGY] == (strategy or "round_robin")
        seen = []
        for batch in dataset.metrics.timed(streaming_dataloader(dataset, BATCH, num_workers)):
            seen += _keys(batch)
            if len(seen) >= EPISODES * LENGTH * 3 // 4:  # before the pool drains at the epoch's end
                break
        assert len(set(seen)) == len(seen)
        figures[strategy] = dataset.metrics.report().mixing
    default, remaining = figures[None], figures["remaining"]
    assert default.distinct_episodes >= 0.99 * default.uniform_distinct_episodes
    assert default.near_pairs <= 2 * default.uniform_near_pairs
    assert default.distinct_episodes > remaining.distinct_episodes  # what the default before gave


def test_a_default_epoch_covers_every_frame_once_in_a_seeded_order(many_episodes):
    first, second = _epoch(_dataset(many_episodes)), _epoch(_dataset(many_episodes))
    assert first == second
    assert sorted(first) == [(e, f) for e in range(EPISODES) for f in range(LENGTH)]
    assert first != _epoch(_dataset(many_episodes, streaming_sampling_strategy="remaining"))


def test_an_unset_strategy_resumes_a_remaining_checkpoint_with_remaining(many_episodes):
    """A loader state of a run with ``remaining`` (every checkpoint of the versions before): the resumed run,
    its strategy unset, continues that schedule exactly; one that sets round_robin is refused."""
    steps = 15
    before = _dataset(many_episodes, streaming_sampling_strategy="remaining")
    loader = StatefulDataLoader(before, batch_size=BATCH, num_workers=0)
    delivered = []
    for step, batch in enumerate(loader, start=1):
        delivered += _keys(batch)
        if step == steps:
            state = loader.state_dict()
            break
    full = [key for batch in StatefulDataLoader(_dataset(many_episodes, streaming_sampling_strategy="remaining"), batch_size=BATCH) for key in _keys(batch)]
    assert delivered == full[: steps * BATCH]

    resumed = _dataset(many_episodes)
    again = StatefulDataLoader(resumed, batch_size=BATCH, num_workers=0)
    again.load_state_dict(state)
    rest = [key for batch in again for key in _keys(batch)]
    assert resumed.config.sampling_strategy == "remaining"
    assert rest == full[steps * BATCH :]

    chosen = StatefulDataLoader(_dataset(many_episodes, streaming_sampling_strategy="round_robin"), batch_size=BATCH)
    with pytest.raises(ConfigError, match="--dataset.streaming_sampling_strategy"):
        chosen.load_state_dict(state)
        next(iter(chosen))


def test_a_step_resume_adopts_the_checkpoints_strategy(many_episodes):
    steps = 12
    before = _dataset(many_episodes, streaming_sampling_strategy="remaining")
    full = _epoch(before)
    identity = dict(before.identity)  # with the pool streaming_dataloader sized for the batch
    resumed = _dataset(many_episodes)
    resumed.resume_from_step(steps, BATCH, num_workers=0, identity=identity)
    assert _epoch(resumed) == full[steps * BATCH :]
