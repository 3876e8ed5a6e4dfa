"""One episode's Parquet rows as per-column numpy arrays, converted the way LeRobot does.

LeRobot's map-style reader turns every row value into ``torch.tensor(value)``: floats of any
width become float32, integers int64, booleans bool, strings stay ``str``. Converting once per
episode to arrays of those final dtypes makes per-sample assembly a cheap slice.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import MetadataError


@dataclass
class EpisodeData:
    """Rows ``[0, length)`` of one episode.

    ``arrays`` hold numeric columns with a leading frame axis, in their LeRobot dtypes.
    ``objects`` hold columns returned as Python objects (strings, images decoded later,
    language structs). ``column_order`` is the data file's column order, which is the key
    order of a LeRobot sample.
    """

    episode_index: int
    from_index: int
    arrays: dict[str, np.ndarray]
    objects: dict[str, list[Any]]
    column_order: list[str]

    @property
    def length(self) -> int:
        return len(self.arrays["index"])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def _target_dtype(arrow_type: pa.DataType) -> np.dtype | None:
    if pa.types.is_floating(arrow_type):
        return np.dtype(np.float32)
    if pa.types.is_integer(arrow_type):
        return np.dtype(np.int64)
    if pa.types.is_boolean(arrow_type):
        return np.dtype(np.bool_)
    return None


def _leaf_type(arrow_type: pa.DataType) -> tuple[pa.DataType, int]:
    depth = 0
    while pa.types.is_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type) or pa.types.is_large_list(arrow_type):
        arrow_type = arrow_type.value_type
        depth += 1
    return arrow_type, depth


def _numeric_column(column: pa.ChunkedArray, name: str, source_name: str) -> np.ndarray | None:
    leaf, depth = _leaf_type(column.type)
    dtype = _target_dtype(leaf)
    if dtype is None:
        return None
    array = column.combine_chunks()
    rows = len(array)
    if array.null_count:
        raise MetadataError(f"{source_name}: column {name!r} has missing values")
    if depth == 0:
        return np.asarray(array.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)
    shape: list[int] = []
    values = array
    for _ in range(depth):
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
        if len(lengths) and not np.all(lengths == lengths[0]):
            raise MetadataError(f"{source_name}: column {name!r} has lists of different lengths")
        shape.append(int(lengths[0]) if len(lengths) else 0)
        values = pc.list_flatten(values)
    flat = np.asarray(values.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)
    return flat.reshape(rows, *shape)


def episode_data_from_table(table: pa.Table, episode_index: int, from_index: int, source_name: str) -> EpisodeData:
    """Convert the rows of one episode (already filtered and in ``index`` order)."""
    arrays: dict[str, np.ndarray] = {}
    objects: dict[str, list[Any]] = {}
    for name in table.column_names:
        if name.startswith("__index_level_"):
            continue
        converted = _numeric_column(table.column(name), name, source_name)
        if converted is not None:
            arrays[name] = converted
        else:
            objects[name] = table.column(name).to_pylist()
    for required in ("index", "timestamp", "episode_index", "task_index"):
        if required not in arrays:
            raise MetadataError(f"{source_name}: required column {required!r} is missing")
    order = [n for n in table.column_names if not n.startswith("__index_level_")]
    return EpisodeData(episode_index=episode_index, from_index=from_index, arrays=arrays, objects=objects, column_order=order)


def image_value_to_tensor(value: Any, key: str) -> Any:
    """An embedded image (HF ``Image()`` struct with PNG bytes) as float32 CHW in [0, 1]."""
    import torch

    if not isinstance(value, dict) or value.get("bytes") is None:
        raise MetadataError(f"image column {key!r} holds no embedded image bytes")
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(f"reading image feature {key!r} needs Pillow: pip install pillow") from exc
    with Image.open(io.BytesIO(value["bytes"])) as image:
        array = np.asarray(image.convert("RGB"))
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255)
