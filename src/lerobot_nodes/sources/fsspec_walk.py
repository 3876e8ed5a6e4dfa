"""The files under a folder of an fsspec store, listed a folder level at a time, each level at once.

``fs.find`` lists an object store as one listing of every key under the folder: pages of 1,000
keys, each asked for once the previous one has come back. A LeRobot v3.0 dataset of 20,000
files is 20 such round trips before the first batch, one after another. Its files sit a few
folders deep instead (``videos/<camera>/chunk-XXX/file-XXX.mp4``, up to 1,000 files per chunk),
so :func:`find_files` lists every folder of a level concurrently (up to
:data:`LISTINGS_IN_FLIGHT` at once): as many rounds as the tree is deep. Stores without an async
implementation (``memory://``, local) take ``fs.find``.
"""

from __future__ import annotations

import asyncio
from typing import Any

LISTINGS_IN_FLIGHT = 32
"""Folder listings in flight at once over an async store."""

DIRECTORY = "directory"


def find_files(fs: Any, root: str) -> dict[str, dict[str, Any]]:
    """Every file at any depth under ``root``: its full path -> fsspec's info dict (as ``fs.find(root,
    detail=True)`` gives; no directories). Empty when ``root`` holds nothing or does not exist."""
    if not getattr(fs, "async_impl", False):
        found = fs.find(root, detail=True)
        return {path: info for path, info in found.items() if info.get("type", "file") != DIRECTORY}
    from fsspec.asyn import sync

    return sync(fs.loop, _walk_levels, fs, root)


async def _walk_levels(fs: Any, root: str) -> dict[str, dict[str, Any]]:
    gate = asyncio.Semaphore(LISTINGS_IN_FLIGHT)

    async def listing(folder: str) -> list[dict[str, Any]]:
        async with gate:
            try:
                return await fs._ls(folder, detail=True)
            except FileNotFoundError:
                return []  # the folder went away, or held only a placeholder: nothing under it

    found: dict[str, dict[str, Any]] = {}
    level = [root.rstrip("/")]
    listed = set(level)
    while level:
        listings = await asyncio.gather(*(listing(folder) for folder in level))
        level = []
        for entries in listings:
            for info in entries:
                name = info["name"].rstrip("/")
                if info.get("type") != DIRECTORY:
                    found[info["name"]] = info
                elif name not in listed:  # a store may list a folder among its own entries
                    listed.add(name)
                    level.append(name)
    return found
