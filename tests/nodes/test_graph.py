"""The whole graph on real datasets: map-style equality, coverage, budget, resume, errors, threads."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch
from torchdata.nodes import Loader

from lerobot_nodes import MapStyleLeRobotDataset, load_meta, open_source
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.errors import ByteBudgetError, EpisodeFetchError, GraphFailedError, VideoIndexError
from lerobot_nodes.fetch import EpisodeFetcher, direct_index_provider
from lerobot_nodes.streaming_graph import build_streaming_graph
from lerobot_nodes.testing.compare import assert_samples_equal

from .conftest import DELTA_TIMESTAMPS
from .helpers import graph_options, lerobot_threads

SMALL = StreamingConfig(
    streaming_episode_pool_size=3,
    streaming_prefetch_episodes=2,
    streaming_decode_threads=2,
    streaming_decoded_queue_size=4,
    max_num_shards=2,
)


def _graph(root: Path, config: StreamingConfig = SMALL, episodes=None, **kwargs):
    source = open_source(root)
    meta = load_meta(source)
    selected = list(range(len(meta.episodes))) if episodes is None else episodes
    kwargs.setdefault("delta_timestamps", DELTA_TIMESTAMPS)
    kwargs.setdefault("return_uint8", True)
    kwargs.setdefault("seed", 1000)
    return build_streaming_graph(source, meta, selected, config=config, **graph_options(**kwargs))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_every_sample_of_an_epoch_equals_the_map_style_sample(codec, request, monkeypatch):
    root = request.getfixturevalue(f"{codec}_dataset")
    graph = _graph(root)

    def parse_forbidden(clip):
        raise AssertionError("a decoder parsed a clip's moov: its plan's layout should have come with the clip")

    monkeypatch.setattr("lerobot_nodes.mp4.decode.read_clip_layout", parse_forbidden)
    samples = list(Loader(graph.root))
    reference = MapStyleLeRobotDataset(root=root, delta_timestamps=DELTA_TIMESTAMPS, return_uint8=True)
    assert sorted(int(s["index"]) for s in samples) == list(range(len(reference)))
    for position, sample in enumerate(samples):
        assert_samples_equal(reference[int(sample["index"])], sample, f"{codec} sample {position}")
    stats = graph.cache.stats()
    assert stats.episodes_fetched == 6 and stats.reserved_bytes == 0 and stats.resident_bytes == 0
    graph.close()
    assert lerobot_threads() == []


@pytest.mark.timeout(120)
def test_ranks_and_workers_cover_the_selection_disjointly(av1_dataset):
    selected = [0, 2, 3, 5]
    meta = load_meta(open_source(av1_dataset))
    expected = sorted(i for e in selected for i in range(*meta.episode_bounds(e)))
    seen: list[int] = []
    for rank in range(2):
        for worker in range(2):
            graph = _graph(
                av1_dataset, episodes=selected, rank=rank, world_size=2, worker_id=worker, num_workers=2,
                delta_timestamps=None, index_provider=direct_index_provider(open_source(av1_dataset)),
            )
            indices = [int(s["index"]) for s in Loader(graph.root)]
            assert len(indices) == graph.num_frames
            seen.extend(indices)
            graph.close()
    assert sorted(seen) == expected


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["remaining", "round_robin"])
def test_resume_from_random_points_equals_the_uninterrupted_run(strategy, h264_dataset):
    config = StreamingConfig(
        streaming_episode_pool_size=2, streaming_prefetch_episodes=1, streaming_sampling_strategy=strategy,
        streaming_decoded_queue_size=5, max_num_shards=2,
    )
    graph = _graph(h264_dataset, config)
    loader = Loader(graph.root)
    full = list(loader)
    graph.close()
    rng = random.Random(strategy)
    for cut in sorted(rng.sample(range(1, len(full)), 3)):
        run = _graph(h264_dataset, config)
        loader = Loader(run.root)
        iterator = iter(loader)
        for _ in range(cut):
            next(iterator)
        state = loader.state_dict()
        run.close()
        resumed = _graph(h264_dataset, config)
        resumed_loader = Loader(resumed.root)
        resumed_loader.load_state_dict(state)
        rest = list(resumed_loader)
        assert len(rest) == len(full) - cut, cut
        for position, (expected, actual) in enumerate(zip(full[cut:], rest, strict=True)):
            assert_samples_equal(expected, actual, f"cut {cut} + {position}")
        resumed.close()


@pytest.mark.timeout(120)
def test_reserved_bytes_never_exceed_a_budget_smaller_than_the_dataset(av1_dataset, h264_dataset):
    ratios = {}
    for root in (av1_dataset, h264_dataset):
        source = open_source(root)
        meta = load_meta(source)
        fetcher = EpisodeFetcher(source, meta, index_provider=direct_index_provider(source))
        costs = [fetcher.cost(e) for e in range(len(meta.episodes))]
        budget = int(1.6 * max(costs))
        assert sum(costs) > 2 * budget, "the budget must hold only a part of the dataset"
        config = StreamingConfig(
            streaming_episode_pool_size=4, streaming_prefetch_episodes=4, streaming_byte_budget_gb=budget / 1e9,
            streaming_decoded_queue_size=8, max_num_shards=4,
        )
        graph = _graph(root, config)
        observed = 0
        count = 0
        for _ in Loader(graph.root):
            observed = max(observed, graph.cache.reserved_bytes)
            count += 1
        assert count == meta.total_frames
        peak = max(observed, graph.cache.max_reserved_bytes)
        budget_bytes = config.worker_byte_budget(0)
        assert peak <= budget_bytes
        ratios[root.name] = peak / budget_bytes
        graph.close()
    print(f"\nmax reserved/budget on generated datasets: {ratios}")


# Three episodes of each LeRobot-written dataset; any one of them fits the budget, all three do not.
LEROBOT_EPISODES = {"lerobot-writer-tiny-av1": [1, 3, 7], "lerobot-writer-tiny-h264": [2, 3, 4]}


@pytest.mark.timeout(120)
def test_a_lerobot_written_dataset_streams_within_a_small_budget(lerobot_written):
    root, episodes = lerobot_written.root, LEROBOT_EPISODES[lerobot_written.name]
    source = open_source(root)
    meta = load_meta(source)
    provider = direct_index_provider(source)
    costs = [EpisodeFetcher(source, meta, index_provider=provider).cost(e) for e in episodes]
    config = StreamingConfig(
        streaming_episode_pool_size=2, streaming_prefetch_episodes=2,
        streaming_byte_budget_gb=1.5 * max(costs) / 1e9, max_num_shards=2,
    )
    graph = _graph(root, config, episodes=episodes, delta_timestamps=None, index_provider=provider)
    samples = []
    peak = 0
    for sample in Loader(graph.root):
        samples.append(sample)
        peak = max(peak, graph.cache.reserved_bytes)
    peak = max(peak, graph.cache.max_reserved_bytes)
    assert peak <= config.worker_byte_budget(0) < sum(costs)
    print(f"\n{root.name}: max reserved/budget = {peak / config.worker_byte_budget(0):.3f}")
    reference = MapStyleLeRobotDataset(root=root, episodes=episodes, return_uint8=True)
    assert len(samples) == len(reference)
    by_index = {int(s["index"]): s for s in samples}
    for position in range(0, len(reference), 7):
        expected = reference[position]
        assert_samples_equal(expected, by_index[int(expected["index"])], f"position {position}")
    graph.close()


@pytest.mark.timeout(60)
def test_an_episode_larger_than_the_rank_budget_fails_before_any_payload_is_read(av1_dataset):
    config = StreamingConfig(streaming_byte_budget_gb=1e-6)  # 1000 bytes
    graph = _graph(av1_dataset, config)
    with pytest.raises(ByteBudgetError) as error:
        next(iter(Loader(graph.root)))
    message = str(error.value)
    assert "needs" in message and "1000 bytes" in message and "streaming_byte_budget_gb" in message
    assert graph.cache.stats().episodes_fetched == 0
    graph.close()


@pytest.mark.timeout(60)
def test_a_truncated_video_fails_with_the_episode_file_and_range(av1_dataset, tmp_path):
    root = tmp_path / "broken"
    shutil.copytree(av1_dataset, root)
    source = open_source(root)
    meta = load_meta(source)
    # Indexes taken before the file changed (a stale cache, or a store that lost bytes).
    indexes = direct_index_provider(source)(meta.video_files())
    victim = meta.video_file(5, "observation.images.wrist")
    size = (root / victim).stat().st_size
    with open(root / victim, "r+b") as handle:
        handle.truncate(size - 200)
    graph = _graph(root, delta_timestamps=None, index_provider=lambda paths: {p: indexes[p] for p in paths})
    loader = iter(Loader(graph.root))
    with pytest.raises(EpisodeFetchError) as error:
        for _ in range(meta.total_frames):
            next(loader)
    message = str(error.value)
    assert "episode 5" in message and victim in message and "byte ranges [" in message
    with pytest.raises(GraphFailedError):
        next(loader)
    graph.close()
    assert lerobot_threads() == []
    # Indexed after the truncation, the file is refused when the graph opens its indexes.
    fresh = _graph(root, delta_timestamps=None, index_provider=direct_index_provider(open_source(root)))
    with pytest.raises(VideoIndexError, match="truncated"):
        next(iter(Loader(fresh.root)))
    fresh.close()


@pytest.mark.timeout(60)
def test_a_corrupt_parquet_file_fails_with_the_episode_and_file(tabular_dataset, tmp_path):
    root = tmp_path / "broken"
    shutil.copytree(tabular_dataset, root)
    meta = load_meta(open_source(root))
    victim = meta.data_file(len(meta.episodes) - 1)
    data = bytearray((root / victim).read_bytes())
    data[4:200] = b"\x00" * 196  # the first row group's pages; the footer stays readable
    (root / victim).write_bytes(bytes(data))
    graph = _graph(root, delta_timestamps=None)
    with pytest.raises(EpisodeFetchError) as error:
        list(Loader(graph.root))
    assert victim in str(error.value) and "episode" in str(error.value)
    graph.close()


@pytest.mark.timeout(60)
def test_tabular_epochs_change_order_and_threads_stop(tabular_dataset):
    graph = _graph(tabular_dataset, delta_timestamps={"action": [-1 / 30, 0.0]})
    loader = Loader(graph.root)
    first = [int(s["index"]) for s in loader]
    second = [int(s["index"]) for s in loader]
    assert sorted(first) == sorted(second) == list(range(len(first))) and first != second
    assert graph.sharder.epoch == 1
    graph.close()
    assert lerobot_threads() == []
    again = _graph(tabular_dataset, delta_timestamps={"action": [-1 / 30, 0.0]}, epoch=1)
    assert [int(s["index"]) for s in Loader(again.root)] == second
    again.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("on_consumer", [False, True])
def test_state_after_an_offset_skips_without_fetching(on_consumer, tabular_dataset):
    kwargs = {"delta_timestamps": None, "image_transforms": (lambda x: x), "transforms_on_consumer": on_consumer}
    graph = _graph(tabular_dataset, **kwargs)
    full = [int(s["index"]) for s in Loader(graph.root)]
    graph.close()
    for offset in (0, 7, len(full) - 1, len(full)):
        fresh = _graph(tabular_dataset, **kwargs)
        fresh.root.reset(fresh.state_after(offset, epoch=0))
        assert fresh.cache.stats().episodes_fetched == 0
        assert [int(s["index"]) for s in fresh.root] == full[offset:]
        fresh.close()
    with pytest.raises(ValueError, match="cannot skip"):
        _graph(tabular_dataset, **kwargs).state_after(len(full) + 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("on_consumer", [False, True])
def test_image_transforms_match_map_style(on_consumer, av1_dataset):
    def flip(frames: torch.Tensor) -> torch.Tensor:
        return torch.flip(frames, dims=[-1])

    graph = _graph(av1_dataset, episodes=[2, 4], image_transforms=flip, transforms_on_consumer=on_consumer)
    reference = MapStyleLeRobotDataset(
        root=av1_dataset, episodes=[2, 4], delta_timestamps=DELTA_TIMESTAMPS, image_transforms=flip, return_uint8=True
    )
    meta = reference.meta
    starts = {e: meta.episode_bounds(e)[0] for e in (2, 4)}
    offsets = {2: 0, 4: int(meta.episodes.length[2])}
    for sample in Loader(graph.root):
        episode = int(sample["episode_index"])
        position = offsets[episode] + int(sample["index"]) - starts[episode]
        assert_samples_equal(reference[position], sample, f"episode {episode}")
    graph.close()


@pytest.mark.timeout(60)
def test_metrics_count_samples_frames_bytes_and_budget(av1_dataset):
    from lerobot_nodes.metrics import WorkerMetrics

    metrics = WorkerMetrics()
    graph = _graph(av1_dataset, episodes=[0, 1], metrics=metrics, delta_timestamps=None)
    count = sum(1 for _ in Loader(graph.root))
    totals = metrics.counters.totals()
    stats = graph.cache.stats()
    assert count == 51 and totals["samples"] == count
    assert totals["frames_delivered"] == 2 * count and totals["frames_decoded"] >= 2 * count
    assert totals["episodes_fetched"] == 2
    assert totals["bytes_fetched"] == totals["bytes_planned"] == stats.fetched_bytes > 0
    assert totals["budget_bytes"] == 8_000_000_000
    assert 0 < totals["peak_reserved_bytes"] == stats.max_reserved_bytes
    assert totals["reserved_bytes"] == totals["resident_bytes"] == 0
    assert totals["refill_stalls"] >= 0 and totals["decode_seconds"] > 0
    graph.close()
