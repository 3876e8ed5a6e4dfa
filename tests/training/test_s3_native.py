"""An ``s3://`` run reads the store natively in every process (``lerobot_nodes.sources.s3``): no s3fs,
aiobotocore, aiohttp or botocore is imported, in the training process or in a DataLoader worker.

The script runs in its own process, so the workers' server is forked by its dataset, as in a
training run; its credentials come from the environment (``AWS_ACCESS_KEY_ID``...), which needs no
botocore.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import S3_ROOT

SCRIPT = Path(__file__).parent / "scripts" / "s3_native_run.py"


def test_every_process_of_an_s3_run_reads_it_natively_without_the_s3fs_stack(s3_env, tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), S3_ROOT, str(tmp_path)],
        capture_output=True, text=True, timeout=300, env={**os.environ, **s3_env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["trainer"] == {"source": "S3Source", "imported": [], "batches": 2}
    assert seen["workers"] == [{"source": "S3Source", "imported": []}] * 2
