"""A mixture's stats equal LeRobot 0.6.1's ``aggregate_stats`` of its datasets' stats.

``data/mixture-stats-golden.json`` holds what LeRobot's own function returned for the two
LeRobot-written tiny datasets (recorded by ``data/make_mixture_stats_fixture.py`` in a LeRobot
0.6.1 venv), so the comparison runs everywhere, with or without LeRobot installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lerobot_nodes.config import StreamingConfig
from lerobot_nodes.dataset import StreamingLeRobotDataset
from lerobot_nodes.format.meta import load_stats
from lerobot_nodes.format.mixture import aggregate_stats
from lerobot_nodes.sources import LocalSource

DATA = Path(__file__).parent / "data"
GOLDEN = json.loads((DATA / "mixture-stats-golden.json").read_text())
ROOTS = [DATA / name for name in GOLDEN["datasets"]]


def assert_stats_equal(stats: dict, golden: dict) -> None:
    assert sorted(stats) == sorted(golden)
    for key, values in golden.items():
        assert sorted(stats[key]) == sorted(values), key
        for name, value in values.items():
            expected = np.asarray(value)
            got = np.asarray(stats[key][name])
            assert got.shape == expected.shape, (key, name)
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0, err_msg=f"{key} {name}")


def test_aggregate_stats_equals_lerobots():
    assert GOLDEN["lerobot_version"] == "0.6.1"
    stats = aggregate_stats([load_stats(LocalSource(root)) for root in ROOTS])
    assert_stats_equal(stats, GOLDEN["stats"])
    # Weighted by frame counts: 380 and 414 frames.
    assert int(stats["index"]["count"][0]) == 380 + 414


def test_the_mixtures_stats_are_the_aggregate_with_renamed_keys():
    dataset = StreamingLeRobotDataset(root=ROOTS, config=StreamingConfig())
    assert dataset.meta.stats is not None
    assert_stats_equal(dataset.meta.stats, GOLDEN["stats"])
    renamed = StreamingLeRobotDataset(
        root=ROOTS,
        rename_map={str(ROOTS[1]): {"observation.images.left": "observation.images.side"}},
        config=StreamingConfig(),
    )
    assert renamed.meta.stats is not None
    golden = dict(GOLDEN["stats"])
    golden["observation.images.side"] = golden.pop("observation.images.left")
    assert_stats_equal(renamed.meta.stats, golden)


@pytest.mark.parametrize("missing", ["count", "std"])
def test_a_feature_without_lerobots_five_stats_is_left_out(missing):
    stats = [load_stats(LocalSource(root)) for root in ROOTS]
    assert stats[0] is not None and stats[1] is not None
    del stats[1]["action"][missing]
    aggregated = aggregate_stats(stats)  # type: ignore[arg-type]
    assert "action" not in aggregated and "observation.state" in aggregated
