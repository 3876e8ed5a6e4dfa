"""Episode rows are read by range with row-group pruning, and files without statistics still work."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from lerobot_nodes import load_meta
from lerobot_nodes.format.parquet import EpisodeTableReader
from lerobot_nodes.map_style import MapStyleLeRobotDataset
from lerobot_nodes.sources import open_source


def test_one_row_group_per_episode_is_fetched(lerobot_av1):
    source = open_source(lerobot_av1)
    meta = load_meta(source)
    reader = EpisodeTableReader(source, meta)
    plan = reader.plan(5)
    assert plan.row_groups == [5]
    group = pq.ParquetFile(lerobot_av1 / plan.path).metadata.row_group(5)
    assert plan.size == sum(group.column(c).total_compressed_size for c in range(group.num_columns))
    assert plan.size < source.info(plan.path).size / 5  # one episode of the file's eight
    data = reader.read(5)
    reference = MapStyleLeRobotDataset(root=lerobot_av1).episode_data(5)
    assert data.length == meta.episodes.length[5]
    for key, values in reference.arrays.items():
        assert np.array_equal(data.arrays[key], values), key


def test_groups_without_statistics_stay_candidates(dataset_copy):
    source = open_source(dataset_copy)
    meta = load_meta(source)
    path = dataset_copy / meta.data_file(0)
    table = pq.read_table(path)
    pq.write_table(table, path, write_statistics=False, row_group_size=100)
    reader = EpisodeTableReader(source, meta)
    plan = reader.plan(7)
    groups = pq.ParquetFile(path).num_row_groups
    assert groups == 4 and plan.row_groups == list(range(groups))
    data = reader.read(7)
    start, stop = meta.episode_bounds(7)
    assert data.arrays["index"].tolist() == list(range(start, stop))
