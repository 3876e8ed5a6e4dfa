"""Opening DROID-sized datasets: 100,000 and 1,000,000 episodes of metadata open, with bounded memory.

Metadata written as LeRobot lays it out at that size (1,000 episodes per ``meta/episodes`` file in
row groups of 10, per-episode ``stats/...`` columns of a few features here, to keep the fixture
small); only ``load_meta`` runs, in a fresh interpreter that reports its peak memory growth over its
footprint after the imports: once cold (it parses the episodes and caches the table), once warm (a
fresh process maps the cached table and reads no episodes Parquet). Each open checks every
episode's length and row range against what was written, vectorised. No timing assert: speed is
measured in ``benchmarks/scale_open.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lerobot_nodes.testing.scale import write_scale_metadata

PEAK_GROWTH_MB = {100_000: 300, 1_000_000: 1024}
"""Peak resident growth of an open, beyond the imported libraries. 100k: 110 MB measured with all
200 stats columns (a warm open from the cached table ~20 MB). 1M: the issue's bound (~530 MB measured
cold with 4 episodes files' footers in flight, ~190 MB warm)."""

STATS_FEATURES = {100_000: 4, 1_000_000: 0}
"""Features whose 10 per-episode stats columns are written (of 20): the footers a cold open parses
grow with them. None at 1M keeps writing the fixture within CI's budget (~30 CPU s; each feature adds
~18): the 100k case covers pruning the stats columns, the 1M case the size of what is kept."""

OPEN = """
import json, os, sys, tempfile
import numpy as np
from lerobot_nodes.format.meta import load_meta
from lerobot_nodes.sources import LocalSource
from lerobot_nodes.testing.scale import ForkedReaderPeaks, scale_episode_lengths, status_kb

# Paths read, appended to a file: the episodes files may be read by forked children.
log = tempfile.NamedTemporaryFile("a+", suffix=".paths")

class Recording(LocalSource):
    def _read_ranges(self, path, ranges):
        os.write(log.fileno(), (path + "\\n").encode())
        return super()._read_ranges(path, ranges)

    def _read_file(self, path):
        os.write(log.fileno(), (path + "\\n").encode())
        return super()._read_file(path)

# Forked readers' own peak growth: measured in each reader from its first file on, handed back beside each result.
import lerobot_nodes.format.meta as meta_module
readers = ForkedReaderPeaks()
readers.install(meta_module)
source = Recording(sys.argv[1])
before = status_kb("VmHWM")
meta = load_meta(source)
growth_mb = (status_kb("VmHWM") - before) / 1024
# The forked readers run at once: each grows by at most the largest one's growth.
growth_mb += sum(processes * kb for processes, kb in readers.calls) / 1024
log.seek(0)
read = set(log.read().split())
episodes = meta.episodes
lengths = scale_episode_lengths(len(episodes))
ends = np.cumsum(lengths)
wrong = (
    (episodes.episode_index != np.arange(len(episodes)))
    | (episodes.length != lengths)
    | (episodes.dataset_from_index != ends - lengths)
    | (episodes.dataset_to_index != ends)
)
print(json.dumps({"episodes": len(episodes), "frames": int(episodes.length.sum()), "growth_mb": growth_mb,
                  "wrong_episodes": int(wrong.sum()), "first_wrong": int(np.argmax(wrong)) if wrong.any() else None,
                  "episode_files_read": len([p for p in read if p.startswith("meta/episodes/")]),
                  "forked_readers": readers.calls}))
"""


@pytest.mark.parametrize("episodes", [100_000, 1_000_000], ids=["100k", "1M"])
def test_droid_sized_episodes_open_within_a_memory_bound(tmp_path, episodes):
    root = write_scale_metadata(tmp_path / "droid-like", episodes, stats_features=STATS_FEATURES[episodes])
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
        assert opened["episodes"] == episodes and opened["frames"] == info["total_frames"]
        assert opened["wrong_episodes"] == 0, opened
        assert opened["growth_mb"] <= PEAK_GROWTH_MB[episodes], opened
    assert cold["episode_files_read"] == episodes // 1000
    assert warm["episode_files_read"] == 0  # the cached table, mapped
