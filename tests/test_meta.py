"""v3 metadata loading, and a clear error naming the file for each kind of bad input."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_nodes import (
    MapStyleLeRobotDataset,
    MetadataError,
    UnsupportedVersionError,
    load_meta,
    select_episodes,
)
from lerobot_nodes.sources import open_source

EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"


def _edit_info(root, **changes):
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    info.update(changes)
    path.write_text(json.dumps(info))


def _edit_episodes(root, column, values):
    path = root / EPISODES_FILE
    table = pq.read_table(path)
    index = table.column_names.index(column)
    table = table.set_column(index, column, pa.array(values, type=table.schema.field(column).type))
    pq.write_table(table, path)


def test_reads_every_metadata_file(lerobot_av1):
    meta = load_meta(open_source(lerobot_av1))
    assert meta.total_episodes == 8 and len(meta.episodes) == 8
    assert meta.total_frames == int(meta.episodes.length.sum()) == 380
    assert meta.video_keys == ["observation.images.top", "observation.images.wrist"]
    assert meta.tasks[0] == "open the top drawer"
    assert meta.stats is not None and meta.stats["action"]["mean"].shape == (14,)
    assert meta.data_file(7) == "data/chunk-000/file-000.parquet"
    assert meta.video_file(7, "observation.images.top") == "videos/observation.images.top/chunk-000/file-000.mp4"
    start, stop = meta.video_span(1, "observation.images.top")
    assert start == pytest.approx(35 / 30) and stop > start
    assert meta.episodes.tasks[1] == ["pick up the red cube and place it in the bin"]
    assert "episodes: 8" in meta.summary()


def test_reads_data_and_videos_that_rolled_over_into_several_files(lerobot_h264):
    meta = load_meta(open_source(lerobot_h264))
    assert meta.video_keys == ["observation.images.top", "observation.images.wrist", "observation.images.left"]
    assert [meta.data_file(e) for e in range(6)] == [
        f"data/chunk-000/file-{n:03d}.parquet" for n in (0, 1, 2, 3, 3, 4)
    ]
    assert meta.video_file(2, "observation.images.top") == "videos/observation.images.top/chunk-000/file-000.mp4"
    assert meta.video_file(2, "observation.images.wrist") == "videos/observation.images.wrist/chunk-000/file-001.mp4"
    assert meta.video_span(2, "observation.images.wrist") == (0.0, pytest.approx(73 / 30))
    assert len(meta.video_files()) == 8


def test_v21_dataset_asks_for_conversion(dataset_copy):
    _edit_info(dataset_copy, codebase_version="v2.1")
    with pytest.raises(UnsupportedVersionError, match=r"v2\.1.*info\.json.*[Cc]onvert"):
        load_meta(open_source(dataset_copy))


def test_missing_info_json_is_named(dataset_copy):
    (dataset_copy / "meta" / "info.json").unlink()
    with pytest.raises(MetadataError, match=r"meta/info\.json not found"):
        load_meta(open_source(dataset_copy))


def test_malformed_json_is_named(dataset_copy):
    (dataset_copy / "meta" / "info.json").write_text("{not json")
    with pytest.raises(MetadataError, match=r"meta/info\.json .*not valid JSON"):
        load_meta(open_source(dataset_copy))
    (dataset_copy / "meta" / "info.json").write_text("[]")
    with pytest.raises(MetadataError, match=r"meta/info\.json .*JSON object"):
        load_meta(open_source(dataset_copy))


def test_malformed_stats_json_is_named(dataset_copy):
    (dataset_copy / "meta" / "stats.json").write_text("{")
    with pytest.raises(MetadataError, match=r"meta/stats\.json"):
        load_meta(open_source(dataset_copy))


def test_missing_stats_is_allowed(dataset_copy):
    (dataset_copy / "meta" / "stats.json").unlink()
    assert load_meta(open_source(dataset_copy)).stats is None


def test_malformed_episodes_parquet_is_named(dataset_copy):
    (dataset_copy / EPISODES_FILE).write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(MetadataError, match=r"meta/episodes/chunk-000/file-000\.parquet.*not a readable Parquet"):
        load_meta(open_source(dataset_copy))


def test_missing_episodes_files(dataset_copy):
    (dataset_copy / EPISODES_FILE).unlink()
    with pytest.raises(MetadataError, match=r"no meta/episodes"):
        load_meta(open_source(dataset_copy))


def test_missing_tasks_file(dataset_copy):
    (dataset_copy / "meta" / "tasks.parquet").unlink()
    with pytest.raises(MetadataError, match=r"meta/tasks\.parquet not found"):
        load_meta(open_source(dataset_copy))


def test_totals_that_disagree_with_tables(dataset_copy):
    _edit_info(dataset_copy, total_frames=300)
    with pytest.raises(MetadataError, match=r"total_frames is 300 but the episode lengths sum to 380"):
        load_meta(open_source(dataset_copy))
    _edit_info(dataset_copy, total_frames=380, total_episodes=9)
    with pytest.raises(MetadataError, match=r"total_episodes is 9 but meta/episodes has 8 rows"):
        load_meta(open_source(dataset_copy))


def test_missing_data_file_is_named_with_its_episode(dataset_copy):
    (dataset_copy / "videos" / "observation.images.wrist" / "chunk-000" / "file-000.mp4").unlink()
    with pytest.raises(MetadataError, match=r"episode 0 needs videos/observation\.images\.wrist/chunk-000/file-000\.mp4"):
        load_meta(open_source(dataset_copy))


def test_episode_rows_pointing_outside_their_file(dataset_copy):
    meta = load_meta(open_source(dataset_copy))
    table = pq.read_table(dataset_copy / meta.data_file(0))
    keep = pa.compute.not_equal(table.column("episode_index"), 7)
    pq.write_table(table.filter(keep), dataset_copy / meta.data_file(0))
    dataset = MapStyleLeRobotDataset(root=dataset_copy)
    with pytest.raises(MetadataError, match=r"episode 7: .*data/chunk-000/file-000\.parquet.*0 rows"):
        dataset[len(dataset) - 1]


def test_video_span_pointing_past_the_end_of_its_file(dataset_copy):
    meta = load_meta(open_source(dataset_copy))
    key = "observation.images.top"
    stops = meta.episodes.videos[key].to_timestamp.tolist()
    stops[-1] += 10.0
    _edit_episodes(dataset_copy, f"videos/{key}/to_timestamp", stops)
    dataset = MapStyleLeRobotDataset(root=dataset_copy)
    with pytest.raises(MetadataError, match=r"episode 7: .*observation\.images\.top.*file-000\.mp4.*ends at"):
        dataset[len(dataset) - 1]


def test_episode_lengths_inconsistent_with_rows(dataset_copy):
    meta = load_meta(open_source(dataset_copy))
    lengths = meta.episodes.length.tolist()
    lengths[4] += 1
    _edit_episodes(dataset_copy, "length", lengths)
    with pytest.raises(MetadataError, match=r"episode 4 has length"):
        load_meta(open_source(dataset_copy))


def test_episode_selection(lerobot_av1):
    meta = load_meta(open_source(lerobot_av1))
    assert select_episodes(meta, None) == list(range(8))
    assert select_episodes(meta, [5, 2]) == [5, 2]
    with pytest.warns(UserWarning, match=r"\[99\]"):
        assert select_episodes(meta, [1, 99]) == [1]
    with pytest.raises(ValueError, match="duplicates"):
        select_episodes(meta, [1, 1])
    with pytest.raises(ValueError, match="no episode selected"):
        select_episodes(meta, [100])
