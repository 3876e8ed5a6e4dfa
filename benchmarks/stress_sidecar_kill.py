"""Stress test: SIGKILL sidecar builders many times (the test suite runs 20 trials of each kind).

    /work/venv/bin/python benchmarks/stress_sidecar_kill.py --trials 200

Writes a dataset of 12 H.264 episodes rolled into 24 MP4s, then runs ``--trials`` kills of
archive builds (``lerobot-build-mp4-sidecar``) and ``--trials`` kills of processes filling the
local index cache, every one checked as described in ``tests/sidecar/sidecar_kill_trials.py``.
Any broken guarantee raises; the summary counts outcomes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

from sidecar.sidecar_kill_trials import archive_kill_trials, cache_kill_trials  # noqa: E402
from sidecar.sidecar_testkit import Zygote  # noqa: E402

from lerobot_nodes.testing import write_dataset  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="kills of each kind (default 200)")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sidecar-stress-") as workdir:
        work = Path(workdir)
        os.environ["HF_LEROBOT_HOME"] = str(work / "home")
        dataset = work / "dataset"
        write_dataset(dataset, num_episodes=12, codec="h264", video_files_size_in_mb=0.005)
        zygote = Zygote(work / "zygote")
        try:
            started = time.monotonic()
            archive = archive_kill_trials(zygote, dataset, work / "archive", args.trials, seed=args.seed)
            print(f"archive builds: {args.trials} trials, {dict(archive)} ({time.monotonic() - started:.0f} s)")
            started = time.monotonic()
            cache = cache_kill_trials(zygote, dataset, work / "cache", args.trials, seed=args.seed + 1)
            print(f"cache builds:   {args.trials} trials, {dict(cache)} ({time.monotonic() - started:.0f} s)")
        finally:
            zygote.close()
    print("every guarantee held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
