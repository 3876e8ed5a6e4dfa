"""The ready-made graphs of ``graphs/``: default, round robin, resumable weighted mix."""

from __future__ import annotations

import collections

import pytest
import torch
from lerobot_nodes.graphs import round_robin_graph, streaming_graph, weighted_mix_graph
from lerobot_nodes.graphs.weighted_mix import DATASET_KEY
from torchdata.nodes import Loader

from lerobot_nodes import MapStyleLeRobotDataset
from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.testing import write_dataset

CONFIG = StreamingConfig(streaming_episode_pool_size=3, streaming_prefetch_episodes=2, max_num_shards=2)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, monkeypatch_module):
    base = tmp_path_factory.mktemp("graphs")
    monkeypatch_module.setenv("HF_LEROBOT_HOME", str(base / "home"))
    video = write_dataset(base / "video", episode_lengths=[12, 9, 15, 7], cameras=("observation.images.top",), seed=2)
    tabular = write_dataset(base / "tabular", episode_lengths=[6, 11, 4, 9, 5], cameras=(), seed=3)
    return video, tabular


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.timeout(120)
def test_default_graph_streams_an_epoch_equal_to_map_style(datasets):
    video, _ = datasets
    delta = {"action": [0.0, 1 / 30], "observation.images.top": [-1 / 30, 0.0]}
    graph = streaming_graph(video, config=CONFIG, seed=7, delta_timestamps=delta, return_uint8=True)
    samples = list(Loader(graph.root))
    reference = MapStyleLeRobotDataset(root=video, delta_timestamps=delta, return_uint8=True)
    assert sorted(int(s["index"]) for s in samples) == list(range(len(reference)))
    for sample in samples:
        expected = reference[int(sample["index"])]
        assert list(expected) == list(sample)
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == sample[key].dtype and torch.equal(value, sample[key]), key
            else:
                assert value == sample[key], key
    graph.close()


@pytest.mark.timeout(60)
def test_round_robin_graph_visits_every_resident_episode_each_round(datasets):
    _, tabular = datasets
    graph = round_robin_graph(tabular, config=CONFIG, seed=1)
    assert graph.sampler.strategy == "round_robin" and graph.sampler.pool_size == 3
    episodes = [int(s["episode_index"]) for s in Loader(graph.root)]
    assert len(episodes) == 35
    assert len(set(episodes[:3])) == 3  # the first round: one frame of each of the 3 resident episodes
    graph.close()


@pytest.mark.timeout(120)
def test_weighted_mix_keeps_the_weights_covers_each_dataset_and_resumes_exactly(datasets):
    video, tabular = datasets
    roots = {"video": video, "tabular": tabular}
    weights = {"video": 0.4, "tabular": 0.6}
    total = 400  # the mix never ends by itself: about 4 epochs of video (43 frames), 7 of tabular (35)

    def keys(samples, count):
        return [(s[DATASET_KEY], int(s["dataset_index"]), int(s["index"])) for _, s in zip(range(count), samples, strict=False)]

    mix = weighted_mix_graph(roots, weights, seed=3, config=CONFIG, rank=0, world_size=1)
    full = keys(Loader(mix.root), total)
    mix.close()
    assert {(name, index) for name, index, _ in full} == {("video", 0), ("tabular", 1)}
    counts = collections.Counter(name for name, _, _ in full)
    assert abs(counts["video"] / total - 0.4) < 0.05, counts  # the frames' shares would be 43/78
    for name, frames in {"video": 43, "tabular": 35}.items():
        visits = collections.Counter(index for dataset, _, index in full if dataset == name)
        assert set(visits) == set(range(frames)), name
        assert max(visits.values()) - min(visits.values()) <= 2, name  # each frame once per the dataset's epoch
    for cut in (1, total // 3, total - 2):
        run = weighted_mix_graph(roots, weights, seed=3, config=CONFIG, rank=0, world_size=1)
        loader = Loader(run.root)
        iterator = iter(loader)
        head = keys(iterator, cut)
        state = loader.state_dict()
        run.close()
        resumed = weighted_mix_graph(roots, weights, seed=3, config=CONFIG, rank=0, world_size=1)
        resumed_loader = Loader(resumed.root)
        resumed_loader.load_state_dict(state)
        assert head + keys(resumed_loader, total - cut) == full, cut
        resumed.close()
