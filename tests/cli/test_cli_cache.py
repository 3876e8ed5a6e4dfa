"""``lerobot-nodes cache list|clear`` and the stale-index hint of a decode error (real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lerobot_nodes.sources.file_cache import FileCache
from lerobot_nodes.testing import write_dataset

from .cli_process import assert_one_line_error, run_cli

HOLD_LOCK = """
import sys, time
from lerobot_nodes.sidecar.locking import BuildLock
lock = BuildLock(sys.argv[1], 0, "hold it for the test")  # kept referenced: a collected lock is released
lock.acquire()
print("held", flush=True)
time.sleep(120)
"""


def _hub_metadata(home: Path, repo: str, sha: str) -> None:
    """A metadata cache entry of a Hub commit, written as the Hub source writes one."""
    cache = FileCache(home / "streaming-meta" / "datasets" / repo.replace("/", "--") / sha)
    cache.put("meta/info.json", sha, b'{"fps": 30}')
    cache.put(".tree.json", sha, b"[]")


def test_list_then_clear_one_dataset_then_all(tiny_dataset, lerobot_home):
    assert run_cli("inspect", f"--dataset.root={tiny_dataset}").returncode == 0  # builds the MP4 indexes
    _hub_metadata(lerobot_home, "owner/name", "a" * 40)
    _hub_metadata(lerobot_home, "other/set", "b" * 40)
    listing = run_cli("cache", "list")
    assert listing.returncode == 0, listing.stderr
    rows = {line.split("  ")[0].strip() + " " + line.split()[1]: line for line in listing.stdout.splitlines()[1:-1]}
    assert "indexes local" in rows and "2 " in rows["indexes local"].split("unpinned")[1]  # two cameras, one MP4 each
    assert "aaaaaaaaaaaa" in rows["meta owner/name"] and " 2 " in rows["meta owner/name"]
    assert "tables local" in rows and " 1 " in rows["tables local"]  # the parsed meta/episodes of one content
    assert listing.stdout.splitlines()[-1].startswith("4 entries, ")

    cleared = run_cli("cache", "clear", "--dataset.repo_id=owner/name")
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout.splitlines()[0].startswith("removed meta of owner/name @ aaaaaaaaaaaa: ")
    assert not (lerobot_home / "streaming-meta" / "datasets" / "owner--name" / ("a" * 40)).exists()
    assert (lerobot_home / "streaming-meta" / "datasets" / "other--set").exists()

    cleared = run_cli("cache", "clear", "--all")
    assert cleared.returncode == 0 and cleared.stdout.splitlines()[-1].startswith("removed 3 entries ("), cleared.stdout
    assert not any((lerobot_home / "streaming-meta" / "episode-tables").glob("*/*.table"))
    assert run_cli("cache", "list").stdout.startswith("the caches are empty: ")


def test_clear_keeps_an_entry_whose_lock_a_live_process_holds(tiny_dataset, lerobot_home):
    assert run_cli("inspect", f"--dataset.root={tiny_dataset}").returncode == 0
    (entry,) = (lerobot_home / "streaming-indexes").glob("g*/*")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(entry / "build.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        cleared = run_cli("cache", "clear", "--all")
        assert f"its lock is held by pid {holder.pid} on " in cleared.stdout, cleared.stdout
        assert any((entry / "records").glob("*.idx"))
    finally:
        holder.kill()
        holder.wait()
    cleared = run_cli("cache", "clear", "--all")  # the OS released the dead holder's lock
    assert cleared.stdout.splitlines()[-1].startswith("removed 1 entries"), cleared.stdout
    assert not entry.exists()


def test_cache_clear_needs_a_dataset_or_all_and_is_in_help():
    assert "cache" in run_cli("--help").stdout
    result = run_cli("cache", "clear")
    assert_one_line_error(result, 2, "one of the arguments --dataset.repo_id --all is required")


def _replace_in_place_keeping_identity(path: Path) -> None:
    """New bytes of the same size in the same inode, with the old mtime: the file's identity does not change."""
    before = path.stat()
    with open(path, "r+b") as stream:
        stream.write(bytes(b ^ 0x5A for b in path.read_bytes()))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def test_a_decode_error_on_a_replaced_video_says_how_to_clear_its_index(tmp_path):
    dataset = write_dataset(tmp_path / "dataset", episode_lengths=[12, 9], seed=3)
    stream = ("stream", f"--dataset.root={dataset}", "--dataset.repo_id=local/tiny", "--steps=2", "--num_workers=0", "--quiet")
    assert run_cli(*stream).returncode == 0  # indexes the videos into the cache
    for video in sorted(dataset.glob("videos/**/*.mp4")):
        _replace_in_place_keeping_identity(video)
    failed = run_cli(*stream)
    error = assert_one_line_error(failed, 1, "")
    assert "decod" in error and "cached MP4 index is stale" in error, error
    assert "clear it with `lerobot-nodes cache clear --dataset.repo_id=local/tiny`" in error
    assert "removed indexes of local/tiny" in run_cli("cache", "clear", "--dataset.repo_id=local/tiny").stdout
    # With the stale index gone the file is indexed again, and now its own content is the error.
    again = run_cli(*stream)
    assert again.returncode == 1 and "cached MP4 index is stale" not in again.stderr, again.stderr
