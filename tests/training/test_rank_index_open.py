"""Each rank opens and checks the MP4 indexes of its own episodes only (issue 28).

Before, every rank opened (and on a cold cache built) the index of every selected file and checked
every episode: rank 63 of 64 owning 157 episodes opened all 5,000 files. Now a rank opens the files
of ``nodes.sharder.rank_episodes`` and checks those episodes; the ranks together still check every
selected episode exactly once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_nodes import MetadataError
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.nodes.sharder import rank_episodes
from lerobot_nodes.testing import write_files_dataset

WORLD = 4


@pytest.fixture(scope="module")
def files_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 episodes, each in its own MP4 per camera (48 video files)."""
    return write_files_dataset(tmp_path_factory.mktemp("rank-open") / "files-48", 48)


def _records(home: Path) -> list[Path]:
    return sorted(home.glob("streaming-indexes/g*/*/records/*.idx"))


def test_a_rank_opens_and_builds_only_its_own_files(files_dataset: Path, tmp_path: Path) -> None:
    home = tmp_path / "lerobot-home"  # the autouse private_index_cache
    opened: set[str] = set()
    for rank in range(WORLD):
        dataset = StreamingLeRobotDataset(root=files_dataset, rank=rank, world_size=WORLD)
        lengths = [int(dataset.meta.episodes.length[e]) for e in dataset.episodes]
        own = rank_episodes(dataset.episodes, lengths, rank, WORLD, dataset.seed)
        assert sorted(dataset._indexes) == dataset.meta.video_files(own)
        assert not opened & set(dataset._indexes)  # no file opened by two ranks
        opened |= set(dataset._indexes)
        assert len(_records(home)) == len(opened)  # built only what this rank reads
        samples = iter(dataset)
        assert int(next(samples)["episode_index"]) in own
        dataset.close()
    assert opened == set(dataset.meta.video_files())  # together: every file


def _overflow(root: Path, episode: int, tmp_path: Path) -> Path:
    """A copy of ``root`` whose ``episode`` claims a span past the end of its MP4s."""
    import shutil

    copy = tmp_path / "overflow"
    shutil.copytree(root, copy, copy_function=shutil.copy2)
    path = copy / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    for name in [n for n in table.column_names if n.endswith("/to_timestamp")]:
        values = table.column(name).to_numpy().copy()
        values[episode] += 10.0
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values))
    pq.write_table(table, path, row_group_size=10)
    return copy


def test_every_episode_is_still_checked_by_the_rank_that_reads_it(files_dataset: Path, tmp_path: Path) -> None:
    probe = StreamingLeRobotDataset(root=files_dataset, rank=0, world_size=WORLD)
    lengths = [int(probe.meta.episodes.length[e]) for e in probe.episodes]
    owner = {e: r for r in range(WORLD) for e in rank_episodes(probe.episodes, lengths, r, WORLD, probe.seed)}
    bad = int(np.int64(probe.episodes[len(probe.episodes) // 2]))
    root = _overflow(files_dataset, bad, tmp_path)
    for rank in range(WORLD):
        if rank == owner[bad]:
            with pytest.raises(MetadataError, match=f"episode {bad} "):
                StreamingLeRobotDataset(root=root, rank=rank, world_size=WORLD)
        else:
            StreamingLeRobotDataset(root=root, rank=rank, world_size=WORLD).close()  # not its episode
    with pytest.raises(MetadataError, match=f"episode {bad} "):
        StreamingLeRobotDataset(root=root)  # one rank reads everything: checks everything
