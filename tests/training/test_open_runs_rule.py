"""Open runs sized for the batch (issue 24 item 3).

An episode's anchor runs are open at once so that its samples in one batch come from different runs;
more runs than a batch needs mix a batch no better and cost every resident episode's decoders their
frames. New runs open as many as the budget holds but no more than that need, read the runs of an
episode with fewer runs than a batch takes of it in strands, record the rule in their identity, and a
checkpoint of the versions before (``batch``: no strands; no rule recorded: as many runs as the budget
holds) resumes with its own rule, exactly.
"""

from __future__ import annotations

import collections

import pytest

from lerobot_nodes import StreamingConfig, StreamingLeRobotDataset, streaming_dataloader
from lerobot_nodes.batch_mixing import MixingTally
from lerobot_nodes.config import OPEN_RUNS_FOR_BATCH, OPEN_RUNS_FOR_BUDGET, OPEN_RUNS_STRANDED
from lerobot_nodes.resume.identity import OPEN_RUNS, open_runs_rule_of, with_open_runs_rule
from lerobot_nodes.streaming_graph import MAX_OPEN_RUNS, ScheduleStart, batch_open_runs, open_runs_needed
from lerobot_nodes.testing import write_dataset

EPISODES, LENGTH, BATCH, SEED = 60, 12, 16, 3


@pytest.fixture(scope="module")
def short_episodes(tmp_path_factory):
    """60 episodes of 12 frames, one camera, AV1 with GOPs of 2 (as LeRobot writes it): 6 runs each."""
    return write_dataset(
        tmp_path_factory.mktemp("open-runs") / "ds", episode_lengths=[LENGTH] * EPISODES,
        cameras=("observation.images.top",), seed=4,
    )  # fmt: skip


def _dataset(root, **options) -> StreamingLeRobotDataset:
    return StreamingLeRobotDataset(root=root, seed=SEED, return_uint8=True, config=StreamingConfig(**options))


def _keys(batch) -> list[tuple[int, int]]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))


def _epoch(dataset: StreamingLeRobotDataset) -> list[tuple[int, int]]:
    loader = streaming_dataloader(dataset, BATCH, 0)
    keys = [key for batch in loader for key in _keys(batch)]
    dataset.close()
    return keys


def test_the_runs_a_batch_needs():
    # A pool of at least a batch of episodes: each episode at most about once per batch, twice across rounds.
    assert batch_open_runs(128, 128) == batch_open_runs(32, 40) == 2
    # Fewer resident episodes than a batch's samples: each gives a batch several, one per run.
    assert batch_open_runs(128, 16) == 3 and batch_open_runs(128, 6) == 7
    assert batch_open_runs(None, 8) == 2  # the pool of 32 of a reader that does not know its batch size
    config = StreamingConfig()
    assert open_runs_needed(config, ScheduleStart(rank_pool=128), 128) == 2
    assert open_runs_needed(config, ScheduleStart(rank_pool=128, open_runs_rule=OPEN_RUNS_FOR_BUDGET), 128) is None
    # A pool size the user sets keeps the budget rule: its schedule never depends on the batch size.
    assert open_runs_needed(StreamingConfig(streaming_episode_pool_size=16), ScheduleStart(rank_pool=128), 16) is None


def test_a_new_run_opens_the_runs_its_batch_needs_and_records_the_rule(short_episodes):
    dataset = _dataset(short_episodes)
    loader = streaming_dataloader(dataset, BATCH, 0)
    first = _keys(next(iter(loader)))
    assert dataset.identity[OPEN_RUNS] == OPEN_RUNS_STRANDED
    assert dataset._graph is not None and dataset._graph.sampler.open_runs == 2  # the budget alone: 8
    assert dataset._graph.sampler.strands is None  # a batch takes one sample of an episode at most
    assert len({episode for episode, _ in first}) == BATCH  # a pool of 60 resident episodes: one sample each
    dataset.close()
    before = _dataset(short_episodes)
    before.identity = with_open_runs_rule(before.identity, OPEN_RUNS_FOR_BUDGET)
    next(iter(streaming_dataloader(before, BATCH, 0)))
    assert before._graph is not None and before._graph.sampler.open_runs == MAX_OPEN_RUNS
    before.close()


def test_an_epoch_covers_every_frame_once_in_a_seeded_order(short_episodes):
    first, again = _epoch(_dataset(short_episodes)), _epoch(_dataset(short_episodes))
    assert collections.Counter(first) == {(e, f): 1 for e in range(EPISODES) for f in range(LENGTH)}
    assert first == again


@pytest.mark.parametrize("rule", [OPEN_RUNS_STRANDED, OPEN_RUNS_FOR_BATCH, OPEN_RUNS_FOR_BUDGET])
def test_a_step_resume_keeps_the_checkpoints_rule(short_episodes, rule):
    steps = 7
    checkpointed = _dataset(short_episodes)
    checkpointed.identity = with_open_runs_rule(checkpointed.identity, rule)
    full = _epoch(checkpointed)
    identity = dict(checkpointed.identity)  # as a checkpoint records it (the loader has sized the pool)
    assert (OPEN_RUNS in identity) == (rule != OPEN_RUNS_FOR_BUDGET)  # the versions before recorded none

    resumed = _dataset(short_episodes)
    resumed.resume_from_step(steps, BATCH, num_workers=0, identity=identity)
    assert open_runs_rule_of(resumed.identity) == rule
    assert _epoch(resumed) == full[steps * BATCH :]


@pytest.fixture(scope="module")
def few_long_gop_episodes(tmp_path_factory):
    """4 episodes of 60 frames, one H.264 camera with GOP 30 and B-frames: 2 runs per episode, and a
    batch of 16 takes 4 samples of each."""
    return write_dataset(
        tmp_path_factory.mktemp("strands") / "ds", episode_lengths=[60] * 4,
        cameras=("observation.images.top",), codec="h264", gop=30, seed=5,
    )  # fmt: skip


def _near_pairs(keys: list[tuple[int, int]]) -> float:
    tally = MixingTally()
    for start in range(0, len(keys) - BATCH + 1, BATCH):
        batch = keys[start : start + BATCH]
        tally.observe([e for e, _ in batch], [f for _, f in batch])
    return tally.figures([60] * 4).near_pairs


@pytest.mark.parametrize("num_workers", [0, 2])
def test_few_long_gop_episodes_read_their_runs_in_strands(few_long_gop_episodes, num_workers):
    """Each epoch still covers every frame once in a seeded order; the strands leave no two samples of
    a run within 5 frames in a batch where the runs read forward gave a batch neighbouring frames; a
    checkpoint of the rule before strands resumes without them, exactly."""
    stranded = _dataset(few_long_gop_episodes)
    loader = streaming_dataloader(stranded, BATCH, num_workers)
    keys = [key for batch in loader for key in _keys(batch)]
    assert collections.Counter(keys) == {(e, f): 1 for e in range(4) for f in range(60)}
    if num_workers == 0:
        assert stranded._graph is not None and stranded._graph.sampler.strands is not None
        assert _epoch(_dataset(few_long_gop_episodes)) == keys
    stranded.close()
    forward = _dataset(few_long_gop_episodes)
    forward.identity = with_open_runs_rule(forward.identity, OPEN_RUNS_FOR_BATCH)
    forward_keys = [key for batch in streaming_dataloader(forward, BATCH, num_workers) for key in _keys(batch)]
    forward.close()
    assert sorted(forward_keys) == sorted(keys) and forward_keys != keys
    assert _near_pairs(keys) < _near_pairs(forward_keys) / 4


def test_an_elastic_resume_of_stranded_runs_delivers_the_rest_once(few_long_gop_episodes):
    """A 2-rank run stopped mid-epoch continues as 1 rank with 2 workers: the episodes it had started
    continue their stranded order (the strands are a function of the settings and the indexes, not of
    the topology), and the epoch delivers every frame exactly once."""
    stop, batch = 3, BATCH
    delivered = []
    for rank in range(2):
        dataset = StreamingLeRobotDataset(root=few_long_gop_episodes, seed=SEED, return_uint8=True, rank=rank, world_size=2)
        iterator = iter(streaming_dataloader(dataset, batch, 0))
        delivered += [key for _ in range(stop) for key in _keys(next(iterator))]
        sampler = dataset._graph.sampler if dataset._graph is not None else None
        assert sampler is not None and sampler.strands is not None
        assert sampler.strands.ways(min(sampler.open_runs, 2), 30) == 2  # 4 samples a batch over 2 runs of 30
        dataset.close()
    resumed = StreamingLeRobotDataset(root=few_long_gop_episodes, seed=SEED, return_uint8=True)
    resumed.resume_from_step(stop, batch, 0, world_size=2, seed=SEED)
    rest = [key for b in streaming_dataloader(resumed, batch, 2) for key in _keys(b)]
    resumed.close()
    assert collections.Counter(delivered + rest) == {(e, f): 1 for e in range(4) for f in range(60)}


@pytest.mark.parametrize(
    ("camera_deltas", "asked_once"), [(None, True), ([0.0], True), ([-1 / 30, 0.0], False), ([-1 / 30], False)]
)
def test_decoders_drop_a_frame_once_returned_only_when_each_frame_is_asked_for_once(
    few_long_gop_episodes, camera_deltas, asked_once
):
    """A camera window of the anchor's own frame asks for each frame once per epoch, so decoders drop
    it once returned; a window of history, or an offset clamped at the episode's edges, asks again."""
    deltas = {"action": [i / 30 for i in range(5)]}
    if camera_deltas is not None:
        deltas["observation.images.top"] = camera_deltas
    dataset = StreamingLeRobotDataset(
        root=few_long_gop_episodes, seed=SEED, return_uint8=True, delta_timestamps=deltas
    )
    keys = [key for batch in streaming_dataloader(dataset, BATCH, 0) for key in _keys(batch)]
    assert dataset._graph is not None and dataset._graph.decoder.decoders.asked_once is asked_once
    report = dataset.metrics.report()
    dataset.close()
    assert collections.Counter(keys) == {(e, f): 1 for e in range(4) for f in range(60)}
    assert report.decoded_per_delivered < 1.3
