"""Opening a DROID-sized dataset: 100,000 episodes of metadata open, with bounded memory.

Metadata written as LeRobot lays it out at that size (1,000 episodes per ``meta/episodes`` file,
per-episode ``stats/...`` columns of four features here, to keep the fixture small); only
``load_meta`` runs, in a fresh interpreter that reports its peak memory growth: once cold (it parses
the episodes and caches the table), once warm (a fresh process maps the cached table and reads no
episodes Parquet). No timing assert: speed is measured in ``benchmarks/scale_open.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from lerobot_nodes.testing.scale import write_scale_metadata

EPISODES = 100_000
PEAK_GROWTH_MB = 300
"""Peak resident growth of opening 100k episodes (110 MB measured with all 200 stats columns; a warm
open from the cached table ~20 MB)."""

OPEN = """
import json, sys
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sources import LocalSource

def peak_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

read = set()

class Recording(LocalSource):
    def _read_ranges(self, path, ranges):
        read.add(path)
        return super()._read_ranges(path, ranges)

    def _read_file(self, path):
        read.add(path)
        return super()._read_file(path)

source = Recording(sys.argv[1])
before = peak_kb()
meta = load_meta(source)
print(json.dumps({"episodes": len(meta.episodes), "frames": int(meta.episodes.length.sum()),
                  "growth_mb": (peak_kb() - before) / 1024,
                  "episode_files_read": len([p for p in read if p.startswith("meta/episodes/")])}))
"""


def test_a_hundred_thousand_episodes_open_within_a_memory_bound(tmp_path):
    root = write_scale_metadata(tmp_path / "droid-like", EPISODES, stats_features=4)
    info = json.loads((root / "meta" / "info.json").read_text())
    env = dict(os.environ, HF_LEROBOT_HOME=str(tmp_path / "home"))
    opens = []
    for _ in ("cold", "warm"):
        result = subprocess.run(
            [sys.executable, "-c", OPEN, str(root)], capture_output=True, text=True, timeout=600, env=env
        )
        assert result.returncode == 0, result.stderr
        opens.append(json.loads(result.stdout))
    cold, warm = opens
    for opened in opens:
        assert opened["episodes"] == EPISODES and opened["frames"] == info["total_frames"]
        assert opened["growth_mb"] <= PEAK_GROWTH_MB, opened
    assert cold["episode_files_read"] == EPISODES // 1000
    assert warm["episode_files_read"] == 0  # the cached table, mapped
