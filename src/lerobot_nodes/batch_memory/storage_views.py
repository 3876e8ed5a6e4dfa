"""Tensors that are views of one storage: one allocation (one shared-memory segment) for many tensors.

Used for the batches of :mod:`~lerobot_nodes.nodes.batcher` and :mod:`~lerobot_nodes.batch_memory.batch_slots`:
a worker sends all of a storage's tensors to the training process as one segment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

ALIGNMENT = 64
"""Byte alignment of each tensor inside the storage."""


def view_of(storage: torch.UntypedStorage, byte_offset: int, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
    """The contiguous ``dtype`` tensor of ``shape`` at ``byte_offset`` of ``storage`` (no copy)."""
    view = torch.empty(0, dtype=dtype)
    strides = torch.empty(tuple(shape), device="meta").stride()
    view.set_(storage, byte_offset // view.element_size(), tuple(shape), strides)
    return view


StorageLayout = list[tuple[str, torch.dtype, tuple[int, ...], int]]
"""``(key, dtype, shape, byte offset)`` of the tensors of a batch that lie in one storage."""


def split_by_storage(items: Mapping[str, Any], base: int) -> tuple[StorageLayout, dict[str, Any]]:
    """The contiguous tensors of ``items`` that are views of the storage starting at ``base`` (their
    places in it), and the other items: what a batch sends instead of that storage's bytes."""
    layout: StorageLayout = []
    rest: dict[str, Any] = {}
    for key, value in items.items():
        if isinstance(value, torch.Tensor) and value.is_contiguous() and value.untyped_storage().data_ptr() == base:
            layout.append((key, value.dtype, tuple(value.shape), int(value.storage_offset()) * value.element_size()))
        else:
            rest[key] = value
    return layout, rest


def new_storage(nbytes: int, shared: bool) -> torch.UntypedStorage:
    """An uninitialised storage of ``nbytes``: in shared memory with ``shared``, else process memory."""
    if shared:
        return torch.UntypedStorage._new_shared(nbytes)  # type: ignore[no-untyped-call, no-any-return]
    return torch.UntypedStorage(nbytes)


def packed_offsets(specs: Sequence[tuple[str, torch.dtype, Sequence[int]]]) -> tuple[list[int], int]:
    """Byte offset of each ``(name, dtype, shape)`` tensor laid out in order in one storage, each on an
    :data:`ALIGNMENT` boundary, and the storage's size."""
    offsets = []
    total = 0
    for _, dtype, shape in specs:
        total = -(-total // ALIGNMENT) * ALIGNMENT
        offsets.append(total)
        count = 1
        for size in shape:
            count *= int(size)
        total += count * torch.empty(0, dtype=dtype).element_size()
    return offsets, total


def tensors_in_one_storage(
    specs: Sequence[tuple[str, torch.dtype, Sequence[int]]],
    shared: bool,
    allocate: Callable[[int], torch.UntypedStorage] | None = None,
) -> dict[str, torch.Tensor]:
    """One uninitialised tensor per ``(name, dtype, shape)``, all views of one new storage
    (in shared memory with ``shared``), each starting on an :data:`ALIGNMENT` boundary.

    ``allocate(nbytes)``: where the storage comes from instead (at least ``nbytes``; e.g.
    :meth:`~lerobot_nodes.batch_memory.recycled_storage.RecycledStorages.take`)."""
    offsets, total = packed_offsets(specs)
    storage = allocate(total) if allocate is not None else new_storage(total, shared)
    return {name: view_of(storage, offset, dtype, shape) for (name, dtype, shape), offset in zip(specs, offsets, strict=True)}
