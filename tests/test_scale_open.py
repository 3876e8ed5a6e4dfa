"""Opening a DROID-sized dataset: 100,000 episodes of metadata open, with bounded memory.

Metadata written as LeRobot lays it out at that size (1,000 episodes per ``meta/episodes`` file,
per-episode ``stats/...`` columns of four features here, to keep the fixture small); only
``load_meta`` runs, in a fresh interpreter that reports its peak memory growth. No timing assert:
speed is measured in ``benchmarks/scale_open.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

from lerobot_nodes.testing.scale import write_scale_metadata

EPISODES = 100_000
PEAK_GROWTH_MB = 300
"""Peak resident growth of opening 100k episodes (110 MB measured with all 200 stats columns)."""

OPEN = """
import json, sys
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sources import LocalSource

def peak_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

source = LocalSource(sys.argv[1])
before = peak_kb()
meta = load_meta(source)
print(json.dumps({"episodes": len(meta.episodes), "frames": int(meta.episodes.length.sum()),
                  "growth_mb": (peak_kb() - before) / 1024}))
"""


def test_a_hundred_thousand_episodes_open_within_a_memory_bound(tmp_path):
    root = write_scale_metadata(tmp_path / "droid-like", EPISODES, stats_features=4)
    result = subprocess.run([sys.executable, "-c", OPEN, str(root)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    opened = json.loads(result.stdout)
    info = json.loads((root / "meta" / "info.json").read_text())
    assert opened["episodes"] == EPISODES and opened["frames"] == info["total_frames"]
    assert opened["growth_mb"] <= PEAK_GROWTH_MB, opened
