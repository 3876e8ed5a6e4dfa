"""A mixture of three datasets in one StreamingLeRobotDataset: coverage, parity, topology, resume, errors.

The datasets: LeRobot's own AV1 and H.264 writes (local folders, 8 and 6 episodes; the H.264 one
has an extra camera, ``left``), and a generated AV1 dataset served by the loopback Hub whose
``front`` camera the rename map calls ``top``. Every sample must equal what the map-style reader
returns for the dataset it came from (renamed, the extra camera dropped) plus its ``dataset_index``.
"""

from __future__ import annotations

import collections
import logging
import random

import pytest
import torch

from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.errors import ConfigError
from lerobot_nodes.format.mixture import MixtureMeta
from lerobot_nodes.loader import streaming_dataloader
from lerobot_nodes.sources import HubBucketSource, HubRepoSource, LocalSource
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.compare import assert_samples_equal

from .helpers import (
    AV1,
    CONFIG,
    DATA,
    FEW,
    H264,
    HUB_REPO,
    NAMES,
    all_frames,
    expected_sample,
    keys_of,
    mixture,
    references,
    sequence,
    unbatched,
)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_frame_of_each_dataset_once_per_epoch_and_equal_to_its_map_style_sample(
    hub, hub_folder, num_workers, caplog
):
    with caplog.at_level(logging.WARNING, logger="lerobot_nodes.mixture"):
        dataset = mixture()
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert dropped == [
        "features not shared by every dataset of the mixture are dropped "
        "(local/tiny-h264: observation.images.left)"
    ]
    assert isinstance(dataset.source.parts[0], HubRepoSource)
    assert all(isinstance(part, LocalSource) for part in dataset.source.parts[1:])
    # The Hub dataset reads through the node's disk byte cache, the local folders never do.
    assert dataset.source.byte_cache is dataset.source.parts[0].byte_cache is not None
    assert all(part.byte_cache is None for part in dataset.source.parts[1:])
    assert dataset.num_frames == 58 + 380 + 414 and dataset.num_episodes == 4 + 8 + 6
    assert (
        "observation.images.left" not in dataset.features
        and "observation.images.front" not in dataset.features
    )
    readers = references(hub_folder)
    wanted = all_frames(dataset)
    loader = streaming_dataloader(dataset, batch_size=8, num_workers=num_workers)
    for epoch in range(2):
        seen: collections.Counter[tuple[int, int]] = collections.Counter()
        for batch in loader:
            assert batch["dataset_index"].dtype == torch.int64
            for sample in unbatched(batch):
                key = (int(sample["dataset_index"]), int(sample["index"]))
                seen[key] += 1
                if epoch == 0:
                    expected = expected_sample(readers[key[0]], key[0], key[1], list(sample))
                    assert_samples_equal(expected, sample, where=f"dataset {key[0]} frame {key[1]}")
        assert set(seen) == wanted and set(seen.values()) == {1}, epoch
    assert dataset.source.http_stats.requests == dataset.source.parts[0].http_stats.requests > 0


def test_two_ranks_of_two_workers_are_disjoint_and_cover_the_mixture(hub):
    shares = []
    for rank in range(2):
        dataset = mixture(episodes=FEW, rank=rank, world_size=2)
        shares.append(
            [key for batch in streaming_dataloader(dataset, 4, num_workers=2) for key in keys_of(batch)]
        )
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == sorted(all_frames(mixture(episodes=FEW)))
    assert all({d for d, _ in share} for share in shares)


def test_same_seed_same_order(hub):
    first = sequence(streaming_dataloader(mixture(episodes=FEW), 4, 0), 12)
    again = sequence(streaming_dataloader(mixture(episodes=FEW), 4, 0), 12)
    other = sequence(streaming_dataloader(mixture(episodes=FEW, seed=6), 4, 0), 12)
    assert first == again and first != other


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resume_mid_epoch_gives_the_identical_remainder(hub, num_workers):
    frames = len(all_frames(mixture(episodes=FEW)))
    total = 2 * (frames // 4 + 2)  # about two epochs of batches of 4
    reference = sequence(streaming_dataloader(mixture(episodes=FEW), 4, num_workers), total)
    for stop in random.Random(num_workers).sample(range(1, total - 1), 2):
        loader = streaming_dataloader(mixture(episodes=FEW), 4, num_workers, snapshot_every_n_steps=1)
        head = []
        iterator = iter(loader)
        for _ in range(stop):
            try:
                head.append(keys_of(next(iterator)))
            except StopIteration:
                iterator = iter(loader)
                head.append(keys_of(next(iterator)))
        state = loader.state_dict()
        resumed = streaming_dataloader(mixture(episodes=FEW), 4, num_workers, snapshot_every_n_steps=1)
        resumed.load_state_dict(state)
        assert head + sequence(resumed, total - stop) == reference, f"resume after {stop} batches"


def test_resume_identity_covers_every_dataset_in_order(hub):
    state = mixture(episodes=FEW).state_dict()
    mixture(episodes=FEW).load_state_dict(state)  # the same mixture resumes
    swapped = mixture(
        repo_id=[NAMES[0], NAMES[2], NAMES[1]],
        root=[None, H264, AV1],
        episodes={HUB_REPO: [0, 2], "local/tiny-av1": [0, 3, 4], "local/tiny-h264": [1, 5]},
    )
    with pytest.raises(ConfigError, match="episode lengths"):
        swapped.load_state_dict(state)
    fewer = mixture(episodes={**FEW, "local/tiny-h264": [0, 3]})
    with pytest.raises(ConfigError, match="episode selection"):
        fewer.load_state_dict(state)


def test_a_single_dataset_keeps_its_identity():
    alone = StreamingLeRobotDataset(root=str(AV1), config=CONFIG)
    assert alone.identity["source"] == str(AV1) and not isinstance(alone.meta, MixtureMeta)
    assert "dataset_index" not in next(iter(alone))
    listed = StreamingLeRobotDataset(root=[AV1], config=CONFIG)  # a list of one is a mixture
    assert isinstance(listed.meta, MixtureMeta) and int(next(iter(listed))["dataset_index"]) == 0
    assert listed.identity["episode_lengths"] == alone.identity["episode_lengths"]


def test_episodes_dict_selects_per_dataset_and_names_unknown_datasets():
    dataset = StreamingLeRobotDataset(root=[AV1, H264], episodes={str(H264): [1, 2]}, config=CONFIG)
    assert dataset.episodes == list(range(8)) + [9, 10]
    with pytest.raises(ConfigError, match=r"not datasets of this mixture"):
        StreamingLeRobotDataset(root=[AV1, H264], episodes={"nope": [0]}, config=CONFIG)
    with pytest.raises(ConfigError, match=r"\{dataset: \[episodes\]\} dict"):
        StreamingLeRobotDataset(root=[AV1, H264], episodes=[0, 1], config=CONFIG)


def test_fps_mismatch_is_one_line_naming_both_datasets(tmp_path):
    other = write_dataset(tmp_path / "fps15", episode_lengths=[5, 6], fps=15, height=96, width=128)
    with pytest.raises(ConfigError) as error:
        StreamingLeRobotDataset(root=[AV1, other], config=CONFIG)
    message = str(error.value)
    assert "\n" not in message and str(AV1) in message and str(other) in message and "15 fps" in message


def test_shapes_that_differ_after_renaming_are_one_line_naming_both_datasets(tmp_path):
    small = write_dataset(
        tmp_path / "small", episode_lengths=[5, 6], height=48, width=64, state_dim=14, action_dim=14
    )
    with pytest.raises(ConfigError) as error:
        StreamingLeRobotDataset(root=[AV1, small], config=CONFIG)
    message = str(error.value)
    assert "\n" not in message and str(AV1) in message and str(small) in message
    assert "'observation.images.top' has shape [96, 128, 3]" in message


def test_rename_map_errors_name_the_dataset_and_the_feature():
    with pytest.raises(ConfigError, match=r"rename_map for .*tiny-av1 renames \['observation.images.nope'\]"):
        StreamingLeRobotDataset(
            root=[AV1, H264], rename_map={str(AV1): {"observation.images.nope": "x"}}, config=CONFIG
        )
    with pytest.raises(ConfigError, match="not datasets of this mixture"):
        StreamingLeRobotDataset(root=[AV1, H264], rename_map={"nope": {}}, config=CONFIG)
    with pytest.raises(ConfigError, match="rename_map applies to a mixture"):
        StreamingLeRobotDataset(root=AV1, rename_map={str(AV1): {}}, config=CONFIG)
    with pytest.raises(ConfigError, match="aligned"):
        StreamingLeRobotDataset(repo_id=["a", "b"], root=[AV1], config=CONFIG)


def test_resume_from_a_step_is_exact_and_elastic_resume_delivers_the_rest_once(hub):
    total = 12
    reference = sequence(streaming_dataloader(mixture(episodes=FEW), 4, 2), total)
    same = mixture(episodes=FEW)
    same.resume_from_step(5, batch_size=4, num_workers=2, world_size=1, seed=5)
    assert sequence(streaming_dataloader(same, 4, 2), total - 5) == reference[5:]
    # Another topology (2 workers -> 0): the old schedules are replayed over the mixture's episodes,
    # and the rest of the epoch comes once.
    elastic = mixture(episodes=FEW)
    elastic.resume_from_step(5, batch_size=4, num_workers=2, world_size=1, seed=5)
    rest = [key for batch in streaming_dataloader(elastic, 4, 0) for key in keys_of(batch)]
    head = [key for batch in reference[:5] for key in batch]
    assert sorted(head + rest) == sorted(all_frames(mixture(episodes=FEW)))


def test_one_root_holds_every_repo_id_as_in_lerobot_and_lists_need_a_mixture():
    dataset = StreamingLeRobotDataset(repo_id=[AV1.name, H264.name], root=DATA, config=CONFIG)
    assert [part.url for part in dataset.source.parts] == [LocalSource(AV1).url, LocalSource(H264).url]
    assert dataset.meta.names == (AV1.name, H264.name) and dataset.num_frames == 380 + 414
    with pytest.raises(ConfigError, match="revision or repo_type is a list"):
        StreamingLeRobotDataset(root=AV1, revision=["main"], config=CONFIG)


def test_the_mixture_source_routes_each_path_to_its_datasets_source():
    from lerobot_nodes.sources.mixture import MixtureSource

    parts = [LocalSource(AV1), LocalSource(H264)]
    source = MixtureSource(parts)
    assert source.url == f"mixture[{parts[0].url}, {parts[1].url}]" and source.revision is None
    info = source.info("1/meta/info.json")
    assert info.path == "1/meta/info.json" and info.size == parts[1].info("meta/info.json").size
    assert source.read_file("0/meta/info.json") == (AV1 / "meta" / "info.json").read_bytes()
    assert source.read_ranges("1/meta/info.json", [(0, 5), (2, 9)]) == parts[1].read_ranges(
        "meta/info.json", [(0, 5), (2, 9)]
    )
    assert source.byte_identity("0/meta/info.json") == parts[0].byte_identity("meta/info.json")
    listed = [f.path for f in source.list_files("1/meta/")]
    assert listed == ["1/" + f.path for f in parts[1].list_files("meta/")]
    everything = [f.path for f in source.list_files()]
    assert len(everything) == len(parts[0].list_files()) + len(
        parts[1].list_files()
    ) and everything == sorted(everything)
    for bad in ("meta/info.json", "2/meta/info.json"):
        with pytest.raises(FileNotFoundError):
            source.info(bad)
    assert not hasattr(source, "http_stats")  # local folders only: nothing read over HTTP


@pytest.mark.skipif(
    not hasattr(__import__("huggingface_hub").HfApi, "list_bucket_tree"),
    reason="Hub buckets need huggingface_hub >= 1.0 (the package says so; its floor is 0.30)",
)
def test_a_hub_repo_a_hub_bucket_and_a_local_folder_mix_every_frame_once(hub, hub_folder):
    # The AV1 dataset served as a Hub storage bucket: the three kinds of source in one mixture.
    bucket = "lerobot-nodes/mixture-bucket"
    hub.add_bucket(bucket, AV1)
    dataset = mixture(repo_id=[HUB_REPO, bucket, "local/tiny-h264"], root=[None, f"hf://buckets/{bucket}", H264])
    assert isinstance(dataset.source.parts[0], HubRepoSource)
    assert isinstance(dataset.source.parts[1], HubBucketSource)
    assert isinstance(dataset.source.parts[2], LocalSource)
    readers = references(hub_folder)
    seen: collections.Counter[tuple[int, int]] = collections.Counter()
    loader = streaming_dataloader(dataset, batch_size=8, num_workers=2)
    for batch in loader:
        for sample in unbatched(batch):
            key = (int(sample["dataset_index"]), int(sample["index"]))
            seen[key] += 1
            if key[0] == 1:  # the bucket's samples are the AV1 dataset's own
                expected = expected_sample(readers[1], 1, key[1], list(sample))
                assert_samples_equal(expected, sample, where=f"bucket frame {key[1]}")
    assert set(seen) == all_frames(dataset) and set(seen.values()) == {1}
    assert dataset.source.parts[1].http_stats.requests > 0
