"""Where a batch's camera frames are written: slots in one storage per batch (``batch_slots``),
shared-memory storages recycled once the training process released them (``recycled_storage``)."""

from __future__ import annotations

from .batch_slots import BatchSlots
from .recycled_storage import RecycledBatch, RecycledStorages

__all__ = ["BatchSlots", "RecycledBatch", "RecycledStorages"]
