"""The derived index: one read-only, memory-mapped record per source video file.

The first open converts a file's index (from a published archive or a local build) into a
record under ``$HF_LEROBOT_HOME/streaming-indexes``. Guarantees of a record:

- **Exact.** Every integer column is stored in the smallest dtype of its family that holds all
  of its values (unsigned for byte offsets, sizes and orders; signed for times, which are
  differenced), so every value reads back identical. Presentation times stay integer ticks.
- **Constant columns stored once** (durations; sizes or times that never change): the view is
  a stride-0 read-only array that keeps the logical sample count. Byte offsets with a constant
  stride are stored as ``start`` and ``step``. Sync-sample (keyframe) flags always stay dense.
- **Lookups computed once.** The presentation order (sample indices sorted by pts) and the
  sync-sample indices are stored too, so no process sorts or scans the tables again.
- **Shared.** Dense columns are read-only views of one shared file mapping, so processes that
  open the same record share its page-cache pages instead of holding private copies.
- **No file descriptor per record.** The record's file is closed as soon as it is mapped (the
  mapping outlives it, as POSIX guarantees), so the descriptors a process holds do not grow
  with the number of records it has open (:func:`map_readonly`).
- **Immutable.** A record is written once (atomically) and never modified; its header names the
  source identity and the generation of this format (:data:`DERIVED_GENERATION`).

Record layout: ``MAGIC`` (8 bytes), generation (uint32 LE), header length (uint32 LE), header
(UTF-8 JSON), zero padding to 64 bytes, then each dense array 64-byte aligned, at the offsets
the header gives relative to the start of that data region.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import math
import mmap
import os
import struct
import sys
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, cast

import numpy as np

from ..atomic import atomic_write
from ..errors import SidecarFormatError
from ..mp4.index import VideoIndex
from .schema import SourceIdentity

DERIVED_GENERATION = 1
"""Version of the record layout; a reader only maps records of its own generation."""

MAGIC = b"LRNIDX\r\n"
_PREAMBLE = struct.Struct("<8sII")
_ALIGN = 64

SAMPLE_COLUMNS = ("offsets", "sizes", "dts", "pts", "durations", "keyframes")
TIME_COLUMNS = frozenset({"dts", "pts", "durations", "media_time", "empty_edit_duration"})
ALWAYS_DENSE = frozenset({"keyframes"})
STRIDE_COLUMNS = frozenset({"offsets", "presentation_order", "keyframe_indices"})
PRESENTATION_ORDER = "presentation_order"
KEYFRAME_INDICES = "keyframe_indices"
LOOKUP_COLUMNS = (PRESENTATION_ORDER, KEYFRAME_INDICES)
"""Computed once at conversion and shared, instead of by every process that opens the index."""
COMPACTABLE_COLUMNS = frozenset({*SAMPLE_COLUMNS, *LOOKUP_COLUMNS})

_UNSIGNED = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.uint64))
_SIGNED = (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32), np.dtype(np.int64))


def smallest_exact_dtype(low: int, high: int, signed: bool = False) -> np.dtype:
    """The narrowest integer dtype holding every value of ``[low, high]``.

    Unsigned unless ``signed`` or ``low < 0``. Raises ``OverflowError`` beyond 64 bits.
    """
    family = _SIGNED if signed or low < 0 else _UNSIGNED
    for dtype in family:
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return dtype
    raise OverflowError(f"no 64-bit integer dtype holds [{low}, {high}]")


def _align(value: int) -> int:
    return -(-value // _ALIGN) * _ALIGN


# -- read-only file mappings that hold no file descriptor ------------------------------------
#
# CPython's ``mmap.mmap`` keeps a dup of the file descriptor for as long as the mapping lives
# (for ``size()`` and ``resize()``), so a process holding N records held N descriptors and failed
# with EMFILE past ``ulimit -n``. Python 3.13 has ``trackfd=False``; before it, the mapping is
# made with the C library's ``mmap`` and the file is closed at once. Either way the pages are the
# same shared, file-backed page-cache pages.

_MAP_FAILED = ctypes.c_void_p(-1).value


class _Libc:
    """``mmap``/``munmap`` of the C library, or ``None`` where there is none (Windows)."""

    def __init__(self) -> None:
        self.lib: Any = None
        if os.name != "posix":
            return
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.mmap.restype = ctypes.c_void_p
            lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
            lib.munmap.restype = ctypes.c_int
            lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        except (OSError, AttributeError):
            return
        self.lib = lib


_LIBC = _Libc()
_TRACKFD = sys.version_info >= (3, 13)


class FileMapping:
    """Marks the buffer of a read-only mapping made without a file descriptor (see :func:`map_readonly`)."""

    __slots__ = ("address", "length", "path", "__weakref__")

    def __init__(self, address: int, length: int, path: str) -> None:
        self.address = address
        self.length = length
        self.path = path


def _unmap(address: int, length: int) -> None:
    _LIBC.lib.munmap(address, length)


def map_readonly(handle: Any, size: int, path: Path) -> Any:
    """A read-only buffer over the first ``size`` bytes of the open file ``handle``, which the
    caller may close right away: the buffer holds no file descriptor.

    Python >= 3.13: ``mmap.mmap(..., trackfd=False)``. Before: the C library's ``mmap``, the
    buffer a read-only ``memoryview`` unmapped when its last view is collected. Where neither
    exists, the bytes are read into memory (private, no descriptor either).
    """
    if _TRACKFD:
        return mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ, trackfd=False)  # type: ignore[call-arg]
    if _LIBC.lib is None:
        handle.seek(0)
        return handle.read(size)
    address = _LIBC.lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, handle.fileno(), 0)
    if address is None or address == _MAP_FAILED:
        error = ctypes.get_errno()
        raise OSError(error, f"mmap of {path} failed: {os.strerror(error)}")
    raw = (ctypes.c_char * size).from_address(address)
    raw.mapping = FileMapping(address, size, str(path))  # type: ignore[attr-defined]
    unmap = weakref.finalize(raw, _unmap, address, size)
    # Not at interpreter exit: finalizers left then run while other threads may still read the
    # arrays (a decode thread of a graph that was never closed); the OS unmaps at exit anyway.
    unmap.atexit = False
    return memoryview(raw).toreadonly()


def is_file_mapped(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a record's file mapping (not a private copy)."""
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap) or isinstance(getattr(base, "mapping", None), FileMapping)


class ArrayLayout(NamedTuple):
    """How one array is stored in a record.

    ``kind`` is ``dense`` (``nbytes`` at ``offset`` of the data region), ``constant``
    (``value`` repeated ``shape[0]`` times), ``stride`` (element ``i`` is ``value + step * i``)
    or ``text`` (``value`` is the string). A named tuple, not a dataclass: every record a process
    maps makes one per array (20 per MP4 file), and a frozen dataclass's constructor was most of a
    warm index open's time.
    """

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    offset: int = 0
    nbytes: int = 0
    value: Any = None
    step: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "dtype": self.dtype, "shape": list(self.shape)}
        if self.kind == "dense":
            out.update(offset=self.offset, nbytes=self.nbytes)
        elif self.kind in ("constant", "text"):
            out["value"] = self.value
        elif self.kind == "stride":
            out.update(value=self.value, step=self.step)
        return out

    @classmethod
    def from_json(cls, name: str, value: Mapping[str, Any]) -> ArrayLayout:
        return cls(
            name=name,
            kind=str(value["kind"]),
            dtype=str(value["dtype"]),
            shape=tuple(map(int, value["shape"])),
            offset=int(value.get("offset", 0)),
            nbytes=int(value.get("nbytes", 0)),
            value=value.get("value"),
            step=int(value.get("step", 0)),
        )


def _integer_layout(name: str, array: np.ndarray, upper_bound: int | None) -> tuple[ArrayLayout, np.ndarray | None]:
    """Layout of an integer array and the dense data to store (``None`` when nothing is)."""
    signed = name in TIME_COLUMNS
    if array.size == 0:
        dtype = smallest_exact_dtype(0, 0, signed)
        return ArrayLayout(name, "dense", dtype.str, array.shape), array.astype(dtype)
    low, high = int(array.min()), int(array.max())
    dtype = smallest_exact_dtype(low, high if upper_bound is None else max(high, upper_bound), signed)
    if array.ndim == 0:
        return ArrayLayout(name, "constant", dtype.str, (), value=low), None
    if name in COMPACTABLE_COLUMNS and name not in ALWAYS_DENSE and array.ndim == 1 and len(array) >= 2:
        if low == high:
            return ArrayLayout(name, "constant", dtype.str, array.shape, value=low), None
        if name in STRIDE_COLUMNS and len(array) >= 3:
            steps = np.diff(array.astype(np.int64))
            if np.all(steps == steps[0]):
                return ArrayLayout(name, "stride", dtype.str, array.shape, value=int(array[0]), step=int(steps[0])), None
    return ArrayLayout(name, "dense", dtype.str, array.shape), array.astype(dtype)


def plan_record(arrays: Mapping[str, np.ndarray]) -> tuple[list[ArrayLayout], list[np.ndarray]]:
    """Layouts of every array and the dense blobs in data-region order (offsets filled in)."""
    file_size = int(np.asarray(arrays["file_size"])) if "file_size" in arrays else None
    layouts: list[ArrayLayout] = []
    blobs: list[np.ndarray] = []
    position = 0
    for name in sorted(arrays):
        array = np.asarray(arrays[name])
        data: np.ndarray | None
        if array.dtype.kind == "U":
            if array.ndim != 0:
                raise SidecarFormatError(f"text array {name!r} must be 0-d")
            layout, data = ArrayLayout(name, "text", array.dtype.str, (), value=str(array[()])), None
        elif array.dtype.kind == "b":
            layout, data = ArrayLayout(name, "dense", np.dtype(bool).str, array.shape), array
        elif array.dtype.kind in "iu":
            layout, data = _integer_layout(name, array, file_size if name == "offsets" else None)
        elif array.dtype.kind == "f":
            layout, data = ArrayLayout(name, "dense", np.dtype(np.float64).str, array.shape), array.astype(np.float64)
        else:
            raise SidecarFormatError(f"array {name!r} has dtype {array.dtype}, which a record cannot store")
        if data is not None:
            data = np.require(data, requirements="C")
            layout = ArrayLayout(layout.name, layout.kind, layout.dtype, layout.shape, offset=position, nbytes=data.nbytes)
            position = _align(position + data.nbytes)
            blobs.append(data)
        layouts.append(layout)
    return layouts, blobs


def with_lookup_columns(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` plus the decode-order indices sorted by pts and the sync-sample indices."""
    out = dict(arrays)
    out[PRESENTATION_ORDER] = np.argsort(np.asarray(arrays["pts"]), kind="stable")
    out[KEYFRAME_INDICES] = np.flatnonzero(np.asarray(arrays["keyframes"]))
    return out


def write_record(target: Path, identity: SourceIdentity, arrays: Mapping[str, np.ndarray], origin: str) -> int:
    """Write the record of one file's index arrays atomically at ``target``; return its size.

    ``arrays`` are :meth:`VideoIndex.to_arrays` values (any exact integer dtypes).
    """
    missing = [name for name in SAMPLE_COLUMNS if name not in arrays]
    if missing:
        raise SidecarFormatError(f"{identity.path}: index arrays lack {missing}")
    samples = len(arrays["offsets"])
    if any(np.asarray(arrays[name]).shape != (samples,) for name in SAMPLE_COLUMNS):
        raise SidecarFormatError(f"{identity.path}: per-sample arrays have different lengths")
    arrays = with_lookup_columns(arrays)
    pts = np.asarray(arrays["pts"])
    layouts, blobs = plan_record(arrays)
    data_size = _align(layouts_end(layouts))
    header = {
        "generation": DERIVED_GENERATION,
        "identity": identity.to_json(),
        "origin": origin,
        "samples": samples,
        "is_reordered": bool(samples > 1 and np.any(np.diff(pts.astype(np.int64)) < 0)),
        "data_size": data_size,
        "arrays": {layout.name: layout.to_json() for layout in layouts},
    }
    header_bytes = json.dumps(header, sort_keys=True).encode()
    data_start = _align(_PREAMBLE.size + len(header_bytes))
    with atomic_write(target) as out:
        out.write(_PREAMBLE.pack(MAGIC, DERIVED_GENERATION, len(header_bytes)))
        out.write(header_bytes)
        out.write(b"\0" * (data_start - _PREAMBLE.size - len(header_bytes)))
        position = 0
        dense = [layout for layout in layouts if layout.kind == "dense"]
        for layout, blob in zip(dense, blobs, strict=True):
            out.write(b"\0" * (layout.offset - position))
            out.write(blob.tobytes())
            position = layout.offset + layout.nbytes
        out.write(b"\0" * (data_size - position))
    return data_start + data_size


def layouts_end(layouts: list[ArrayLayout]) -> int:
    return max((layout.offset + layout.nbytes for layout in layouts if layout.kind == "dense"), default=0)


_SUMMARY_FIELDS = ("identity", "origin", "samples", "is_reordered")
"""The header fields a mapped record keeps parsed; the rest (the array layouts, most of the header) is
parsed again from the mapping when asked for (:attr:`MappedRecord.header`)."""


class MappedRecord:
    """A record opened read-only: its header and one array view per stored array.

    Dense views share the record's single mapping; they keep it alive for as long as any of
    them is referenced, so a record replaced or deleted on disk stays readable to its holders.
    The record's file is closed once mapped: an open record holds no file descriptor. Of the
    parsed header only :data:`_SUMMARY_FIELDS` stay in memory: a rank maps a record per MP4 file
    (20,000 on a DROID-sized dataset), and the whole parsed header was half of a record's memory.
    """

    def __init__(
        self, path: Path, header: Mapping[str, Any], arrays: dict[str, np.ndarray], nbytes: int, mapping: Any = None
    ) -> None:
        self.path = path
        self.summary = {key: header[key] for key in _SUMMARY_FIELDS if key in header}
        self.arrays = arrays
        self.nbytes = nbytes
        self._mapping = mapping
        self._header = None if mapping is not None else dict(header)

    @property
    def header(self) -> dict[str, Any]:
        """The whole header, parsed again from the mapping (not kept: see the class)."""
        if self._header is not None:
            return self._header
        _, _, length = _PREAMBLE.unpack(bytes(self._mapping[: _PREAMBLE.size]))
        return cast(dict[str, Any], json.loads(bytes(self._mapping[_PREAMBLE.size : _PREAMBLE.size + length])))

    @property
    def identity(self) -> SourceIdentity:
        return SourceIdentity.from_json(self.summary["identity"])

    @property
    def samples(self) -> int:
        return int(self.summary["samples"])

    @property
    def origin(self) -> str:
        return str(self.summary["origin"])

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Records are immutable: another process maps the same file instead of receiving copies.
        return MappedRecord.open, (str(self.path),)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> MappedRecord:
        """Map the record at ``path``; raise :class:`SidecarFormatError` if it is not a complete
        record of this generation, ``FileNotFoundError`` if it does not exist."""
        path = Path(path)
        with open(path, "rb") as handle:
            preamble = handle.read(_PREAMBLE.size)
            if len(preamble) < _PREAMBLE.size:
                raise SidecarFormatError(f"{path}: truncated derived index record")
            magic, generation, header_length = _PREAMBLE.unpack(preamble)
            if magic != MAGIC:
                raise SidecarFormatError(f"{path}: not a derived index record")
            if generation != DERIVED_GENERATION:
                raise SidecarFormatError(f"{path}: record of generation {generation}, this reader maps {DERIVED_GENERATION}")
            try:
                header = json.loads(handle.read(header_length))
                data_start = _align(_PREAMBLE.size + header_length)
                data_size = int(header["data_size"])
                layouts = [ArrayLayout.from_json(name, value) for name, value in header["arrays"].items()]
            except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
                raise SidecarFormatError(f"{path}: unreadable record header ({exc!r})") from None
            size = os.fstat(handle.fileno()).st_size
            if size != data_start + data_size or layouts_end(layouts) > data_size:
                raise SidecarFormatError(f"{path}: record is {size} bytes, its header describes {data_start + data_size}")
            mapping = map_readonly(handle, size, path)
        # One array over the whole mapping, which every dense view slices: a buffer export per view
        # (np.frombuffer of each) cost a record ~2 KB of Python objects more.
        whole = np.frombuffer(mapping, dtype=np.uint8)
        arrays = {layout.name: _view(whole, data_start, layout, path) for layout in layouts}
        return cls(path, header, arrays, size, mapping)


def _view(whole: np.ndarray, data_start: int, layout: ArrayLayout, path: Path) -> np.ndarray:
    """The array of ``layout``: a read-only view of ``whole`` (the record's mapping as bytes) when dense."""
    dtype = np.dtype(layout.dtype)
    count = math.prod(layout.shape)  # numpy's prod of a short tuple costs 6 us, as much as the view
    if layout.kind == "dense":
        start = data_start + layout.offset
        if count * dtype.itemsize != layout.nbytes or start + layout.nbytes > len(whole):
            raise SidecarFormatError(f"{path}: array {layout.name} has {layout.nbytes} bytes for {count} x {dtype}")
        view = whole[start : start + layout.nbytes].view(dtype)
        return view if view.shape == layout.shape else view.reshape(layout.shape)
    if layout.kind == "constant":
        # Not np.ndarray(buffer=...): a view through the buffer protocol is 3 us faster but leaves
        # 40 bytes of buffer information on the value for as long as the record is mapped.
        return np.broadcast_to(np.array(layout.value, dtype=dtype), layout.shape)
    if layout.kind == "stride":
        stride = np.arange(count, dtype=np.int64) * layout.step + int(layout.value)
        materialised = stride.astype(dtype)
        materialised.flags.writeable = False
        return materialised
    if layout.kind == "text":
        text = np.array(str(layout.value), dtype=dtype)
        text.flags.writeable = False
        return text
    raise SidecarFormatError(f"{path}: array {layout.name} has an unknown layout {layout.kind!r}")


_SCALAR_FIELDS: dict[str, Any] = {"str": lambda a: str(a[()]), "int": int, "bytes": lambda a: a.tobytes()}


@functools.cache
def _index_fields() -> tuple[tuple[str, Callable[[np.ndarray], Any] | None], ...]:
    """Each :class:`VideoIndex` field set from a record array, with how its value is made from it:
    scalars and blobs as Python values (a converter), table columns as the record's views (None)."""
    fields = []
    for field in dataclasses.fields(VideoIndex):
        if field.init:
            annotation = field.type
            type_name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
            fields.append((field.name, _SCALAR_FIELDS.get(type_name)))
    return tuple(fields)


class MappedVideoIndex(VideoIndex):
    """A :class:`~lerobot_nodes.mp4.VideoIndex` whose arrays are views of a mapped record.

    Arrays keep their exact values but the record's compact dtypes (widen a slice with
    ``astype(np.int64)`` before arithmetic that could leave a column's range); they are
    read-only. The presentation order and sync-sample indices come from the record too, so no
    process sorts or scans the tables again and every process shares the same pages.
    """

    def __init__(self, record: MappedRecord) -> None:
        # VideoIndex.__init__ would validate and widen every column to private int64 copies;
        # the record was validated when it was converted or built.
        arrays = record.arrays
        self.record = record
        for name, convert in _index_fields():
            setattr(self, name, arrays[name] if convert is None else convert(arrays[name]))
        self._presentation_order = arrays[PRESENTATION_ORDER]
        self._keyframe_indices = arrays[KEYFRAME_INDICES]
        self._is_reordered = bool(record.summary["is_reordered"])

    def __reduce__(self) -> tuple[Any, tuple[MappedRecord]]:
        # Pickled into a DataLoader worker, the index maps the same record file again.
        return MappedVideoIndex, (self.record,)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The arrays in :meth:`VideoIndex.to_arrays` form (int64 copies of the columns)."""
        out = {name: value for name, value in self.record.arrays.items() if name not in LOOKUP_COLUMNS}
        for name in SAMPLE_COLUMNS:
            out[name] = np.array(out[name], dtype=bool if name == "keyframes" else np.int64)
        return out

    def to_video_index(self) -> VideoIndex:
        """An independent in-memory :class:`VideoIndex` with int64 arrays."""
        return VideoIndex.from_arrays(self.to_arrays())

    def __repr__(self) -> str:
        return f"MappedVideoIndex({self.path!r}, samples={len(self)}, record={str(self.record.path)!r})"
