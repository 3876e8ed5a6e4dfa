"""The files under a folder of an fsspec store: one flat listing, raced by a walk of its folders.

``fs.find`` lists an object store as one listing of every key under the folder: pages of 1,000
keys, each asked for once the previous one has come back. A LeRobot v3.0 dataset of 20,000
files is 20 such round trips before the first batch, one after another. Its files sit a few
folders deep instead (``videos/<camera>/chunk-XXX/file-XXX.mp4``, up to 1,000 files per chunk),
so a walk that lists every folder of a level concurrently (up to :data:`LISTINGS_IN_FLIGHT` at
once) takes as many rounds as the tree is deep. For a small store the one page of the flat
listing is sooner (the walk's rounds are four), so :func:`find_files` runs both and keeps the
one that ends first, cancelling the other: a few listings more than either alone, never the
slower one's wait. Stores without an async implementation (``memory://``, local) take
``fs.find``.
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

    return sync(fs.loop, _first_listing, fs, root)


async def _first_listing(fs: Any, root: str) -> dict[str, dict[str, Any]]:
    """What the first of the flat listing and the walk to succeed found (the flat one's error if both fail)."""
    flat = asyncio.ensure_future(_flat_listing(fs, root))
    walk = asyncio.ensure_future(walk_folders(fs, root))
    pending = {flat, walk}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in (flat, walk):
                if task in done and task.exception() is None:
                    return task.result()
        return flat.result()  # both failed: the error fs.find would have raised
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)  # their connections released before the loop moves on


async def _flat_listing(fs: Any, root: str) -> dict[str, dict[str, Any]]:
    found = await fs._find(root, detail=True)
    return {path: info for path, info in found.items() if info.get("type", "file") != DIRECTORY}


async def walk_folders(fs: Any, root: str) -> dict[str, dict[str, Any]]:
    """The files under ``root`` of an async store (as :func:`find_files`), each folder listed once
    (``fs._ls``), every folder of a level in flight at once, up to :data:`LISTINGS_IN_FLIGHT`."""
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
