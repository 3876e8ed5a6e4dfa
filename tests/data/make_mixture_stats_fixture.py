"""Record LeRobot 0.6.1's ``aggregate_stats`` of the two LeRobot-written tiny datasets.

Run with a Python that has LeRobot 0.6.1 (``/work/lerobot-train-venv/bin/python`` or the CI's
``LEROBOT_NODES_LEROBOT_PYTHON``), from the repository root::

    python tests/data/make_mixture_stats_fixture.py

It reads ``meta/stats.json`` of ``lerobot-writer-tiny-av1`` and ``lerobot-writer-tiny-h264`` with
LeRobot's own ``load_stats``, aggregates them in that order with LeRobot's own ``aggregate_stats``
(what ``MultiLeRobotDataset`` does) and writes ``mixture-stats-golden.json`` beside this script:
``{"datasets": [...], "lerobot_version": ..., "stats": {feature: {stat: nested list}}}``.
``tests/test_mixture_stats.py`` compares ``lerobot_nodes.format.mixture.aggregate_stats`` with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import lerobot
from lerobot.datasets.compute_stats import aggregate_stats
from lerobot.datasets.io_utils import load_stats

HERE = Path(__file__).parent
DATASETS = ["lerobot-writer-tiny-av1", "lerobot-writer-tiny-h264"]


def main() -> None:
    stats = aggregate_stats([load_stats(HERE / name) for name in DATASETS])
    out = {
        "datasets": DATASETS,
        "lerobot_version": lerobot.__version__,
        "stats": {
            key: {stat: value.tolist() for stat, value in values.items()}
            for key, values in sorted(stats.items())
        },
    }
    (HERE / "mixture-stats-golden.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
