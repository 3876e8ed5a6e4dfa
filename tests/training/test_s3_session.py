"""Every process of an ``s3://`` run shares one S3 session's botocore data (``lerobot_nodes.sources.s3_session``).

s3fs used to give each DataLoader worker a session of its own, which parsed botocore's S3 model again
(about 14 MB and 0.1 s of CPU per process). The script runs in its own process, so the workers'
server is forked by its dataset, as in a training run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import S3_ROOT

SCRIPT = Path(__file__).parent / "scripts" / "s3_session_run.py"


def test_workers_make_their_s3_clients_from_the_data_the_training_process_parsed(s3_env, tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), S3_ROOT, str(tmp_path)],
        capture_output=True, text=True, timeout=300, env={**os.environ, **s3_env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["trainer"] == {"shared_session": True, "batches": 2}
    assert seen["workers"] == [{"shared_session": True, "parsed_before_the_fork": True}] * 2
