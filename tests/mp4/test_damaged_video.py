"""Damaged video fails decoding by name instead of being concealed (issue 26, item 5).

Real MP4s written by the test helpers (H.264 with B-frames and AV1 as LeRobot writes them, six
episodes per file) get 16 random bytes written over the sample data of one frame, found with the
file's MP4 index. FFmpeg's H.264 decoder would conceal the damage (frames patched from their
neighbours, no error); with ``err_detect=explode`` both the clip decoder and the whole-file
decoder raise :class:`VideoDecodeError` naming the file and the frame's time. The damage starts a
few bytes into the sample (the slice header and first macroblocks, or the AV1 frame header):
there a decoder detects it. Bytes that still parse are not detectable: MP4 samples carry no checksum
(measured: seed 3 of an AV1 key frame here changes two frames and dav1d reports nothing, not even
in its log; 16 bytes at random places of an H.264 inter frame were detected in 14 of 20 files).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lerobot_nodes.errors import VideoDecodeError
from lerobot_nodes.mp4 import ClipDecoder, VideoIndex, materialize_clip, read_index
from lerobot_nodes.mp4.file_video import FileVideoDecoder, h264_keys_are_idr
from lerobot_nodes.mp4.plan import plan_clip
from lerobot_nodes.sources import LocalSource
from lerobot_nodes.testing.damage import DAMAGE_AT, DAMAGE_BYTES, picture_data

from .conftest import MultiEpisodeFile
from .mp4_media import decoded_frames

DAMAGED_EPISODE = 2


def _episode_samples(index: VideoIndex, span: tuple[float, float]) -> np.ndarray:
    """Decode indices of the samples presented in ``span`` (seconds)."""
    start, stop = (round(t * index.timescale) for t in span)
    tolerance = index.frame_duration / 2
    return np.flatnonzero((index.pts >= start - tolerance) & (index.pts < stop - tolerance))


def _damage(file: MultiEpisodeFile, target: Path, key_frame: bool, seed: int) -> tuple[int, int]:
    """Copy ``file`` to ``target`` with 16 random bytes written into one sample of episode 2 (a
    key frame or not); the sample's decode index and pts."""
    source = file.path
    index = read_index(source)
    samples = _episode_samples(index, file.spans[DAMAGED_EPISODE])
    rng = np.random.default_rng(seed)
    data = bytearray(source.read_bytes())
    starts = {}
    for s in samples:
        if bool(index.keyframes[s]) == key_frame:
            offset, size = int(index.offsets[s]), int(index.sizes[s])
            start = offset + picture_data(bytes(data[offset : offset + size]), index.codec, index.codec_config)
            if start + DAMAGE_AT + DAMAGE_BYTES <= offset + size:  # inside the sample's data
                starts[int(s)] = start + DAMAGE_AT
    sample = sorted(starts)[int(rng.integers(len(starts)))]
    position = starts[sample]
    original = bytes(data[position : position + DAMAGE_BYTES])
    noise = original
    while noise == original:
        noise = rng.integers(0, 256, DAMAGE_BYTES, dtype=np.uint8).tobytes()
    data[position : position + DAMAGE_BYTES] = noise
    target.write_bytes(bytes(data))
    return sample, int(index.pts[sample])


def _decode_clip(path: Path, span: tuple[float, float]) -> list[np.ndarray]:
    index = read_index(path)
    plan = plan_clip(index, *span)
    clip = materialize_clip(plan, LocalSource(path.parent).read_ranges(path.name, plan.byte_ranges))
    with ClipDecoder(clip) as decoder:
        times = decoder.timestamps_s
        wanted = times[(times >= span[0] - 1e-3) & (times < span[1] - 1e-3)]
        return [frame.permute(1, 2, 0).numpy() for frame in decoder.frames_at(wanted.tolist())]


def _decode_file(path: Path, span: tuple[float, float]) -> None:
    index = read_index(path)
    times = np.sort(index.pts[_episode_samples(index, span)]) / index.timescale
    decoder = FileVideoDecoder(LocalSource(path.parent), path.name)
    try:
        decoder.decode(times.tolist(), tolerance_s=1e-4)
    finally:
        decoder.close()


@pytest.mark.parametrize("codec", ["h264", "av1"])
@pytest.mark.parametrize("key_frame", [False, True], ids=["inter-frame", "key-frame"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_damaged_sample_fails_clip_and_file_decoding(multi_episode, tmp_path, codec, key_frame, seed):
    file = multi_episode[codec]
    damaged = tmp_path / f"damaged-{codec}.mp4"
    _, pts = _damage(file, damaged, key_frame, seed)
    span = file.spans[DAMAGED_EPISODE]
    with pytest.raises(VideoDecodeError, match=f"damaged-{codec}.mp4") as raised:
        _decode_clip(damaged, span)
    assert " s)" in str(raised.value) and "pts" in str(raised.value)  # the frame's time
    with pytest.raises(VideoDecodeError, match=f"damaged-{codec}.mp4.*decoding failed"):
        _decode_file(damaged, span)


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_the_other_episodes_of_a_damaged_file_are_unchanged(multi_episode, tmp_path, codec):
    """The damage is one episode's: the others decode as before, frame for frame."""
    file = multi_episode[codec]
    damaged = tmp_path / f"damaged-{codec}.mp4"
    _damage(file, damaged, key_frame=False, seed=0)
    for episode in (0, len(file.spans) - 1):
        clean = _decode_clip(file.path, file.spans[episode])
        assert len(clean) == file.lengths[episode]
        for got, want in zip(_decode_clip(damaged, file.spans[episode]), clean, strict=True):
            np.testing.assert_array_equal(got, want)


def test_clean_open_gop_h264_decodes_from_recovery_point_key_frames(videos):
    """x264's open GOP starts GOPs at non-IDR I frames: decoding from one, FFmpeg reports reference
    marking errors of the clean stream ("mmco: unref short failure"). The decoders conceal there,
    as LeRobot's decode does: frames bit-identical to the whole file's, no error."""
    path = videos["h264_open_gop"]
    index = read_index(path)
    keys = np.flatnonzero(index.keyframes)
    data = path.read_bytes()
    assert not h264_keys_are_idr(data, index.offsets[keys].tolist(), index.sizes[keys].tolist(), index.codec_config)
    reference = decoded_frames(path)
    decoder = FileVideoDecoder(LocalSource(path.parent), path.name)
    try:
        for key in keys[1:3]:
            # Frames after the key frame (LeRobot's seek, one tick before the first, lands on it).
            pts = np.sort(index.pts[index.pts > index.pts[key]])[:4]
            frames = decoder.decode((pts / index.timescale).tolist(), tolerance_s=1e-4)
            for frame, at in zip(frames, pts, strict=True):
                np.testing.assert_array_equal(frame.permute(1, 2, 0).numpy(), reference[int(at)])
    finally:
        decoder.close()


def test_lerobot_h264_key_frames_are_idr(multi_episode):
    """LeRobot's H.264 (closed GOP) starts every GOP at an IDR picture: errors are detected there."""
    index = read_index(multi_episode["h264"].path)
    keys = np.flatnonzero(index.keyframes)
    data = multi_episode["h264"].path.read_bytes()
    assert h264_keys_are_idr(data, index.offsets[keys].tolist(), index.sizes[keys].tolist(), index.codec_config)
