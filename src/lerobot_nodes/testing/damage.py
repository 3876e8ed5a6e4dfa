"""Damage a written dataset the way a half-finished upload or a careless converter does (for tests).

Each function changes one file of a LeRobot v3.0 dataset folder in place: an MP4 deleted, a data
Parquet cut in half, an episode's video span moved past the end of its MP4 (its metadata then lists
frames the video does not have), 16 random bytes written over one frame's picture data (the MP4
stays well-formed; only decoding that frame fails). The paths come from the dataset's own metadata.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.mp4 import read_index
from lerobot_nodes.sources import LocalSource

DAMAGE_BYTES = 16
"""Bytes :func:`damage_sample` overwrites (the damage of issue 26: FFmpeg's decoder would conceal it)."""
DAMAGE_AT = 2
"""Bytes into the frame's picture data where the damage starts: its first H.264 slice NAL unit
(past the length prefix; x264's SEI ahead of it is not picture data) or AV1 frame OBU payload.
There a decoder detects it (bytes that still parse are not detectable: MP4 samples have no checksum)."""


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


def picture_data(sample: bytes, codec: str, config: bytes) -> int:
    """Offset in ``sample`` of its first slice NAL unit's payload (H.264) or frame OBU's (AV1)."""
    position = 0
    while position < len(sample):
        if codec == "h264":
            length_size = (config[4] & 3) + 1
            size = int.from_bytes(sample[position : position + length_size], "big")
            if 1 <= sample[position + length_size] & 0x1F <= 5:
                return position + length_size
            position += length_size + size
        else:
            header = sample[position]
            payload = position + 1 + (1 if header & 4 else 0)
            size, shift = 0, 0
            while True:  # leb128 obu_size (FFmpeg's muxer always writes it)
                byte = sample[payload]
                payload += 1
                size |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            if (header >> 3) & 0xF in (3, 6):  # OBU_FRAME_HEADER, OBU_FRAME
                return payload
            position = payload + size
    raise ValueError(f"no {codec} picture data in the sample")


def damage_position(path: Path, sample: int) -> int | None:
    """The file offset :func:`damage_sample` writes at for ``sample`` (decode index) of the MP4 at
    ``path``, or None when the sample's picture data is too short to hold the damage."""
    index = read_index(path)
    offset, size = int(index.offsets[sample]), int(index.sizes[sample])
    with path.open("rb") as file:
        file.seek(offset)
        data = file.read(size)
    start = offset + picture_data(data, index.codec, index.codec_config) + DAMAGE_AT
    return start if start + DAMAGE_BYTES <= offset + size else None


def damage_sample(path: Path, sample: int, seed: int = 0, target: Path | None = None) -> int:
    """Write :data:`DAMAGE_BYTES` random bytes (other than the ones there) over the picture data of
    ``sample`` of the MP4 at ``path``, in place or into a copy at ``target``; returns the file offset."""
    position = damage_position(path, sample)
    if position is None:
        raise ValueError(f"sample {sample} of {path} is too short for {DAMAGE_BYTES} bytes of damage")
    data = bytearray(path.read_bytes())
    original = bytes(data[position : position + DAMAGE_BYTES])
    rng = np.random.default_rng(seed)
    noise = original
    while noise == original:
        noise = rng.integers(0, 256, DAMAGE_BYTES, dtype=np.uint8).tobytes()
    data[position : position + DAMAGE_BYTES] = noise
    (target or path).write_bytes(bytes(data))
    return position


def damage_frame(root: Path, episode: int, camera: str, frame: int, seed: int = 0) -> tuple[str, int]:
    """Damage (:func:`damage_sample`) the MP4 sample of ``camera`` that presents frame ``frame`` of
    ``episode``, or the first one after it whose picture data holds the damage; returns the MP4's path
    and the damaged episode frame."""
    meta = load_meta(LocalSource(root), check_files=False, table_cache=False)
    path = meta.video_file(episode, camera)
    index = read_index(root / path)
    start, stop = meta.video_span(episode, camera)
    presented = np.argsort(index.pts, kind="stable")  # presentation order -> decode index
    first = int(np.searchsorted(np.sort(index.pts), round(start * index.timescale) - index.frame_duration // 2))
    last = int(np.searchsorted(np.sort(index.pts), round(stop * index.timescale) - index.frame_duration // 2))
    for at in range(first + frame, last):
        if damage_position(root / path, int(presented[at])) is not None:
            damage_sample(root / path, int(presented[at]), seed)
            return path, at - first
    raise ValueError(f"no frame of episode {episode} from frame {frame} on holds {DAMAGE_BYTES} bytes of damage")
