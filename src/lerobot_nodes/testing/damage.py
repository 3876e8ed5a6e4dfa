"""Damage a written dataset the way a half-finished upload or a careless converter does (for tests).

Each function changes one file of a LeRobot v3.0 dataset folder in place: an MP4 deleted, a data
Parquet cut in half, an episode's video span moved past the end of its MP4 (its metadata then lists
frames the video does not have). The paths come from the dataset's own metadata.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sources import LocalSource


def episode_files(root: Path, episode: int, camera: str) -> tuple[str, str]:
    """``(data Parquet, MP4 of camera)`` of ``episode``, relative to ``root`` (missing files allowed)."""
    meta = load_meta(LocalSource(root), check_files=False, table_cache=False)
    return meta.data_file(episode), meta.video_file(episode, camera)


def delete_mp4(root: Path, episode: int, camera: str) -> str:
    """Delete ``episode``'s MP4 of ``camera``; returns its path."""
    path = episode_files(root, episode, camera)[1]
    (root / path).unlink()
    return path


def cut_parquet(root: Path, episode: int) -> str:
    """Cut ``episode``'s data Parquet to its first half (no footer, no ``PAR1`` at the end); returns its path."""
    meta = load_meta(LocalSource(root), check_files=False, table_cache=False)
    path = meta.data_file(episode)
    data = (root / path).read_bytes()
    (root / path).write_bytes(data[: len(data) // 2])
    return path


def lengthen_span(root: Path, episode: int, camera: str, seconds: float) -> None:
    """``meta/episodes`` places ``seconds`` more of ``episode`` in its MP4 of ``camera`` than before."""
    column = f"videos/{camera}/to_timestamp"
    for path in sorted((root / "meta/episodes").rglob("*.parquet")):
        table = pq.read_table(path)
        mask = pc.equal(table.column("episode_index"), episode)
        if pc.any(mask).as_py():
            moved = pc.if_else(mask, pc.add(table.column(column), seconds), table.column(column))
            pq.write_table(table.set_column(table.schema.get_field_index(column), column, moved), path)
