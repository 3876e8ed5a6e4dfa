"""Sample tables (``stbl``) to per-sample numpy arrays, with FFmpeg's edit-list timing.

Everything here is vectorised (``np.repeat`` over table runs, cumulative sums) and checks
entry counts against box sizes before expanding anything, so a corrupt table raises
:class:`~lerobot_nodes.errors.VideoIndexError` instead of allocating or indexing out of range.

Timing follows FFmpeg's mov demuxer (``mov_build_index`` / ``mov_fix_index`` with its default
``advanced_editlist``) for the files it accepts: for every sample the computed ``pts``/``dts``
equal ``pkt.pts``/``pkt.dts`` of ``av.open(...).demux()``. Edit lists that would make FFmpeg
drop or discard samples are rejected instead of approximated (see :func:`apply_edit_list`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..errors import VideoIndexError

# FFmpeg ignores a whole ctts table holding a composition offset beyond +-2**28 ("CTTS invalid").
_MAX_COMPOSITION_OFFSET = 1 << 28
# stts deltas with the high bit set are treated as corrupt by FFmpeg (clipped to 1).
_MAX_SAMPLE_DELTA = (1 << 31) - 1
# Edit times beyond this could overflow int64 timestamps (about 950 years at 15360 Hz).
_MAX_EDIT_TICKS = 1 << 58


def full_box_fields(payload: bytes | memoryview, name: str, where: str) -> tuple[int, int]:
    """``(version, flags)`` of a full box payload."""
    if len(payload) < 4:
        raise VideoIndexError(f"{where}: {name} box is truncated")
    version_flags = struct.unpack_from(">I", payload, 0)[0]
    return version_flags >> 24, version_flags & 0xFFFFFF


def _entries(
    payload: bytes | memoryview, name: str, where: str, header: int, entry_size: int, dtype: str, fields: int
) -> np.ndarray:
    """The ``(entry_count, fields)`` big-endian table that follows ``header`` bytes of fields.

    ``header`` counts the version/flags word and any fields before the entry count.
    """
    if len(payload) < header + 4:
        raise VideoIndexError(f"{where}: {name} box is truncated")
    (count,) = struct.unpack_from(">I", payload, header)
    start = header + 4
    if count * entry_size > len(payload) - start:
        raise VideoIndexError(
            f"{where}: {name} box declares {count} entries but holds room for "
            f"{(len(payload) - start) // entry_size}"
        )
    table = np.frombuffer(payload, dtype=dtype, count=count * fields, offset=start)
    return table.reshape(count, fields)


def parse_stts(payload: bytes | memoryview, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(counts, deltas)`` runs of the decoding time-to-sample box, as int64."""
    table = _entries(payload, "stts", where, 4, 8, ">u4", 2).astype(np.int64)
    counts, deltas = table[:, 0], table[:, 1]
    if np.any(deltas > _MAX_SAMPLE_DELTA):
        raise VideoIndexError(f"{where}: stts holds a sample duration above 2**31 (corrupt table)")
    return counts, deltas


def parse_ctts(payload: bytes | memoryview, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(counts, offsets)`` runs of the composition offset box (v0 and v1 both read signed)."""
    version, _ = full_box_fields(payload, "ctts", where)
    if version > 1:
        raise VideoIndexError(f"{where}: unsupported ctts version {version}")
    table = _entries(payload, "ctts", where, 4, 8, ">u4", 2)
    counts = table[:, 0].astype(np.int64)
    # FFmpeg reads the offset as a signed 32-bit integer in both versions.
    offsets = table[:, 1].astype(np.uint32).view(np.int32).astype(np.int64)
    if np.any(counts == 0) or np.any(counts >= 1 << 31):
        raise VideoIndexError(f"{where}: ctts holds an entry with an invalid sample count")
    if np.any(np.abs(offsets) > _MAX_COMPOSITION_OFFSET):
        raise VideoIndexError(f"{where}: ctts holds a composition offset beyond 2**28 ticks (corrupt table)")
    return counts, offsets


def parse_stsc(payload: bytes | memoryview, where: str) -> np.ndarray:
    """``(first_chunk, samples_per_chunk, description_index)`` rows, int64."""
    return _entries(payload, "stsc", where, 4, 12, ">u4", 3).astype(np.int64)


def parse_stsz(payload: bytes | memoryview, where: str, file_size: int) -> np.ndarray:
    """Per-sample sizes from ``stsz`` (constant or per-sample), int64."""
    if len(payload) < 12:
        raise VideoIndexError(f"{where}: stsz box is truncated")
    constant_size, count = struct.unpack_from(">II", payload, 4)
    if constant_size:
        if count * constant_size > file_size:
            raise VideoIndexError(
                f"{where}: stsz declares {count} samples of {constant_size} bytes, more than the file holds"
            )
        return np.full(count, constant_size, dtype=np.int64)
    if count * 4 > len(payload) - 12:
        raise VideoIndexError(
            f"{where}: stsz declares {count} samples but holds room for {(len(payload) - 12) // 4}"
        )
    return np.frombuffer(payload, dtype=">u4", count=count, offset=12).astype(np.int64)


def parse_stz2(payload: bytes | memoryview, where: str) -> np.ndarray:
    """Per-sample sizes from the compact ``stz2`` box (4-, 8- or 16-bit fields), int64."""
    if len(payload) < 12:
        raise VideoIndexError(f"{where}: stz2 box is truncated")
    field_size = payload[7]
    (count,) = struct.unpack_from(">I", payload, 8)
    available = len(payload) - 12
    if field_size == 4:
        if (count + 1) // 2 > available:
            raise VideoIndexError(f"{where}: stz2 declares {count} samples but is too short")
        packed = np.frombuffer(payload, dtype=np.uint8, count=(count + 1) // 2, offset=12)
        nibbles = np.stack([packed >> 4, packed & 0x0F], axis=1).reshape(-1)
        return nibbles[:count].astype(np.int64)
    if field_size in (8, 16):
        width = field_size // 8
        if count * width > available:
            raise VideoIndexError(f"{where}: stz2 declares {count} samples but is too short")
        dtype = np.uint8 if width == 1 else ">u2"
        return np.frombuffer(payload, dtype=dtype, count=count, offset=12).astype(np.int64)
    raise VideoIndexError(f"{where}: stz2 has an invalid field size {field_size}")


def parse_chunk_offsets(payload: bytes | memoryview, box_type: str, where: str) -> np.ndarray:
    """Chunk offsets from ``stco`` (32-bit) or ``co64`` (64-bit), int64."""
    if box_type == "stco":
        return _entries(payload, "stco", where, 4, 4, ">u4", 1).reshape(-1).astype(np.int64)
    offsets = _entries(payload, "co64", where, 4, 8, ">u8", 1).reshape(-1)
    if np.any(offsets >= np.uint64(1 << 62)):
        raise VideoIndexError(f"{where}: co64 holds an impossible chunk offset")
    return offsets.astype(np.int64)


def parse_stss(payload: bytes | memoryview, where: str) -> np.ndarray:
    """Sync sample numbers (1-based, as stored), int64."""
    return _entries(payload, "stss", where, 4, 4, ">u4", 1).reshape(-1).astype(np.int64)


@dataclass(frozen=True)
class EditEntry:
    """One ``elst`` entry: duration in the movie timescale, media time in media ticks (-1 = empty)."""

    segment_duration: int
    media_time: int
    media_rate: float


def parse_elst(payload: bytes | memoryview, where: str) -> list[EditEntry]:
    """The entries of an edit list box (v0 32-bit or v1 64-bit fields)."""
    version, _ = full_box_fields(payload, "elst", where)
    if version > 1:
        raise VideoIndexError(f"{where}: unsupported elst version {version}")
    entry_size = 20 if version == 1 else 12
    if len(payload) < 8:
        raise VideoIndexError(f"{where}: elst box is truncated")
    (count,) = struct.unpack_from(">I", payload, 4)
    if count * entry_size > len(payload) - 8:
        raise VideoIndexError(f"{where}: elst declares {count} entries but is too short")
    entries = []
    for i in range(count):
        position = 8 + i * entry_size
        if version == 1:
            duration, media_time = struct.unpack_from(">Qq", payload, position)
            rate_integer, rate_fraction = struct.unpack_from(">hH", payload, position + 16)
        else:
            duration, media_time = struct.unpack_from(">Ii", payload, position)
            rate_integer, rate_fraction = struct.unpack_from(">hH", payload, position + 8)
        entries.append(EditEntry(duration, media_time, rate_integer + rate_fraction / 65536))
    return entries


@dataclass(frozen=True)
class SampleTables:
    """Decoded ``stbl`` runs, before expansion to per-sample arrays."""

    sizes: np.ndarray
    chunk_offsets: np.ndarray
    sample_to_chunk: np.ndarray
    time_to_sample: tuple[np.ndarray, np.ndarray]
    composition_offsets: tuple[np.ndarray, np.ndarray] | None
    sync_samples: np.ndarray | None


@dataclass(frozen=True)
class RawSamples:
    """Per-sample arrays in decode order, before any edit list: all int64 except ``keyframes``."""

    offsets: np.ndarray
    sizes: np.ndarray
    raw_dts: np.ndarray
    composition_offsets: np.ndarray
    durations: np.ndarray
    keyframes: np.ndarray
    decoder_shift: int
    """FFmpeg's ``dts_shift``: how far decode times move earlier for negative ctts."""
    has_composition_offsets: bool


def expand_samples(tables: SampleTables, file_size: int, where: str) -> RawSamples:
    """Per-sample offset, size, decode time, composition offset and key flag.

    Raises :class:`VideoIndexError` when the tables disagree on the sample count, a sample
    lies (partly) outside the file, or a run is malformed.
    """
    sizes = tables.sizes
    count = len(sizes)
    if count == 0:
        raise VideoIndexError(f"{where}: the video track has no samples (fragmented or empty MP4?)")
    if count > file_size:
        raise VideoIndexError(f"{where}: {count} samples cannot fit in a file of {file_size} bytes")
    if np.any(sizes == 0):
        raise VideoIndexError(f"{where}: sample {int(np.argmax(sizes == 0))} is empty")

    offsets = _sample_offsets(sizes, tables.chunk_offsets, tables.sample_to_chunk, where)
    ends = offsets + sizes
    if np.any(ends > file_size):
        bad = int(np.argmax(ends > file_size))
        raise VideoIndexError(
            f"{where}: sample {bad} at bytes [{int(offsets[bad])}, {int(ends[bad])}) lies beyond the end "
            f"of the file ({file_size} bytes; truncated?)"
        )

    run_counts, deltas = tables.time_to_sample
    if int(run_counts.sum()) != count:
        raise VideoIndexError(f"{where}: stts describes {int(run_counts.sum())} samples, stsz {count}")
    durations = np.repeat(deltas, run_counts)
    raw_dts = np.zeros(count, dtype=np.int64)
    np.cumsum(durations[:-1], out=raw_dts[1:])

    decoder_shift = 0
    if tables.composition_offsets is None:
        composition = np.zeros(count, dtype=np.int64)
    else:
        ctts_counts, ctts_offsets = tables.composition_offsets
        if int(ctts_counts.sum()) != count:
            raise VideoIndexError(f"{where}: ctts describes {int(ctts_counts.sum())} samples, stsz {count}")
        composition = np.repeat(ctts_offsets, ctts_counts)
        # FFmpeg derives its dts shift from every ctts entry but the last two.
        considered = ctts_offsets[: max(len(ctts_offsets) - 2, 0)]
        if len(considered):
            decoder_shift = max(0, -int(considered.min()))

    keyframes = np.ones(count, dtype=bool)
    if tables.sync_samples is not None:
        sync = tables.sync_samples
        if len(sync) == 0:
            raise VideoIndexError(f"{where}: the sync sample table (stss) is empty")
        if sync[0] < 1 or sync[-1] > count or np.any(np.diff(sync) <= 0):
            raise VideoIndexError(f"{where}: stss entries are not increasing sample numbers in [1, {count}]")
        keyframes[:] = False
        keyframes[sync - 1] = True

    return RawSamples(
        offsets=offsets,
        sizes=sizes,
        raw_dts=raw_dts,
        composition_offsets=composition,
        durations=durations,
        keyframes=keyframes,
        decoder_shift=decoder_shift,
        has_composition_offsets=tables.composition_offsets is not None,
    )


def _sample_offsets(
    sizes: np.ndarray, chunk_offsets: np.ndarray, sample_to_chunk: np.ndarray, where: str
) -> np.ndarray:
    """Byte offset of every sample: its chunk's offset plus the sizes before it in the chunk."""
    chunk_count = len(chunk_offsets)
    if len(sample_to_chunk) == 0 or chunk_count == 0:
        raise VideoIndexError(f"{where}: stsc or the chunk offset table is empty")
    first_chunks = sample_to_chunk[:, 0]
    per_chunk = sample_to_chunk[:, 1]
    descriptions = sample_to_chunk[:, 2]
    if first_chunks[0] != 1 or np.any(np.diff(first_chunks) <= 0) or first_chunks[-1] > chunk_count:
        raise VideoIndexError(f"{where}: stsc first-chunk numbers are not increasing from 1 to {chunk_count}")
    if np.any(per_chunk == 0):
        raise VideoIndexError(f"{where}: stsc holds a run of chunks with no samples")
    if np.any(descriptions != 1):
        raise VideoIndexError(f"{where}: stsc refers to a sample description other than the first")
    run_lengths = np.diff(np.append(first_chunks, chunk_count + 1))
    samples_per_chunk = np.repeat(per_chunk, run_lengths)
    described = int(samples_per_chunk.sum())
    if described != len(sizes):
        raise VideoIndexError(
            f"{where}: stsc and the chunk offsets describe {described} samples, stsz {len(sizes)}"
        )
    sample_chunk = np.repeat(np.arange(chunk_count), samples_per_chunk)
    before = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=before[1:])
    chunk_first_sample = np.zeros(chunk_count, dtype=np.int64)
    np.cumsum(samples_per_chunk[:-1], out=chunk_first_sample[1:])
    within_chunk = before - before[chunk_first_sample][sample_chunk]
    return chunk_offsets[sample_chunk] + within_chunk


def rescale_round(value: int, numerator: int, denominator: int) -> int:
    """``value * numerator / denominator`` rounded to nearest, ties away from zero (``av_rescale``)."""
    product = value * numerator
    half = denominator // 2
    if product >= 0:
        return (product + half) // denominator
    return -((-product + half) // denominator)


@dataclass(frozen=True)
class Timing:
    """Edit-applied decode and presentation times (media ticks) and the edit description."""

    dts: np.ndarray
    pts: np.ndarray
    media_time: int
    """Media time of the normal edit (-1 when the track has no edit list)."""
    empty_edit_duration: int
    """Summed leading empty edits, converted to media ticks as FFmpeg rounds them."""


def apply_edit_list(
    samples: RawSamples,
    edits: list[EditEntry] | None,
    media_timescale: int,
    movie_timescale: int,
    where: str,
) -> Timing:
    """Presentation and decode times exactly as FFmpeg's demuxer reports them.

    Accepted edit lists: optional leading empty edits followed by exactly one normal edit at
    rate 1 that covers every sample (FFmpeg then keeps all samples and discards none). For
    those, with ``E`` the empty edits in media ticks, ``m`` the smallest raw presentation time
    and ``shift`` FFmpeg's dts shift for negative composition offsets::

        pts = raw_dts + ctts + E - max(0, m)
        dts = raw_dts - shift + E - max(0, m)

    Without an edit list ``pts = raw_dts + ctts`` and ``dts = raw_dts - shift``.
    Everything else (repeated or non-unit-rate edits, edits that cut samples) raises
    :class:`VideoIndexError`.
    """
    raw_dts = samples.raw_dts
    raw_pts = raw_dts + samples.composition_offsets
    shift = samples.decoder_shift
    if not edits:
        dts = raw_dts - shift
        pts = raw_pts
        media_time, empty = -1, 0
    else:
        media_time, empty, duration = _single_edit(edits, media_timescale, movie_timescale, where)
        _check_edit_keeps_every_sample(samples, raw_pts, media_time, duration, where)
        start_shift = max(0, int(raw_pts.min()))
        dts = raw_dts - shift + empty - start_shift
        pts = raw_pts + empty - start_shift

    if np.any(pts < dts):
        raise VideoIndexError(
            f"{where}: a sample is presented before it is decoded (negative ctts beyond FFmpeg's shift)"
        )
    return Timing(dts=dts, pts=pts, media_time=media_time, empty_edit_duration=empty)


def _single_edit(
    edits: list[EditEntry], media_timescale: int, movie_timescale: int, where: str
) -> tuple[int, int, int]:
    """``(media_time, empty edit ticks, duration ticks)`` of an accepted edit list."""
    if movie_timescale <= 0:
        raise VideoIndexError(f"{where}: the movie timescale is 0 but the track has an edit list")
    empty = 0
    normal: list[EditEntry] = []
    for entry in edits:
        if entry.media_rate != 1:
            raise VideoIndexError(
                f"{where}: edit list entry with media rate {entry.media_rate} (only 1 is supported)"
            )
        if entry.media_time == -1:
            if normal:
                raise VideoIndexError(f"{where}: edit list has an empty edit after the media edit")
            empty += rescale_round(entry.segment_duration, media_timescale, movie_timescale)
        elif entry.media_time < -1:
            raise VideoIndexError(f"{where}: edit list entry has an invalid media time {entry.media_time}")
        else:
            normal.append(entry)
    if len(normal) != 1:
        raise VideoIndexError(
            f"{where}: edit list has {len(normal)} non-empty edits (repeated or missing edit timelines "
            "are not supported)"
        )
    edit = normal[0]
    duration = rescale_round(edit.segment_duration, media_timescale, movie_timescale)
    if duration <= 0:
        raise VideoIndexError(f"{where}: edit list entry has zero duration")
    if max(empty, duration, edit.media_time) > _MAX_EDIT_TICKS:
        raise VideoIndexError(f"{where}: edit list times are out of range")
    return edit.media_time, empty, duration


def _check_edit_keeps_every_sample(
    samples: RawSamples, raw_pts: np.ndarray, media_time: int, duration: int, where: str
) -> None:
    """Reject an edit under which FFmpeg would drop or discard samples (it would hide frames)."""
    edit_end = media_time + duration
    if np.any(raw_pts < media_time):
        raise VideoIndexError(
            f"{where}: the edit list starts after the first frame (FFmpeg would discard frames)"
        )
    if np.any(raw_pts >= edit_end):
        raise VideoIndexError(
            f"{where}: the edit list ends before the last frame (FFmpeg would discard frames)"
        )
    keyframes = samples.keyframes
    if not keyframes[0]:
        raise VideoIndexError(f"{where}: the first sample is not a sync sample")
    # FFmpeg starts the edit at the last key frame whose dts (and, with ctts, pts) is at or
    # before the edit's media time; samples before it vanish from the index.
    later_keys = np.flatnonzero(keyframes[1:]) + 1
    starts_later = (samples.raw_dts[later_keys] <= media_time) & (raw_pts[later_keys] <= media_time)
    if np.any(starts_later):
        raise VideoIndexError(
            f"{where}: the edit list starts at a later key frame (FFmpeg would drop samples)"
        )
    # FFmpeg stops at the first key frame (second with ctts) whose presentation reaches the
    # edit end; samples after it vanish.
    frame_durations = np.append(np.diff(samples.raw_dts), duration)
    reaching_end = np.flatnonzero(keyframes & (raw_pts + frame_durations >= edit_end))
    stop_rank = 1 if samples.has_composition_offsets else 0
    if len(reaching_end) > stop_rank and reaching_end[stop_rank] < len(raw_pts) - 1:
        raise VideoIndexError(
            f"{where}: the edit list ends before the last sample (FFmpeg would drop samples)"
        )
