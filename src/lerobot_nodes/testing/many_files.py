"""A streamable LeRobot v3.0 dataset of many small MP4 files, cheap to write (thousands of files).

For tests and benchmarks of what grows with the file count: index builds, open file
descriptors, per-rank index opens, requests per file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .dataset import write_dataset as write_tiny

FILES_CAMERAS = ("observation.images.exterior", "observation.images.wrist")
FILES_EPISODE_FRAMES = 4


def write_files_dataset(
    root: Path, files: int, *, cameras: tuple[str, ...] = FILES_CAMERAS, frames: int = FILES_EPISODE_FRAMES,
    size: int = 16, link: bool = True,
) -> Path:
    """A real, streamable LeRobot v3.0 dataset of ``files`` MP4 files: ``files / len(cameras)``
    episodes of ``frames`` frames, each episode in its own MP4 per camera (LeRobot's layout after
    every episode rolled over), 1,000 files per chunk; frames of ``size`` x ``size`` pixels (at 64
    and 30 frames an MP4 is ~8 KB, past the 4 KiB head window, so indexing it takes its two reads).

    Cheap to write: one tiny AV1 episode is encoded once (``lerobot_nodes.testing.write_dataset``)
    and its MP4 hard-linked (``link``, else copied) under every file name; the data Parquet and
    ``meta/episodes`` are that episode's rows repeated with their indices renumbered, so every
    episode decodes to the same frames. Returns ``root``.
    """
    if files % len(cameras):
        raise ValueError(f"files ({files}) must be a multiple of the camera count ({len(cameras)})")
    episodes = files // len(cameras)
    root = Path(root)
    if root.exists():
        shutil.rmtree(root)
    seed_root = root.parent / f".{root.name}.seed"
    if seed_root.exists():
        shutil.rmtree(seed_root)
    write_tiny(seed_root, episode_lengths=[frames], cameras=list(cameras), height=size, width=size)
    info = json.loads((seed_root / "meta" / "info.json").read_text())
    chunks_size = int(info["chunks_size"])
    episode = np.arange(episodes, dtype=np.int64)

    # data: the seed episode's rows, once per episode, renumbered (row groups of 100 episodes).
    rows = pq.read_table(seed_root / "data/chunk-000/file-000.parquet")
    data = rows.take(pa.array(np.tile(np.arange(frames), episodes)))
    data = data.set_column(data.schema.get_field_index("episode_index"), "episode_index",
                           pa.array(np.repeat(episode, frames)))
    data = data.set_column(data.schema.get_field_index("index"), "index",
                           pa.array(np.arange(episodes * frames, dtype=np.int64)))
    (root / "data/chunk-000").mkdir(parents=True)
    pq.write_table(data, root / "data/chunk-000/file-000.parquet", row_group_size=frames * 100)

    # meta/episodes: the seed row per episode, each camera's span in its own file at time 0.
    seed_rows = pq.read_table(seed_root / "meta/episodes/chunk-000/file-000.parquet")
    table = seed_rows.take(pa.array(np.zeros(episodes, dtype=np.int64)))

    def put(table: pa.Table, name: str, values: np.ndarray) -> pa.Table:
        index = table.schema.get_field_index(name)
        return table.set_column(index, name, pa.array(values).cast(table.schema.field(index).type))

    table = put(table, "episode_index", episode)
    table = put(table, "dataset_from_index", episode * frames)
    table = put(table, "dataset_to_index", (episode + 1) * frames)
    table = put(table, "data/chunk_index", np.zeros(episodes, dtype=np.int64))
    table = put(table, "data/file_index", np.zeros(episodes, dtype=np.int64))
    for key in cameras:
        table = put(table, f"videos/{key}/chunk_index", episode // chunks_size)
        table = put(table, f"videos/{key}/file_index", episode % chunks_size)
        table = put(table, f"videos/{key}/from_timestamp", np.zeros(episodes))
        to = pc.cast(seed_rows.column(f"videos/{key}/to_timestamp"), pa.float64())[0].as_py()
        table = put(table, f"videos/{key}/to_timestamp", np.full(episodes, to))
    table = put(table, "meta/episodes/chunk_index", np.zeros(episodes, dtype=np.int64))
    table = put(table, "meta/episodes/file_index", np.zeros(episodes, dtype=np.int64))
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    pq.write_table(table, root / "meta/episodes/chunk-000/file-000.parquet", row_group_size=10)
    for name in ("tasks.parquet", "stats.json"):
        shutil.copyfile(seed_root / "meta" / name, root / "meta" / name)
    info.update(total_episodes=episodes, total_frames=episodes * frames, splits={"train": f"0:{episodes}"})
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))

    # videos: one MP4 per (camera, episode), all the seed's bytes.
    for key in cameras:
        mp4 = seed_root / f"videos/{key}/chunk-000/file-000.mp4"
        for chunk in range(-(-episodes // chunks_size)):
            (root / f"videos/{key}/chunk-{chunk:03d}").mkdir(parents=True)
        for number in range(episodes):
            chunk, file = divmod(number, chunks_size)
            target = root / f"videos/{key}/chunk-{chunk:03d}/file-{file:03d}.mp4"
            if link:
                os.link(mp4, target)
            else:
                shutil.copyfile(mp4, target)
    shutil.rmtree(seed_root)
    (root / ".complete").write_text("ok\n")
    return root
