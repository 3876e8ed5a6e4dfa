"""``streaming_bad_episodes=raise|skip`` on a real LeRobot-layout dataset damaged for real.

The dataset (``lerobot_nodes.testing.write_dataset``) has one data Parquet and one MP4 per episode.
Three kinds of damage, as a half-finished upload or a careless converter leaves them: an MP4
deleted (episode 2), an episode whose metadata places more frames than its MP4 has (episode 5:
its span ends 0.5 s past the file's last frame), and a data Parquet cut in half (episode 6).
``raise`` stops with one line naming the file and the episode; ``skip`` streams every frame of the
other episodes exactly once (0 and 2 workers, 2 ranks disjoint), lists the skipped ones in the
report and the resume identity, and resumes exactly; a resume that finds another skipped set is
refused with one line.
"""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import numpy as np
import pytest

from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.dataset_doctor import check_dataset, episodes_to_skip, tolerant_open
from lerobot_nodes.errors import ConfigError, LeRobotNodesError, MetadataError
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.loader import streaming_dataloader
from lerobot_nodes.nodes.sharder import rank_episodes
from lerobot_nodes.sidecar import open_video_indexes
from lerobot_nodes.sources.resolve import open_source
from lerobot_nodes.testing import write_dataset
from lerobot_nodes.testing.damage import cut_parquet, delete_mp4, episode_files, lengthen_span

LENGTHS = [40, 50, 45, 60, 35, 55, 42, 48]
CAMERA = "observation.images.top"
MISSING_MP4, LONG_SPAN, CUT_PARQUET = 2, 5, 6
BAD = {MISSING_MP4, LONG_SPAN, CUT_PARQUET}
GOOD = [e for e in range(len(LENGTHS)) if e not in BAD]
CONFIG = StreamingConfig(streaming_episode_pool_size=2, streaming_prefetch_episodes=2, streaming_decode_threads=1)
SKIP = StreamingConfig(**{**CONFIG.as_dict(), "streaming_bad_episodes": "skip"})
SEED = 7


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(
        tmp_path_factory.mktemp("bad-episodes") / "dataset", episode_lengths=LENGTHS, seed=3, cameras=(CAMERA,),
        data_file_size_in_mb=0.003, video_files_size_in_mb=0.01,
    )  # fmt: skip


def paths_of(root: Path, episode: int) -> tuple[str, str]:
    return episode_files(root, episode, CAMERA)


def damage_all(root: Path) -> Path:
    delete_mp4(root, MISSING_MP4, CAMERA)
    lengthen_span(root, LONG_SPAN, CAMERA, 0.5)
    cut_parquet(root, CUT_PARQUET)
    return root


@pytest.fixture
def damaged(pristine: Path, tmp_path: Path) -> Path:
    return damage_all(Path(shutil.copytree(pristine, tmp_path / "dataset")))


def copy(pristine: Path, tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / name))


def dataset(root: Path, config: StreamingConfig = SKIP, **kwargs) -> StreamingLeRobotDataset:  # type: ignore[no-untyped-def]
    return StreamingLeRobotDataset(root=root, config=config, seed=SEED, return_uint8=True, **kwargs)


def pairs(batch) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))


def epoch(loader) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    return [pair for batch in loader for pair in pairs(batch)]


def frames_of(episodes: list[int]) -> collections.Counter[tuple[int, int]]:
    return collections.Counter((e, f) for e in episodes for f in range(LENGTHS[e]))


# -- raise --------------------------------------------------------------------------------------


def test_raise_names_the_missing_mp4_and_the_episode_that_needs_it(pristine: Path, tmp_path: Path) -> None:
    root = copy(pristine, tmp_path, "missing")
    delete_mp4(root, MISSING_MP4, CAMERA)
    mp4 = paths_of(pristine, MISSING_MP4)[1]
    with pytest.raises(MetadataError, match=rf"^{mp4} is missing from .*; episode {MISSING_MP4} of the selection needs it "):
        dataset(root, config=CONFIG)


def test_a_missing_file_refuses_only_the_episodes_that_use_it(pristine: Path, tmp_path: Path) -> None:
    root = copy(pristine, tmp_path, "missing")
    delete_mp4(root, MISSING_MP4, CAMERA)
    for config in (CONFIG, SKIP):
        chosen = dataset(root, config=config, episodes=[0, 3])
        assert chosen.skipped.kinds == {}
        assert collections.Counter(epoch(streaming_dataloader(chosen, 4, 0))) == frames_of([0, 3])


def test_raise_names_the_span_past_the_end_of_the_mp4(pristine: Path, tmp_path: Path) -> None:
    root = copy(pristine, tmp_path, "span")
    lengthen_span(root, LONG_SPAN, CAMERA, 0.5)
    with pytest.raises(MetadataError, match=rf"episode {LONG_SPAN} \(camera {CAMERA}\): meta/episodes places its frames"):
        dataset(root, config=CONFIG)


def test_raise_keeps_the_identity_of_the_versions_before_the_option(pristine: Path) -> None:
    assert "skipped_episodes" not in dataset(pristine, config=CONFIG).identity
    assert dataset(pristine).identity["skipped_episodes"] == "none"


# -- skip ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_streams_every_other_frame_exactly_once(damaged: Path, num_workers: int) -> None:
    chosen = dataset(damaged)
    assert sorted(chosen.skipped.episodes.tolist()) == sorted(BAD)
    assert set(chosen.skipped.kinds) == {"video file missing", "video span past the end of its MP4", "data file unreadable"}
    loader = streaming_dataloader(chosen, 4, num_workers)
    first, second = epoch(loader), epoch(loader)
    for seen in (first, second):
        assert collections.Counter(seen) == frames_of(GOOD)
    assert first != second  # the next epoch is another order of the same frames
    again = epoch(streaming_dataloader(dataset(damaged), 4, num_workers))
    assert again == first  # same seed, same order


def test_the_report_and_the_identity_list_the_skipped_episodes(damaged: Path) -> None:
    chosen = dataset(damaged)
    report = chosen.metrics.report()
    assert len(report.skipped_episodes) == 3
    table = report.table()
    mp4 = paths_of(damaged, MISSING_MP4)[1]
    assert f"video file missing: episode {MISSING_MP4}: {mp4} is not in" in table
    assert f"data file unreadable: episode {CUT_PARQUET}: " in table and "no PAR1 magic" in table
    assert f"video span past the end of its MP4: episode {LONG_SPAN}: " in table
    assert "skipped as bad: " in report.line()
    assert chosen.identity["skipped_episodes"].startswith("3 episodes #") and "(2, 5, 6)" in chosen.identity["skipped_episodes"]


def test_two_ranks_drop_only_their_own_bad_episodes(damaged: Path, pristine: Path) -> None:
    lengths = LENGTHS
    seen: collections.Counter[tuple[int, int]] = collections.Counter()
    for rank in (0, 1):
        healthy_share = rank_episodes(list(range(len(lengths))), lengths, rank, 2, SEED)
        chosen = dataset(damaged, rank=rank, world_size=2)
        # the rank split is the one of the undamaged dataset: the other rank's episodes never move
        assert set(chosen.skipped.episodes.tolist()) == BAD & set(healthy_share)
        frames = epoch(streaming_dataloader(chosen, 4, 2 if len(set(healthy_share) - BAD) >= 2 else 0))
        assert collections.Counter(frames) == frames_of(sorted(set(healthy_share) - BAD))
        seen.update(frames)
    assert seen == frames_of(GOOD)


def test_a_rank_checks_only_the_files_of_its_own_episodes(pristine: Path, tmp_path: Path) -> None:
    root = copy(pristine, tmp_path, "other-rank")
    owners = {rank: rank_episodes(list(range(len(LENGTHS))), LENGTHS, rank, 2, SEED) for rank in (0, 1)}
    delete_mp4(root, owners[0][0], CAMERA)
    with pytest.raises(MetadataError, match=rf"episode {owners[0][0]} of the selection needs it"):
        dataset(root, config=CONFIG, rank=0, world_size=2)
    other = dataset(root, config=CONFIG, rank=1, world_size=2)  # its files are all there: raise opens
    assert collections.Counter(epoch(streaming_dataloader(other, 4, 0))) == frames_of(owners[1])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stateful_dataloader_resume_is_exact(damaged: Path, num_workers: int) -> None:
    reference = epoch(streaming_dataloader(dataset(damaged), 4, num_workers))
    loader = streaming_dataloader(dataset(damaged), 4, num_workers, snapshot_every_n_steps=1)
    iterator = iter(loader)
    head = [pair for _ in range(9) for pair in pairs(next(iterator))]
    state = loader.state_dict()
    del iterator, loader
    resumed = streaming_dataloader(dataset(damaged), 4, num_workers, snapshot_every_n_steps=1)
    resumed.load_state_dict(state)
    assert head + epoch(resumed) == reference


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_step_offset_resume_in_the_same_topology_is_exact(damaged: Path, num_workers: int) -> None:
    batches = [pairs(batch) for batch in streaming_dataloader(dataset(damaged), 4, num_workers)]
    step = 11
    resumed = dataset(damaged)
    resumed.resume_from_step(step, batch_size=4, num_workers=num_workers, world_size=1, seed=SEED)
    tail = epoch(streaming_dataloader(resumed, 4, num_workers))
    assert tail == [pair for batch in batches[step:] for pair in batch]


def test_a_resume_that_finds_another_skipped_set_is_refused(pristine: Path, tmp_path: Path) -> None:
    root = copy(pristine, tmp_path, "two")
    delete_mp4(root, MISSING_MP4, CAMERA)
    loader = streaming_dataloader(dataset(root), 4, 0, snapshot_every_n_steps=1)
    next(iter(loader))
    state = loader.state_dict()
    cut_parquet(root, CUT_PARQUET)  # one more bad episode since the checkpoint
    resumed = streaming_dataloader(dataset(root), 4, 0)
    resumed.load_state_dict(state)
    refused = r"episodes skipped as bad .*'1 episodes #\w+ \(2\)' -> '2 episodes #\w+ \(2, 6\)'"
    with pytest.raises(ConfigError, match=refused):
        next(iter(resumed))  # a StatefulDataLoader hands the dataset its state when the iterator starts
    with pytest.raises(ConfigError, match=refused):  # the step-offset resume checks the same record
        dataset(root).resume_from_step(1, 4, 0, identity=_identity_of(state))


def _identity_of(state: dict) -> dict:  # type: ignore[type-arg]
    """The dataset identity inside a StatefulDataLoader state."""
    found = []

    def walk(value) -> None:  # type: ignore[no-untyped-def]
        if isinstance(value, dict):
            if "skipped_episodes" in value:
                found.append(value)
            for item in value.values():
                walk(item)

    walk(state)
    assert found, state.keys()
    return found[0]


def test_an_elastic_resume_under_skip_is_refused_with_one_line(damaged: Path) -> None:
    chosen = dataset(damaged)
    chosen.resume_from_step(3, batch_size=4, num_workers=2, world_size=1, seed=SEED)
    with pytest.raises(ConfigError, match=r"another topology .* --dataset.streaming_bad_episodes=skip"):
        chosen.plan_resume(num_workers=0)


def test_an_mp4_whose_index_cannot_be_built_is_skipped_by_name(pristine: Path, tmp_path: Path) -> None:
    root = copy(pristine, tmp_path, "truncated-mp4")
    mp4 = root / paths_of(root, 4)[1]
    mp4.write_bytes(mp4.read_bytes()[:64])  # no moov: the index cannot be built
    with pytest.raises(LeRobotNodesError, match=str(paths_of(root, 4)[1])):
        dataset(root, config=CONFIG)
    chosen = dataset(root)
    assert list(chosen.skipped.kinds) == ["video file unreadable"]
    assert chosen.skipped.episodes.tolist() == [4]
    assert collections.Counter(epoch(streaming_dataloader(chosen, 4, 0))) == frames_of([e for e in range(8) if e != 4])


def test_a_rank_left_without_episodes_says_so(pristine: Path, tmp_path: Path) -> None:
    root = copy(pristine, tmp_path, "all-bad")
    delete_mp4(root, MISSING_MP4, CAMERA)
    with pytest.raises(ConfigError, match=r"left rank 0 no episode: all 1 of its episodes are bad"):
        dataset(root, episodes=[MISSING_MP4])


# -- the same check as inspect ------------------------------------------------------------------


def test_inspect_checks_name_the_episodes_skip_drops(damaged: Path) -> None:
    source = open_source(damaged)
    meta = load_meta(source, check_files=False, table_cache=False)
    report = check_dataset(meta, None, 1e-4, tolerant_open(lambda paths: open_video_indexes(source, meta, paths)))
    assert set(np.asarray(episodes_to_skip(meta, report, 1e-4).episodes).tolist()) == BAD
    assert set(dataset(damaged).skipped.episodes.tolist()) == BAD


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_mixture_skips_the_bad_episodes_of_each_dataset(damaged: Path, pristine: Path, num_workers: int) -> None:
    """A damaged dataset second in a mixture: its bad episodes are left out by their mixture ids, the
    kinds' reasons name it, and every other frame of both datasets streams exactly once."""
    chosen = StreamingLeRobotDataset(root=[pristine, damaged], config=SKIP, seed=SEED, return_uint8=True)
    offset = len(LENGTHS)
    assert sorted(chosen.skipped.episodes.tolist()) == sorted(offset + e for e in BAD)
    assert all(f": {chosen.meta.names[1]}: " in line for line in chosen.skipped.lines())  # type: ignore[attr-defined]
    loader = streaming_dataloader(chosen, 4, num_workers)
    seen = collections.Counter(
        (d, e, f)
        for batch in loader
        for d, e, f in zip(batch["dataset_index"].tolist(), batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True)
    )
    expected = collections.Counter({(0, e, f): n for (e, f), n in frames_of(list(range(len(LENGTHS)))).items()})
    expected.update({(1, e, f): n for (e, f), n in frames_of(GOOD).items()})
    assert seen == expected
    chosen.close()


def test_skip_with_weights_is_one_line(pristine: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--dataset.streaming_bad_episodes=skip and --dataset.streaming_weights do not"):
        StreamingLeRobotDataset(root=[pristine, pristine], bad_episodes="skip", weights=[0.5, 0.5])
