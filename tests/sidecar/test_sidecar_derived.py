"""The derived index: exact smallest dtypes, constants stored once, read-only views, plan parity."""

from __future__ import annotations

import dataclasses
import mmap
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lerobot_nodes.errors import SidecarFormatError
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.mp4.index import read_index_from_source
from lerobot_nodes.mp4.plan import plan_clip
from lerobot_nodes.sidecar import MappedRecord, MappedVideoIndex, smallest_exact_dtype
from lerobot_nodes.sidecar.derived import (
    ALWAYS_DENSE,
    COMPACTABLE_COLUMNS,
    DERIVED_GENERATION,
    is_file_mapped,
    write_record,
)
from lerobot_nodes.sidecar.schema import SourceIdentity
from lerobot_nodes.sources import LocalSource

_FAMILIES = {
    False: [np.uint8, np.uint16, np.uint32, np.uint64],
    True: [np.int8, np.int16, np.int32, np.int64],
}
_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _brute_force_smallest(values: np.ndarray, signed: bool) -> np.dtype:
    low, high = int(values.min()), int(values.max())
    family = _FAMILIES[signed or low < 0]
    return next(np.dtype(d) for d in family if np.iinfo(d).min <= low and high <= np.iinfo(d).max)


def _identity(path: str = "videos/cam/chunk-000/file-000.mp4") -> SourceIdentity:
    return SourceIdentity(path, 1000, "fp", None)


def _column(draw: Any, length: int) -> np.ndarray:
    """A column of one of the shapes that matter: constant, narrow, wide, or anything in int64."""
    kind = draw(st.sampled_from(["constant", "narrow", "wide", "any"]))
    if kind == "constant":
        return np.full(length, draw(_INT64), dtype=np.int64)
    if kind == "narrow":
        base = draw(st.integers(-(2**40), 2**40))
        return base + np.array(draw(st.lists(st.integers(-300, 300), min_size=length, max_size=length)), dtype=np.int64)
    if kind == "wide":
        bound = draw(st.sampled_from([2**7, 2**8, 2**15, 2**16, 2**31, 2**32, 2**62]))
        return np.array(draw(st.lists(st.integers(-bound, bound - 1), min_size=length, max_size=length)), dtype=np.int64)
    return np.array(draw(st.lists(_INT64, min_size=length, max_size=length)), dtype=np.int64)


@st.composite
def index_arrays(draw: Any) -> dict[str, np.ndarray]:
    length = draw(st.integers(1, 40))
    arrays = {name: _column(draw, length) for name in ("sizes", "dts", "pts", "durations")}
    if draw(st.booleans()):  # constant-stride offsets, as constant-size samples give
        start, step = draw(st.integers(0, 2**40)), draw(st.integers(0, 2**16))
        arrays["offsets"] = start + step * np.arange(length, dtype=np.int64)
    else:
        arrays["offsets"] = np.abs(_column(draw, length) // 2)
    arrays["keyframes"] = np.array(draw(st.lists(st.booleans(), min_size=length, max_size=length)))
    arrays["timescale"] = np.array(draw(st.integers(1, 2**31)), dtype=np.int64)
    arrays["codec"] = np.array("av1")
    arrays["codec_config"] = np.frombuffer(draw(st.binary(max_size=40)), dtype=np.uint8).copy()
    return arrays


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays=index_arrays())
def test_dtype_shrinking_is_exact_and_minimal(tmp_path: Path, arrays: dict[str, np.ndarray]) -> None:
    target = tmp_path / "record.idx"
    write_record(target, _identity(), arrays, origin="hypothesis")
    record = MappedRecord.open(target)
    layouts = record.header["arrays"]
    for name, original in arrays.items():
        view = record.arrays[name]
        assert view.shape == original.shape, name
        assert not view.flags.writeable, name
        if original.dtype.kind in "iu":
            assert np.array_equal(view.astype(np.int64), original), name  # every value exact
            kind = layouts[name]["kind"]
            if original.size == 0:
                continue
            expected = _brute_force_smallest(original, signed=name in {"dts", "pts", "durations"})
            assert view.dtype.itemsize <= expected.itemsize, (name, view.dtype, expected)
            compactable = name in COMPACTABLE_COLUMNS and name not in ALWAYS_DENSE  # per-sample columns, not codec bytes
            if compactable and original.ndim == 1 and len(original) >= 2 and np.all(original == original[0]):
                assert kind == "constant", name  # stored once ...
                assert view.strides == (0,)  # ... yet the view keeps the logical sample count
        elif original.dtype.kind == "b":
            assert layouts[name]["kind"] == "dense" and view.dtype == np.bool_  # keyframes stay dense
            assert np.array_equal(view, original)
        else:
            assert np.array_equal(view, original), name
    assert record.samples == len(arrays["offsets"])
    assert np.array_equal(record.arrays["presentation_order"], np.argsort(arrays["pts"], kind="stable"))
    assert np.array_equal(record.arrays["keyframe_indices"], np.flatnonzero(arrays["keyframes"]))


def test_smallest_exact_dtype_examples() -> None:
    assert smallest_exact_dtype(0, 255) == np.uint8
    assert smallest_exact_dtype(0, 256) == np.uint16
    assert smallest_exact_dtype(-1, 127) == np.int8
    assert smallest_exact_dtype(0, 40000, signed=True) == np.int32
    assert smallest_exact_dtype(-(2**63), 0) == np.int64
    with pytest.raises(OverflowError):
        smallest_exact_dtype(-1, 2**63)


def _same(a: Any, b: Any) -> bool:
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


@pytest.mark.parametrize("dataset", ["lerobot_av1", "lerobot_h264", "h264_many_files", "av1_dataset"])
def test_mapped_index_plans_exactly_like_the_parsed_index(
    dataset: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    root = request.getfixturevalue(dataset)
    source = LocalSource(root)
    meta = load_meta(source)
    episodes_by_file: dict[str, list[tuple[float, float]]] = {}
    for episode in range(len(meta.episodes)):
        for key in meta.video_keys:
            episodes_by_file.setdefault(meta.video_file(episode, key), []).append(meta.video_span(episode, key))
    for number, (path, spans) in enumerate(sorted(episodes_by_file.items())):
        parsed = read_index_from_source(source, path)
        target = tmp_path / f"{number}.idx"
        write_record(target, SourceIdentity.of(source.info(path), None), parsed.to_arrays(), origin="test")
        mapped = MappedVideoIndex(MappedRecord.open(target))
        assert mapped.is_reordered == parsed.is_reordered
        assert mapped.frame_duration == parsed.frame_duration
        assert np.array_equal(mapped.keyframe_indices, parsed.keyframe_indices)
        assert np.array_equal(mapped.presentation_order, parsed.presentation_order)
        for name, value in parsed.to_arrays().items():
            assert np.array_equal(mapped.to_arrays()[name], value), name
        for from_s, to_s in spans:
            assert _same(plan_clip(mapped, from_s, to_s), plan_clip(parsed, from_s, to_s)), (path, from_s)


def test_lerobot_written_av1_record_is_compact(lerobot_av1: Path, tmp_path: Path) -> None:
    source = LocalSource(lerobot_av1)
    path = load_meta(source).video_files()[0]
    parsed = read_index_from_source(source, path)
    size = write_record(tmp_path / "r.idx", SourceIdentity.of(source.info(path), None), parsed.to_arrays(), "test")
    record = MappedRecord.open(tmp_path / "r.idx")
    # The header costs the same whatever the frame count; what grows with the file is the data.
    per_frame = record.header["data_size"] / len(parsed)
    assert per_frame <= 20, f"{per_frame:.1f} B/frame"
    assert size - record.header["data_size"] <= 4096
    kinds = {name: layout["kind"] for name, layout in record.header["arrays"].items()}
    assert kinds["durations"] == "constant" and kinds["keyframes"] == "dense"
    assert record.arrays["offsets"].dtype == np.uint32 and record.arrays["sizes"].dtype == np.uint16


def test_views_are_read_only_and_outlive_the_file(av1_dataset: Path, tmp_path: Path) -> None:
    source = LocalSource(av1_dataset)
    path = load_meta(source).video_files()[0]
    parsed = read_index_from_source(source, path)
    target = tmp_path / "r.idx"
    write_record(target, SourceIdentity.of(source.info(path), None), parsed.to_arrays(), "test")
    mapped = MappedVideoIndex(MappedRecord.open(target))
    assert _is_mapped(mapped.offsets) and _is_mapped(mapped.pts)  # dense columns: no private copy
    with pytest.raises(ValueError):
        mapped.offsets[0] = 1
    target.unlink()  # a replaced or deleted record stays readable to whoever mapped it
    assert np.array_equal(mapped.to_video_index().offsets, parsed.offsets)


def test_truncated_or_foreign_records_are_rejected(av1_dataset: Path, tmp_path: Path) -> None:
    source = LocalSource(av1_dataset)
    path = load_meta(source).video_files()[0]
    target = tmp_path / "r.idx"
    write_record(target, SourceIdentity.of(source.info(path), None), read_index_from_source(source, path).to_arrays(), "t")
    data = target.read_bytes()
    for cut in (0, 10, 100, len(data) - 1):
        (tmp_path / "cut.idx").write_bytes(data[:cut])
        with pytest.raises(SidecarFormatError):
            MappedRecord.open(tmp_path / "cut.idx")
    future = bytearray(data)
    future[8:12] = (DERIVED_GENERATION + 1).to_bytes(4, "little")
    (tmp_path / "future.idx").write_bytes(bytes(future))
    with pytest.raises(SidecarFormatError, match="generation"):
        MappedRecord.open(tmp_path / "future.idx")


def _is_mapped(array: np.ndarray) -> bool:
    """True when ``array`` is a view of a file mapping (not a private copy)."""
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap) or is_file_mapped(array)


def test_pickled_index_maps_the_same_record_instead_of_copying(av1_dataset: Path, tmp_path: Path) -> None:
    source = LocalSource(av1_dataset)
    path = load_meta(source).video_files()[0]
    target = tmp_path / "r.idx"
    write_record(target, SourceIdentity.of(source.info(path), None), read_index_from_source(source, path).to_arrays(), "t")
    mapped = MappedVideoIndex(MappedRecord.open(target))
    payload = pickle.dumps(mapped)
    assert len(payload) < 1000  # the record's path, not its arrays
    restored = pickle.loads(payload)
    assert isinstance(restored, MappedVideoIndex) and restored.record.path == target
    assert _is_mapped(restored.pts) and _is_mapped(restored.offsets)
    assert all(np.array_equal(restored.to_arrays()[k], v) for k, v in mapped.to_arrays().items())


EXIT_THEN_READ = """
import atexit, sys
import numpy as np
from lerobot_nodes.sidecar import MappedRecord, MappedVideoIndex
mapped = MappedVideoIndex(MappedRecord.open(sys.argv[1]))
offsets = mapped.offsets
atexit._run_exitfuncs()  # what a console script runs before os._exit, with decode threads maybe still reading
print(int(np.asarray(offsets, dtype=np.int64).sum()))
"""


def test_a_mapping_stays_readable_while_exit_handlers_run(av1_dataset: Path, tmp_path: Path) -> None:
    """An exit handler never unmaps a record arrays still point into (it crashed a stream that ended
    in an error, its decode threads still reading indexes)."""
    import subprocess
    import sys

    source = LocalSource(av1_dataset)
    path = load_meta(source).video_files()[0]
    parsed = read_index_from_source(source, path)
    target = tmp_path / "r.idx"
    write_record(target, SourceIdentity.of(source.info(path), None), parsed.to_arrays(), "test")
    result = subprocess.run([sys.executable, "-c", EXIT_THEN_READ, str(target)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert int(result.stdout) == int(parsed.offsets.astype(np.int64).sum())


def test_a_mapped_record_keeps_its_summary_and_views_of_one_array_over_the_mapping(tmp_path: Path) -> None:
    """A rank maps a record per MP4 file (20,000 on a DROID-sized dataset): it keeps the few header
    fields it reads, not the parsed layouts (half a record's memory), and its dense views slice one
    array over the mapping instead of exporting the buffer once each."""
    arrays = {
        "offsets": np.array([0, 7, 19, 40], dtype=np.int64),
        "sizes": np.array([7, 12, 21, 3], dtype=np.int64),
        "dts": np.arange(4, dtype=np.int64) * 512,
        "pts": np.array([0, 1024, 512, 1536], dtype=np.int64),
        "durations": np.full(4, 512, dtype=np.int64),
        "keyframes": np.array([True, False, False, True]),
        "timescale": np.array(15360, dtype=np.int64),
        "codec": np.array("h264"),
        "codec_config": np.arange(9, dtype=np.uint8),
    }
    target = tmp_path / "record.idx"
    write_record(target, _identity(), arrays, origin="summary")
    record = MappedRecord.open(target)
    assert set(record.summary) == {"identity", "origin", "samples", "is_reordered"}
    assert record.header["arrays"]["pts"]["kind"] == "dense" and record.header["samples"] == 4  # parsed again
    assert (record.samples, record.origin, record.identity) == (4, "summary", _identity())
    kinds = {name: layout["kind"] for name, layout in record.header["arrays"].items()}
    dense = [record.arrays[name] for name, kind in kinds.items() if kind == "dense"]
    assert len(dense) >= 4 and len({id(view.base) for view in dense}) == 1
    assert all(isinstance(view.base, np.ndarray) and is_file_mapped(view) for view in dense)
    for name in ("offsets", "sizes", "pts", "codec_config"):
        np.testing.assert_array_equal(record.arrays[name].astype(np.int64), arrays[name].astype(np.int64))
