"""``lerobot-nodes cache list|clear`` show and remove the disk byte cache (real processes)."""

from __future__ import annotations

from lerobot_nodes.sources.range_cache import ByteRangeCache

from .cli_process import run_cli


def _fill(home, group: str, files: int) -> None:
    """Blocks written as the cache writes them (``read`` with a fetch that returns the bytes)."""
    cache = ByteRangeCache(home / "streaming-bytes", block_size=1024)
    for index in range(files):
        cache.read(group, f"file-{index}", 3000, [(0, 3000)], lambda spans: [b"x" * (e - s) for s, e in spans])


def test_list_shows_the_byte_cache_and_clear_removes_it(lerobot_home):
    _fill(lerobot_home, "owner--name", 2)
    _fill(lerobot_home, "other--set", 1)
    listing = run_cli("cache", "list")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    rows = {line.split()[1]: line for line in lines[1:] if line.startswith("bytes ")}
    assert set(rows) == {"owner/name", "other/set"}
    assert "1MiB blocks" not in rows["owner/name"] and "1024B blocks" in rows["owner/name"]
    assert " 2 " in rows["owner/name"] and "6.0 KB" in rows["owner/name"]  # two files of 3000 bytes
    summary = next(line for line in lines if line.startswith("byte cache "))
    assert str(lerobot_home / "streaming-bytes") in summary and "3 files (9 blocks)" in summary and "default bound" in summary
    assert lines[-1].startswith("2 entries, ")

    cleared = run_cli("cache", "clear", "--dataset.repo_id=owner/name")
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout.splitlines()[0].startswith("removed bytes of owner/name @ 1024B blocks: ")
    assert not (lerobot_home / "streaming-bytes" / "blocks-1024B" / "owner--name").exists()
    assert (lerobot_home / "streaming-bytes" / "blocks-1024B" / "other--set").exists()
    assert run_cli("cache", "clear", "--all").stdout.splitlines()[-1].startswith("removed 1 entries (")
    assert run_cli("cache", "list").stdout.startswith("the caches are empty: ")
