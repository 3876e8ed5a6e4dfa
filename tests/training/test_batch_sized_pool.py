"""The default pool holds 4 batches of episodes (issue 24): batches of a dataset with many more episodes
than 32 hold about as many distinct episodes as a uniform shuffle's, every frame still once per epoch,
and a resumed run keeps the pool its checkpoint was made with (the versions before: 32)."""

from __future__ import annotations

import pytest

from lerobot_nodes import StreamingConfig, StreamingLeRobotDataset, streaming_dataloader
from lerobot_nodes.config import DEFAULT_RANK_POOL_SIZE, default_rank_pool_size
from lerobot_nodes.resume.identity import RANK_POOL, SAMPLING_STRATEGY
from lerobot_nodes.testing import write_dataset

EPISODES, LENGTH, BATCH = 300, 12, 32


@pytest.fixture(scope="module")
def many_episodes(tmp_path_factory):
    """300 episodes of 12 frames, no video: the schedule alone decides the mixing."""
    return write_dataset(
        tmp_path_factory.mktemp("many") / "ds", episode_lengths=[LENGTH] * EPISODES, cameras=(), seed=5
    )


def _dataset(root, **options) -> StreamingLeRobotDataset:
    return StreamingLeRobotDataset(root=root, seed=3, config=StreamingConfig(**options))


def _keys(batch) -> list[tuple[int, int]]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))


def test_the_default_rank_pool_is_four_batches_of_episodes_and_at_least_32():
    assert default_rank_pool_size(None) == DEFAULT_RANK_POOL_SIZE == 32
    assert default_rank_pool_size(8) == 32
    assert default_rank_pool_size(32) == 128
    config = StreamingConfig()
    assert [config.worker_pool_size(w, 2, 128) for w in range(2)] == [64, 64]
    assert StreamingConfig(streaming_episode_pool_size=5).worker_pool_size(0, 2, 128) == 5


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_of_many_episodes_mix_nearly_as_a_uniform_shuffle(many_episodes, num_workers):
    figures = {}
    pool_32 = {"streaming_episode_pool_size": 32 // max(1, num_workers), "streaming_sampling_strategy": "remaining"}
    for name, options in {"default": {}, "pool 32": pool_32}.items():
        dataset = _dataset(many_episodes, **options)
        loader = streaming_dataloader(dataset, BATCH, num_workers)
        seen = []
        for batch in dataset.metrics.timed(loader):
            seen += _keys(batch)
            if len(seen) >= EPISODES * LENGTH // 2:  # the first half: before the pool drains at the epoch's end
                break
        figures[name] = dataset.metrics.report().mixing
        assert len(set(seen)) == len(seen)
        if name == "default":
            assert dataset.rank_pool == 4 * BATCH
    default, small = figures["default"], figures["pool 32"]
    assert default.distinct_episodes >= 0.9 * default.uniform_distinct_episodes
    assert small.distinct_episodes < 0.8 * small.uniform_distinct_episodes  # what the pool of 32 gave (remaining)


def test_an_epoch_with_the_batch_sized_pool_covers_every_frame_once_in_a_seeded_order(many_episodes):
    epochs = []
    for _ in range(2):
        dataset = _dataset(many_episodes)
        loader = streaming_dataloader(dataset, BATCH, 0)
        epochs.append([key for batch in loader for key in _keys(batch)])
    assert epochs[0] == epochs[1]
    assert sorted(epochs[0]) == [(e, f) for e in range(EPISODES) for f in range(LENGTH)]


def test_a_step_resume_keeps_the_checkpoints_pool_under_another_batch_size(many_episodes):
    steps = 20
    dataset = _dataset(many_episodes)
    full = [key for batch in streaming_dataloader(dataset, BATCH, 0) for key in _keys(batch)]
    identity = dict(dataset.identity)
    assert identity[RANK_POOL] == 4 * BATCH

    resumed = _dataset(many_episodes)
    resumed.resume_from_step(steps, BATCH, num_workers=0, identity=identity)
    rest = [key for batch in streaming_dataloader(resumed, 2 * BATCH, 0) for key in _keys(batch)]
    assert resumed.rank_pool == 4 * BATCH  # not 4 x 64: the schedule is the checkpoint's
    assert rest == full[steps * BATCH :]


def test_a_checkpoint_of_the_versions_before_resumes_with_their_pool_of_32(many_episodes):
    steps = 20
    # what they scheduled: a pool of 32 and the remaining strategy, their default
    before = _dataset(many_episodes, streaming_episode_pool_size=DEFAULT_RANK_POOL_SIZE, streaming_sampling_strategy="remaining")
    full = [key for batch in streaming_dataloader(before, BATCH, 0) for key in _keys(batch)]
    identity = {key: value for key, value in _dataset(many_episodes).identity.items() if key != RANK_POOL}
    identity[SAMPLING_STRATEGY] = "remaining"

    resumed = _dataset(many_episodes)
    resumed.resume_from_step(steps, BATCH, num_workers=0, identity=identity)
    rest = [key for batch in streaming_dataloader(resumed, BATCH, 0) for key in _keys(batch)]
    assert resumed.rank_pool is None
    assert rest == full[steps * BATCH :]
