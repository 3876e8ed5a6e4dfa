"""A streaming-index cache that cannot be written: one warning, indexes in memory, the same samples."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from lerobot_nodes.testing import write_dataset

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from lerobot_nodes import MapStyleLeRobotDataset, StreamingLeRobotDataset
    from lerobot_nodes.testing.compare import assert_samples_equal
    root = sys.argv[1]
    reference = MapStyleLeRobotDataset(root=root, return_uint8=True)
    starts = {e: reference.meta.episode_bounds(e)[0] for e in reference.episodes}
    for attempt in range(2):
        dataset = StreamingLeRobotDataset(root=root, return_uint8=True, seed=1)
        count = 0
        for sample in dataset:
            expected = reference[starts[int(sample["episode_index"])] + int(sample["frame_index"])]
            assert_samples_equal(expected, sample)
            count += 1
        assert count == reference.num_frames
        dataset.close()
    print("ok", count)
    """
)


def test_unwritable_lerobot_home_warns_once_and_streams_from_memory(tmp_path, unwritable_home):
    dataset = write_dataset(tmp_path / "dataset", episode_lengths=[9, 12, 7], seed=2)
    env = {**os.environ, "HF_LEROBOT_HOME": str(unwritable_home)}
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(dataset)], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "28"]
    warnings = [line for line in result.stderr.splitlines() if "cannot be written" in line]
    assert len(warnings) == 1 and str(unwritable_home) in warnings[0] and "Traceback" not in result.stderr
    assert list(unwritable_home.iterdir()) == []
