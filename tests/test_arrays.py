"""The integer set operations of ``lerobot_nodes.arrays`` against numpy's, and what they are for:
building a dataset and reading its first batch import no ``numpy.ma``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from lerobot_nodes.arrays import sorted_difference, sorted_union, sorted_unique

INTEGERS = arrays(np.int64, st.integers(0, 40), elements=st.integers(-50, 50))


@given(INTEGERS, INTEGERS)
def test_the_set_operations_equal_numpys(left: np.ndarray, right: np.ndarray) -> None:
    for ours, numpys in (
        (sorted_unique(left), np.unique(left)),
        (sorted_unique(left.reshape(-1, 1)), np.unique(left)),
        (sorted_union(left, right), np.union1d(left, right)),
        (sorted_difference(left, right), np.setdiff1d(left, right)),
    ):
        assert ours.dtype == numpys.dtype
        np.testing.assert_array_equal(ours, numpys)


BUILD_AND_READ = """
import sys
from lerobot_nodes import StreamingLeRobotDataset, streaming_dataloader
dataset = StreamingLeRobotDataset(root={root!r}, delta_timestamps={{"action": [0.0, 0.1]}}, seed=0)
batch = next(iter(streaming_dataloader(dataset, 4, 0)))
print(sorted(name for name in sys.modules if name == "numpy.ma" or name.startswith("numpy.ma.")))
"""


def test_building_a_dataset_and_its_first_batch_import_no_numpy_ma(lerobot_h264: Path) -> None:
    code = BUILD_AND_READ.format(root=str(lerobot_h264))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"
