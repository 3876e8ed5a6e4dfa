"""Rewrite boxes of real MP4 files for tests (an independent, minimal ISO-BMFF box tree)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts", b"dinf", b"udta"}


@dataclass
class Node:
    type: bytes
    payload: bytes = b""
    children: list[Node] = field(default_factory=list)

    @property
    def is_container(self) -> bool:
        return self.type in CONTAINERS

    def find(self, path: str) -> Node:
        node = self
        for part in path.split("/"):
            node = next(child for child in node.children if child.type == part.encode())
        return node

    def find_all(self, box_type: str) -> list[Node]:
        return [child for child in self.children if child.type == box_type.encode()]


def parse(data: bytes, start: int = 0, end: int | None = None) -> list[Node]:
    end = len(data) if end is None else end
    nodes = []
    while start < end:
        size, box_type = struct.unpack_from(">I4s", data, start)
        header = 8
        if size == 1:
            (size,) = struct.unpack_from(">Q", data, start + 8)
            header = 16
        node = Node(box_type)
        if box_type in CONTAINERS:
            node.children = parse(data, start + header, start + size)
        else:
            node.payload = data[start + header : start + size]
        nodes.append(node)
        start += size
    return nodes


def serialize(node: Node) -> bytes:
    body = b"".join(serialize(child) for child in node.children) if node.is_container else node.payload
    return struct.pack(">I4s", 8 + len(body), node.type) + body


def top_level(path: Path) -> list[tuple[bytes, int, int]]:
    """``(type, start, size)`` of each top-level box."""
    data = path.read_bytes()
    boxes, position = [], 0
    while position < len(data):
        size, box_type = struct.unpack_from(">I4s", data, position)
        if size == 1:
            (size,) = struct.unpack_from(">Q", data, position + 8)
        boxes.append((box_type, position, size))
        position += size
    return boxes


def rewrite_moov(source: Path, target: Path, edit: Callable[[Node], None]) -> Path:
    """Copy ``source`` (moov after mdat, so sample offsets stay valid) with ``edit`` applied to moov."""
    data = source.read_bytes()
    boxes = top_level(source)
    _, moov_start, moov_size = next(box for box in boxes if box[0] == b"moov")
    assert all(box[1] < moov_start for box in boxes if box[0] == b"mdat"), "moov must follow mdat"
    (moov,) = parse(data, moov_start, moov_start + moov_size)
    edit(moov)
    target.write_bytes(data[:moov_start] + serialize(moov) + data[moov_start + moov_size :])
    return target


def stbl(moov: Node) -> Node:
    return moov.find("trak/mdia/minf/stbl")


def table_box(box_type: bytes, rows: list[tuple[int, ...]], fmt: str, version: int = 0) -> Node:
    payload = struct.pack(">I", version << 24) + struct.pack(">I", len(rows))
    payload += b"".join(struct.pack(">" + fmt, *row) for row in rows)
    return Node(box_type, payload)


def read_table(node: Node, fmt: str, header: int = 8) -> list[tuple[int, ...]]:
    (count,) = struct.unpack_from(">I", node.payload, header - 4)
    width = struct.calcsize(">" + fmt)
    return [struct.unpack_from(">" + fmt, node.payload, header + i * width) for i in range(count)]


def stco_to_co64(moov: Node, shift: int = 0) -> None:
    """Replace the 32-bit chunk offsets by 64-bit ones, moved by ``shift`` bytes."""
    table = stbl(moov)
    stco = table.find("stco")
    offsets = [row[0] + shift for row in read_table(stco, "I")]
    table.children[table.children.index(stco)] = table_box(b"co64", [(o,) for o in offsets], "Q")


def move_payload_beyond(source: Path, target: Path, gap: int) -> Path:
    """Copy ``source`` with a hole of ``gap`` bytes before its samples (64-bit mdat + co64).

    The hole is sparse: a multi-GiB file costs no disk space.
    """
    data = source.read_bytes()
    boxes = top_level(source)
    _, mdat_start, mdat_size = next(box for box in boxes if box[0] == b"mdat")
    _, moov_start, moov_size = next(box for box in boxes if box[0] == b"moov")
    assert mdat_start < moov_start
    mdat_header = 16 if struct.unpack_from(">I", data, mdat_start)[0] == 1 else 8
    payload = data[mdat_start + mdat_header : mdat_start + mdat_size]
    new_payload_start = mdat_start + 16 + gap
    (moov,) = parse(data, moov_start, moov_start + moov_size)
    stco_to_co64(moov, shift=new_payload_start - (mdat_start + mdat_header))
    with open(target, "wb") as out:
        out.write(data[:mdat_start])
        out.write(struct.pack(">I4sQ", 1, b"mdat", 16 + gap + len(payload)))
        out.seek(gap, 1)
        out.write(payload)
        out.write(serialize(moov))
    return target
