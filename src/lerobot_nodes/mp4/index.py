"""The per-file sample index (:class:`VideoIndex`) and how to read it from an MP4.

:func:`read_index` locates ``moov`` with range reads only (see :mod:`.boxes`), picks the first
video track (the stream LeRobot decodes, ``container.streams.video[0]``) and expands its
sample tables (see :mod:`.tables`). The resulting arrays equal FFmpeg's demuxer packets:
``offsets`` = ``pkt.pos``, ``sizes`` = ``pkt.size``, ``dts``/``pts`` = ``pkt.dts``/``pkt.pts``
and ``keyframes`` = ``pkt.is_keyframe``, in demux (decode) order.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import VideoIndexError
from ..sources import ByteSource, LocalSource
from .boxes import Box, children, find_child, fourcc, locate_moov, parse_box_header, require_child
from .tables import (
    EditEntry,
    SampleTables,
    apply_edit_list,
    expand_samples,
    full_box_fields,
    parse_chunk_offsets,
    parse_ctts,
    parse_elst,
    parse_stsc,
    parse_stss,
    parse_stsz,
    parse_stts,
    parse_stz2,
)

INDEX_FORMAT_VERSION = 1
"""Version of the :meth:`VideoIndex.to_arrays` layout."""

# Sample entry -> (codec name, configuration box holding FFmpeg's extradata).
SAMPLE_ENTRIES = {
    "av01": ("av1", "av1C"),
    "avc1": ("h264", "avcC"),
    "avc3": ("h264", "avcC"),
    "hvc1": ("hevc", "hvcC"),
    "hev1": ("hevc", "hvcC"),
}
# Fields of a VisualSampleEntry before its child boxes (ISO/IEC 14496-12 §12.1.3).
_VISUAL_SAMPLE_ENTRY_FIELDS = 78
# FFmpeg time bases are fractions of C ints.
_MAX_TIMESCALE = (1 << 31) - 1

_ARRAY_FIELDS = ("offsets", "sizes", "dts", "pts", "durations", "keyframes")
_INT_FIELDS = ("file_size", "width", "height", "timescale", "media_time", "empty_edit_duration")
_TEXT_FIELDS = ("path", "codec", "sample_entry")
_BYTES_FIELDS = ("codec_config", "stsd")


@dataclass(eq=False)
class VideoIndex:
    """Sample tables of the first video track of one MP4, one array entry per sample in decode order.

    Arrays: ``offsets`` (byte offset in the file), ``sizes``, ``dts``, ``pts`` (edit-applied,
    as FFmpeg's ``pkt.pts``), ``durations`` (stts deltas) are int64; ``keyframes`` is bool.
    Times are in ticks of ``timescale`` (the stream time base is ``1/timescale``).
    ``codec_config`` is the payload of the av1C/avcC/hvcC box (FFmpeg's extradata) and ``stsd``
    the verbatim sample description box, from which clips are rebuilt. ``media_time`` (-1 when
    there is no edit list) and ``empty_edit_duration`` (media ticks) describe the edit list that
    was applied.

    All fields are plain, so :meth:`to_arrays` / :meth:`from_arrays` round-trip through an NPZ.
    Construction checks the arrays (equal lengths, integer dtypes widened to int64, samples
    inside the file, ``pts >= dts``, ``dts`` following ``durations``, unique ``pts``) and raises
    :class:`VideoIndexError` otherwise, so an index rebuilt from stored arrays is checked like
    a parsed one.
    """

    path: str
    file_size: int
    codec: str
    sample_entry: str
    codec_config: bytes
    stsd: bytes
    width: int
    height: int
    timescale: int
    media_time: int
    empty_edit_duration: int
    offsets: np.ndarray
    sizes: np.ndarray
    dts: np.ndarray
    pts: np.ndarray
    durations: np.ndarray
    keyframes: np.ndarray
    _presentation_order: np.ndarray = field(init=False, repr=False)
    _keyframe_indices: np.ndarray = field(init=False, repr=False)
    _is_reordered: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        where = self.path
        for name in _ARRAY_FIELDS:
            dtype = bool if name == "keyframes" else np.int64
            value = np.asarray(getattr(self, name))
            if value.ndim != 1:
                raise VideoIndexError(f"{where}: index array {name!r} is not one-dimensional")
            if value.dtype != dtype:
                if name == "keyframes" or not np.issubdtype(value.dtype, np.integer):
                    raise VideoIndexError(f"{where}: index array {name!r} has dtype {value.dtype}")
                value = value.astype(np.int64)
            setattr(self, name, value)
        count = len(self.offsets)
        if count == 0 or any(len(getattr(self, name)) != count for name in _ARRAY_FIELDS):
            raise VideoIndexError(f"{where}: index arrays are empty or of different lengths")
        if self.codec not in {codec for codec, _ in SAMPLE_ENTRIES.values()}:
            raise VideoIndexError(f"{where}: unsupported codec {self.codec!r}")
        if not 0 < self.timescale <= _MAX_TIMESCALE:
            raise VideoIndexError(f"{where}: invalid timescale {self.timescale}")
        if (
            np.any(self.sizes <= 0)
            or np.any(self.offsets < 0)
            or np.any(self.offsets + self.sizes > self.file_size)
        ):
            raise VideoIndexError(
                f"{where}: a sample is empty or lies outside the file ({self.file_size} bytes)"
            )
        if np.any(self.pts < self.dts):
            raise VideoIndexError(f"{where}: a sample is presented before it is decoded")
        if np.any(self.durations < 0) or np.any(np.diff(self.dts) != self.durations[:-1]):
            raise VideoIndexError(f"{where}: decode times do not follow the sample durations")
        order = np.argsort(self.pts, kind="stable")
        sorted_pts = self.pts[order]
        if count > 1 and np.any(sorted_pts[1:] == sorted_pts[:-1]):
            raise VideoIndexError(f"{where}: two samples share a presentation time")
        self._presentation_order = order
        self._keyframe_indices = np.flatnonzero(self.keyframes)
        self._is_reordered = bool(np.any(np.diff(self.pts) < 0))

    # -- derived views --------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def presentation_order(self) -> np.ndarray:
        """Sample indices (decode order) sorted by ``pts``."""
        return self._presentation_order

    @property
    def presentation_pts(self) -> np.ndarray:
        """``pts`` in presentation order (``pts[presentation_order]``), ascending; computed once."""
        cached: np.ndarray | None = self.__dict__.get("_presentation_pts")
        if cached is None:
            cached = self.__dict__["_presentation_pts"] = self.pts[self._presentation_order]
        return cached

    @property
    def keyframe_indices(self) -> np.ndarray:
        """Decode-order indices of the sync samples."""
        return self._keyframe_indices

    @property
    def is_reordered(self) -> bool:
        """True when presentation order differs from decode order (B-frames)."""
        return self._is_reordered

    @property
    def frame_duration(self) -> float:
        """The mean distance between consecutive presentation times, in ticks."""
        if len(self) < 2:
            return float(max(int(self.durations[0]), 1))
        span = int(self.pts[self._presentation_order[-1]]) - int(self.pts[self._presentation_order[0]])
        return span / (len(self) - 1)

    @property
    def timestamps_s(self) -> np.ndarray:
        """Presentation time of every sample in seconds (decode order), float64."""
        return self.pts / self.timescale

    # -- plain arrays ---------------------------------------------------------------------
    def to_arrays(self) -> dict[str, np.ndarray]:
        """Every field as a numpy array: arrays as is, integers and text 0-d, bytes as uint8."""
        out: dict[str, np.ndarray] = {"index_format_version": np.array(INDEX_FORMAT_VERSION, dtype=np.int64)}
        for name in _ARRAY_FIELDS:
            out[name] = getattr(self, name)
        for name in _INT_FIELDS:
            out[name] = np.array(getattr(self, name), dtype=np.int64)
        for name in _TEXT_FIELDS:
            out[name] = np.array(getattr(self, name), dtype=np.str_)
        for name in _BYTES_FIELDS:
            out[name] = np.frombuffer(getattr(self, name), dtype=np.uint8).copy()
        return out

    @classmethod
    def from_arrays(cls, arrays: Any) -> VideoIndex:
        """Rebuild an index from :meth:`to_arrays` output (a dict or an opened NPZ)."""
        try:
            version = int(arrays["index_format_version"])
            if version != INDEX_FORMAT_VERSION:
                raise VideoIndexError(f"unsupported index format version {version}")
            values: dict[str, Any] = {name: np.asarray(arrays[name]) for name in _ARRAY_FIELDS}
            values.update({name: int(arrays[name]) for name in _INT_FIELDS})
            values.update({name: str(np.asarray(arrays[name])[()]) for name in _TEXT_FIELDS})
            values.update(
                {name: np.asarray(arrays[name], dtype=np.uint8).tobytes() for name in _BYTES_FIELDS}
            )
        except KeyError as missing:
            raise VideoIndexError(f"index arrays lack the field {missing}") from None
        return cls(**values)


def read_index(path_or_url: str | os.PathLike[str], source: ByteSource | None = None) -> VideoIndex:
    """Index the first video track of an MP4.

    Without ``source``, ``path_or_url`` is a local file (read through a :class:`LocalSource` on
    its folder). With ``source``, it is a path relative to that source's root.
    Raises :class:`VideoIndexError` naming the file for anything that cannot be indexed, and
    the source's own errors (e.g. ``SourceFileNotFoundError``) when it cannot be read.
    """
    if source is None:
        local = Path(path_or_url).expanduser().resolve()
        return read_index_from_source(LocalSource(local.parent), local.name)
    return read_index_from_source(source, Path(path_or_url).as_posix())


def read_index_from_source(source: ByteSource, path: str, size: int | None = None) -> VideoIndex:
    """Index ``path`` of ``source`` with at most two ``read_ranges`` calls (the ``moov`` only),
    plus ``source.info`` when its byte ``size`` is not given (known from a listing, it costs no request).

    The two-call bound holds for the layouts FFmpeg writes (moov before or after mdat).
    """
    where = f"{source.url.rstrip('/')}/{path}"
    file_size = source.info(path).size if size is None else int(size)
    location = locate_moov(lambda ranges: source.read_ranges(path, ranges), file_size, where)
    return parse_moov(location.moov, file_size, path, where)


def read_index_from_bytes(data: bytes | bytearray | memoryview, path: str = "<memory>") -> VideoIndex:
    """Index an MP4 held in memory (for example a materialised clip)."""
    view = memoryview(data)
    location = locate_moov(lambda ranges: [bytes(view[a:b]) for a, b in ranges], len(view), path)
    return parse_moov(location.moov, len(view), path, path)


def parse_moov(moov: bytes, file_size: int, path: str, where: str) -> VideoIndex:
    """Build the :class:`VideoIndex` of the first video track from the ``moov`` box bytes."""
    moov_box = parse_box_header(moov, 0, len(moov), where)
    if moov_box.type != "moov":
        raise VideoIndexError(f"{where}: expected a moov box, found {moov_box.type!r}")
    boxes = children(moov, moov_box, where)
    if find_child(boxes, "mvex") is not None:
        raise VideoIndexError(f"{where}: fragmented MP4 (moov/mvex) is not supported")
    mvhd = require_child(boxes, "mvhd", "moov", where)
    movie_timescale = _header_timescale(moov, mvhd, where)
    for trak in (box for box in boxes if box.type == "trak"):
        track = _VideoTrack.find(moov, trak, where)
        if track is not None:
            return track.build(moov, movie_timescale, file_size, path, where)
    raise VideoIndexError(f"{where}: no video track")


def _payload(data: bytes, box: Box) -> memoryview:
    return memoryview(data)[box.payload_start : box.end]


def _header_timescale(data: bytes, box: Box, where: str) -> int:
    """The timescale field of an ``mvhd`` or ``mdhd`` box (v0 or v1)."""
    payload = _payload(data, box)
    version, _ = full_box_fields(payload, box.type, where)
    position = 20 if version == 1 else 12
    if len(payload) < position + 4:
        raise VideoIndexError(f"{where}: {box.type} box is truncated")
    return int(struct.unpack_from(">I", payload, position)[0])


@dataclass
class _VideoTrack:
    """The boxes of one video ``trak`` needed to build an index."""

    trak: Box
    mdia: Box
    stbl: list[Box]
    mdhd: Box
    elst: Box | None

    @classmethod
    def find(cls, data: bytes, trak: Box, where: str) -> _VideoTrack | None:
        """The track's boxes if ``trak`` is a video track, else ``None``."""
        trak_boxes = children(data, trak, where)
        mdia = require_child(trak_boxes, "mdia", "trak", where)
        mdia_boxes = children(data, mdia, where)
        hdlr = require_child(mdia_boxes, "hdlr", "mdia", where)
        handler = _payload(data, hdlr)
        if len(handler) < 12:
            raise VideoIndexError(f"{where}: hdlr box is truncated")
        if fourcc(bytes(handler[8:12])) != "vide":
            return None
        minf = require_child(mdia_boxes, "minf", "mdia", where)
        stbl = require_child(children(data, minf, where), "stbl", "minf", where)
        edts = find_child(trak_boxes, "edts")
        elst = find_child(children(data, edts, where), "elst") if edts is not None else None
        return cls(
            trak, mdia, children(data, stbl, where), require_child(mdia_boxes, "mdhd", "mdia", where), elst
        )

    def build(self, data: bytes, movie_timescale: int, file_size: int, path: str, where: str) -> VideoIndex:
        timescale = _header_timescale(data, self.mdhd, where)
        if timescale == 0:
            raise VideoIndexError(f"{where}: the video track's timescale is 0")
        if timescale > _MAX_TIMESCALE:
            raise VideoIndexError(f"{where}: the video track's timescale {timescale} is out of range")
        stsd = require_child(self.stbl, "stsd", "stbl", where)
        codec, sample_entry, codec_config, width, height = _sample_description(data, stsd, where)
        samples = expand_samples(self._tables(data, file_size, where), file_size, where)
        edits: list[EditEntry] | None = None
        if self.elst is not None:
            edits = parse_elst(_payload(data, self.elst), where)
        timing = apply_edit_list(samples, edits, timescale, movie_timescale, where)
        return VideoIndex(
            path=path,
            file_size=file_size,
            codec=codec,
            sample_entry=sample_entry,
            codec_config=codec_config,
            stsd=bytes(data[stsd.start : stsd.end]),
            width=width,
            height=height,
            timescale=timescale,
            media_time=timing.media_time,
            empty_edit_duration=timing.empty_edit_duration,
            offsets=samples.offsets,
            sizes=samples.sizes,
            dts=timing.dts,
            pts=timing.pts,
            durations=samples.durations,
            keyframes=samples.keyframes,
        )

    def _tables(self, data: bytes, file_size: int, where: str) -> SampleTables:
        def box(name: str) -> Box | None:
            return find_child(self.stbl, name)

        stsz, stz2 = box("stsz"), box("stz2")
        if stsz is not None:
            sizes = parse_stsz(_payload(data, stsz), where, file_size)
        elif stz2 is not None:
            sizes = parse_stz2(_payload(data, stz2), where)
        else:
            raise VideoIndexError(f"{where}: stbl has neither stsz nor stz2")
        stco, co64 = box("stco"), box("co64")
        chunk_box = stco if stco is not None else co64
        if chunk_box is None:
            raise VideoIndexError(f"{where}: stbl has neither stco nor co64")
        stts = require_child(self.stbl, "stts", "stbl", where)
        stsc = require_child(self.stbl, "stsc", "stbl", where)
        ctts, stss = box("ctts"), box("stss")
        composition = parse_ctts(_payload(data, ctts), where) if ctts is not None else None
        if composition is not None and len(composition[0]) == 0:
            composition = None
        return SampleTables(
            sizes=sizes,
            chunk_offsets=parse_chunk_offsets(_payload(data, chunk_box), chunk_box.type, where),
            sample_to_chunk=parse_stsc(_payload(data, stsc), where),
            time_to_sample=parse_stts(_payload(data, stts), where),
            composition_offsets=composition,
            sync_samples=parse_stss(_payload(data, stss), where) if stss is not None else None,
        )


def _sample_description(data: bytes, stsd: Box, where: str) -> tuple[str, str, bytes, int, int]:
    """``(codec, sample entry type, codec configuration payload, width, height)``."""
    payload = _payload(data, stsd)
    full_box_fields(payload, "stsd", where)
    if len(payload) < 8:
        raise VideoIndexError(f"{where}: stsd box is truncated")
    (entry_count,) = struct.unpack_from(">I", payload, 4)
    if entry_count != 1:
        raise VideoIndexError(
            f"{where}: stsd has {entry_count} sample descriptions (exactly one is supported)"
        )
    entries = children(data, stsd, where, skip=8)
    if not entries:
        raise VideoIndexError(f"{where}: stsd holds no sample entry")
    entry = entries[0]
    if entry.type not in SAMPLE_ENTRIES:
        raise VideoIndexError(
            f"{where}: unsupported video sample entry {entry.type!r} (expected av01, avc1 or hvc1)"
        )
    codec, config_type = SAMPLE_ENTRIES[entry.type]
    fields = _payload(data, entry)
    if len(fields) < _VISUAL_SAMPLE_ENTRY_FIELDS:
        raise VideoIndexError(f"{where}: {entry.type} sample entry is truncated")
    width, height = struct.unpack_from(">HH", fields, 24)
    config = find_child(children(data, entry, where, skip=_VISUAL_SAMPLE_ENTRY_FIELDS), config_type)
    if config is None:
        raise VideoIndexError(f"{where}: {entry.type} sample entry has no {config_type} box")
    return codec, entry.type, bytes(data[config.payload_start : config.end]), int(width), int(height)
