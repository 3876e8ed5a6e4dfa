"""GOP-aware scheduling and decoding: anchors in key-frame-aligned runs, decoders that keep their
position, a bounded decoded-frame budget; coverage, determinism, resume and exact frames kept."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest
from torchdata.nodes import Loader

from lerobot_nodes import MapStyleLeRobotDataset, load_meta, open_source
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.metrics import WorkerMetrics
from lerobot_nodes.mp4 import DecodedFrameBudget
from lerobot_nodes.nodes import frame_order
from lerobot_nodes.nodes.pool_sampler import gop_run_starts
from lerobot_nodes.streaming_graph import build_streaming_graph
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.compare import assert_samples_equal
from lerobot_nodes.testing.resume_contract import assert_resumes_exactly

from .conftest import CAMERAS, DELTA_TIMESTAMPS
from .helpers import graph_options, make_sampler

STRATEGIES = ("remaining", "round_robin")
CONFIG = StreamingConfig(
    streaming_episode_pool_size=3,
    streaming_prefetch_episodes=2,
    streaming_decode_threads=2,
    streaming_decoded_queue_size=4,
    max_num_shards=2,
)
ACT = {"observation.images.top": [0.0], "observation.images.wrist": [0.0]}


@pytest.fixture(scope="module")
def h264_g30(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """H.264 with B-frames (x264 defaults), GOP 30, episodes of several GOPs, two cameras."""
    return write_dataset(
        tmp_path_factory.mktemp("gop") / "h264-g30",
        episode_lengths=[75, 64, 47, 90],
        cameras=CAMERAS,
        codec="h264",
        gop=30,
        video_files_size_in_mb=0.05,
        seed=11,
    )


def _graph(root: Path, config: StreamingConfig = CONFIG, **kwargs):
    source = open_source(root)
    meta = load_meta(source)
    kwargs.setdefault("return_uint8", True)
    kwargs.setdefault("seed", 1000)
    return build_streaming_graph(source, meta, list(range(len(meta.episodes))), config=config, **graph_options(**kwargs))


def _epoch(root: Path, config: StreamingConfig = CONFIG, **kwargs):
    metrics = WorkerMetrics()
    graph = _graph(root, config, metrics=metrics, **kwargs)
    samples = list(Loader(graph.root))
    graph.close()
    return samples, metrics.counters.totals()


# -- the schedule ----------------------------------------------------------------------------
def test_gop_runs_are_ascending_key_frame_aligned_runs_in_a_seeded_order():
    starts = gop_run_starts([np.array([0, 30, 60]), np.array([0, 30, 60])], lookback=2)
    assert starts.tolist() == [32, 62]
    runs = [list(range(0, 32)), list(range(32, 62)), list(range(62, 75))]
    orders = {tuple(frame_order(seed, 0, 3, 75, run_starts=starts).tolist()) for seed in range(12)}
    every = {tuple(runs[a] + runs[b] + runs[c]) for a, b, c in itertools.permutations(range(3))}
    assert orders <= every and len(orders) > 1  # whole runs, ascending, in a seeded order
    assert frame_order(7, 0, 3, 75, run_starts=starts).tolist() == frame_order(7, 0, 3, 75, run_starts=starts).tolist()
    # A camera's GOP start is a run start only where no camera is mid-GOP (more than the skew).
    assert gop_run_starts([np.array([0, 10]), np.array([0, 15])], lookback=0).tolist() == []
    assert gop_run_starts([np.array([0, 10]), np.array([0, 15])], lookback=0, max_skew=5).tolist() == [15]


def test_gop_starts_shifted_by_scene_cuts_keep_the_later_start_and_no_mid_gop_one():
    """x264 scene cuts shift one camera's GOPs by a frame or two (the benchmark's 3 cameras):
    the union of every camera's starts would make 1-frame runs whose start is mid-GOP for the
    other cameras, each costing them most of a GOP decoded and not delivered."""
    cameras = [np.array([0, 29, 59, 88, 116, 146]), np.array([0, 29, 58, 87, 105, 134]), np.array([0, 30, 59, 88, 117, 146])]
    assert gop_run_starts(cameras, lookback=0).tolist() == [30, 59, 88]
    assert gop_run_starts(cameras, lookback=2).tolist() == [32, 61, 90]
    aligned = [np.arange(0, 150, 30)] * 3
    assert gop_run_starts(aligned, lookback=0).tolist() == [30, 60, 90, 120]


@pytest.mark.parametrize("length", [1, 2, 7, 30, 31])
def test_two_frame_gops_without_history_keep_the_order_of_anchor_pairs(length):
    """LeRobot's g=2 with a camera read at +0: GOP runs are today's pairs, draw for draw."""
    starts = gop_run_starts([np.arange(0, length, 2)], lookback=0)
    for epoch in range(3):
        assert frame_order(5, epoch, 9, length, run_starts=starts).tolist() == frame_order(5, epoch, 9, length).tolist()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gop_run_schedule_covers_each_frame_once_and_keeps_the_resume_contract(strategy):
    episodes, lengths = list(range(6)), [40, 7, 63, 30, 12, 45]
    runs = {e: gop_run_starts([np.arange(0, n, 10)], lookback=2) for e, n in zip(episodes, lengths, strict=True)}

    def make():
        sampler = make_sampler(episodes, lengths, pool_size=3, strategy=strategy, seed=8)
        sampler.run_starts, sampler.runs = runs.__getitem__, "gop-lookback-2"
        return sampler

    reference = assert_resumes_exactly(make, cuts=[0, 1, 17, 100, 196, 197], consume=lambda i: (i.episode, i.frame))
    for epoch in reference:
        assert sorted(epoch) == sorted((e, f) for e, n in zip(episodes, lengths, strict=True) for f in range(n))
        for episode in episodes:  # each episode's anchors: ascending inside each run
            frames = [f for e, f in epoch if e == episode]
            starts = set(runs[episode].tolist()) | {0}
            assert all(b == a + 1 or b in starts for a, b in zip(frames, frames[1:], strict=False))
    assert reference[0] != reference[1]


def test_a_checkpoint_with_another_run_rule_is_refused():
    sampler = make_sampler([0, 1], [10, 10], seed=1)
    sampler.reset()
    next(sampler)
    state = sampler.state_dict()
    other = make_sampler([0, 1], [10, 10], seed=1)
    other.runs = "gop-lookback-0"
    with pytest.raises(ConfigError, match="streaming_gop_runs"):
        other.reset(state)


# -- the decoded-frame budget -------------------------------------------------------------------
def test_decoded_frame_budget_is_never_exceeded_and_counts_peaks():
    budget = DecodedFrameBudget(limit_bytes=1000)
    owners = [budget.register() for _ in range(3)]
    rng = np.random.default_rng(0)
    for step in range(500):
        owner = owners[int(rng.integers(3))]
        budget.put(owner, int(rng.integers(40)), object(), int(rng.integers(1, 400)), owner_limit=4)  # type: ignore[arg-type]
        assert budget.resident_bytes <= 1000 and budget.peak_bytes <= 1000, step
        assert budget.resident_frames <= 12
    assert budget.evictions > 0 and budget.peak_frames <= 12
    budget.release(owners[0])
    budget.forget(owners[1])
    budget.forget(owners[2])
    assert budget.resident_bytes == 0 and budget.resident_frames == 0


def test_config_splits_the_decoded_frame_budget_over_workers():
    config = StreamingConfig(streaming_decoded_frame_budget_mb=100)
    assert config.worker_decoded_frame_budget(0) == 100_000_000
    assert config.worker_decoded_frame_budget(4) == 25_000_000
    assert StreamingConfig().worker_decoded_frame_budget(2) == 512_000_000
    with pytest.raises(ConfigError, match="streaming_decoded_frame_budget_mb"):
        StreamingConfig(streaming_decoded_frame_budget_mb=0)
    with pytest.raises(ConfigError, match="streaming_gop_runs"):
        StreamingConfig(streaming_gop_runs="yes")  # type: ignore[arg-type]


# -- the whole graph on real videos ---------------------------------------------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("codec", ["h264_g30", "av1_dataset"])
@pytest.mark.parametrize("window", ["act", "history"])
def test_decoded_per_delivered_frame_is_at_most_1_3_and_samples_are_exact(codec, window, request):
    root = request.getfixturevalue(codec)
    delta = ACT if window == "act" else DELTA_TIMESTAMPS
    samples, totals = _epoch(root, delta_timestamps=delta)
    reference = MapStyleLeRobotDataset(root=root, delta_timestamps=delta, return_uint8=True)
    assert sorted(int(s["index"]) for s in samples) == list(range(len(reference)))
    for position, sample in enumerate(samples):
        assert_samples_equal(reference[int(sample["index"])], sample, f"{codec} {window} sample {position}")
    ratio = totals["frames_decoded"] / totals["frames_delivered"]
    assert ratio <= 1.3, f"{codec} {window}: {totals['frames_decoded']:.0f} decoded for {totals['frames_delivered']:.0f}"
    # The same schedule from the seed; the two-frame runs of before decode more at GOP 30.
    again, _ = _epoch(root, delta_timestamps=delta)
    assert [int(s["index"]) for s in again] == [int(s["index"]) for s in samples]
    if codec == "h264_g30" and window == "act":
        _, before = _epoch(root, StreamingConfig(**{**CONFIG.as_dict(), "streaming_gop_runs": False}), delta_timestamps=delta)
        assert before["frames_decoded"] / before["frames_delivered"] > 3 * ratio


@pytest.fixture(scope="module")
def h264_shifted_gops(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three H.264 cameras (B-frames), two with GOP 30 and one with GOP 29: GOP starts one to
    four frames apart, as x264 scene-cut key frames leave them (the long-GOP benchmark dataset)."""
    base = tmp_path_factory.mktemp("shifted-gops")
    settings = dict(episode_lengths=[90, 120, 75], cameras=THREE_CAMERAS, codec="h264", seed=5)
    root = write_dataset(base / "g30", gop=30, **settings)  # type: ignore[arg-type]
    other = write_dataset(base / "g29", gop=29, **settings)  # type: ignore[arg-type]
    shifted = Path("videos") / THREE_CAMERAS[2]
    shutil.rmtree(root / shifted)
    shutil.copytree(other / shifted, root / shifted)
    return root


THREE_CAMERAS = ("observation.images.top", "observation.images.wrist", "observation.images.side")
ACT_THREE = {"action": [i / 30 for i in range(50)], **{camera: [0.0] for camera in THREE_CAMERAS}}


@pytest.mark.timeout(300)
def test_cameras_with_shifted_gops_decode_at_most_1_3_per_delivered_and_stay_exact(h264_shifted_gops):
    """Runs started at every camera's GOP starts (their union) decoded 1.58 frames per delivered frame here."""
    root = h264_shifted_gops
    one_thread = StreamingConfig(**{**CONFIG.as_dict(), "streaming_decode_threads": 1})  # the same decode order every run
    samples, totals = _epoch(root, one_thread, delta_timestamps=ACT_THREE)
    reference = MapStyleLeRobotDataset(root=root, delta_timestamps=ACT_THREE, return_uint8=True)
    assert sorted(int(s["index"]) for s in samples) == list(range(len(reference)))
    for position, sample in enumerate(samples):
        assert_samples_equal(reference[int(sample["index"])], sample, f"sample {position}")
    ratio = totals["frames_decoded"] / totals["frames_delivered"]
    assert ratio <= 1.3, f"{totals['frames_decoded']:.0f} decoded for {totals['frames_delivered']:.0f}"


@pytest.mark.timeout(300)
def test_a_small_decoded_frame_budget_is_never_exceeded_and_frames_stay_exact(h264_g30):
    frame_bytes = 48 * 64 * 3
    budget_frames = 6
    config = StreamingConfig(
        **{**CONFIG.as_dict(), "streaming_decoded_frame_budget_mb": budget_frames * frame_bytes / 1e6}
    )
    metrics = WorkerMetrics()
    graph = _graph(h264_g30, config, metrics=metrics, delta_timestamps=DELTA_TIMESTAMPS)
    budget = graph.decoder.frame_budget
    assert budget.limit_bytes == budget_frames * frame_bytes
    reference = MapStyleLeRobotDataset(root=h264_g30, delta_timestamps=DELTA_TIMESTAMPS, return_uint8=True)
    count = 0
    for sample in Loader(graph.root):
        assert budget.resident_bytes <= budget.limit_bytes
        assert_samples_equal(reference[int(sample["index"])], sample, f"sample {count}")
        count += 1
    graph.close()
    totals = metrics.counters.totals()
    assert count == len(reference)
    assert 0 < totals["peak_decoded_bytes"] <= budget_frames * frame_bytes
    assert 0 < totals["peak_decoded_frames"] <= budget_frames
    assert totals["decoded_budget_bytes"] == budget_frames * frame_bytes
    assert budget.peak_bytes <= budget.limit_bytes and budget.resident_bytes == 0
    assert budget.evictions > 0  # the budget, not the per-decoder cap, was what bound the frames kept


@pytest.mark.timeout(600)
def test_graph_with_gop_runs_resumes_exactly(h264_g30):
    made = []

    def make_tracked():
        graph = _graph(h264_g30, delta_timestamps=DELTA_TIMESTAMPS)
        made.append(graph)
        return graph.root

    def consume(sample):
        return (int(sample["index"]), int(sample["observation.images.top"].sum()), int(sample["observation.images.wrist"].sum()))

    def close(node):
        for graph in made:
            if graph.root is node:
                graph.close()

    assert_resumes_exactly(make_tracked, cuts=[1, 37, 170], epochs=1, consume=consume, close=close)
