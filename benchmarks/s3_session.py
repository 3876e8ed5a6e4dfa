"""What one more process costs for its S3 client: a session of its own against the shared one.

A DataLoader worker is a fork of a process that has imported torch and this package. This script
builds that parent (torch, s3fs imported; with ``--session shared``, also
``lerobot_nodes.sources.s3_session.load_shared_session()``, as the dataset does before it forks the
workers' server), freezes its objects as the server does, then forks a child that opens an s3fs
file system over a loopback S3 server (``LoopbackS3``) the way a worker does and lists the dataset
folder: ``own`` gives it no session (s3fs makes one and parses botocore's S3 data), ``shared``
gives it the parent's (``s3fs_options``). Reported per child: its private memory growth
(``/proc/self/smaps_rollup``, Private_Clean + Private_Dirty) and CPU seconds from before the file
system is made to the listing in hand. The two kinds alternate, ``--runs`` each, each child from a
fresh parent::

    python benchmarks/s3_session.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

DEFAULT_ROOT = "/work/shared/datasets/lerobot-writer-small"
URL = "s3://bench/small"


def private_mb() -> float:
    fields = {}
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            name, value, *_ = line.split()
            if name.endswith(":"):  # the first line names the address range
                fields[name] = int(value)
    return (fields["Private_Clean:"] + fields["Private_Dirty:"]) / 1024


def parent(session: str) -> None:
    """Import as a training process does, fork a child that lists ``URL``; print the child's figures."""
    import gc
    import time

    import s3fs
    import torch  # noqa: F401  (the heap a worker inherits)

    import lerobot_nodes.dataset  # noqa: F401
    from lerobot_nodes.sources.s3_session import load_shared_session, s3fs_options

    if session == "shared":
        load_shared_session()
    gc.freeze()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            before, cpu = private_mb(), time.process_time()
            options = s3fs_options(URL, {}) if session == "shared" else {"use_listings_cache": False}
            fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
            files = fs.find(URL)
            figures = {"private_mb": private_mb() - before, "cpu_s": time.process_time() - cpu, "files": len(files)}
            os.write(write, json.dumps(figures).encode())
        finally:
            os._exit(0)  # never the parent's exit handlers
    os.close(write)
    with os.fdopen(read) as answer:
        figures = json.loads(answer.read())
    os.waitpid(pid, 0)
    print(json.dumps({"session": session, **figures}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=DEFAULT_ROOT)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--parent", choices=["own", "shared"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.parent:
        parent(args.parent)
        return
    from lerobot_nodes.testing.s3 import LoopbackS3

    rows: dict[str, list[dict]] = {"own": [], "shared": []}
    with LoopbackS3() as server:
        server.upload(args.root, URL)
        env = {**os.environ, **server.environment()}
        for run in range(args.runs):
            for session in ("own", "shared")[:: 1 if run % 2 == 0 else -1]:
                done = subprocess.run(
                    [sys.executable, __file__, "--parent", session], env=env, capture_output=True, text=True, check=True
                )
                rows[session].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("| child's session | private memory growth MB (runs) | median | CPU ms (runs) | median |")
    print("|---|---|---|---|---|")
    for session, runs in rows.items():
        private = [row["private_mb"] for row in runs]
        cpu = [1000 * row["cpu_s"] for row in runs]
        print(
            f"| {session} | {' '.join(f'{v:.1f}' for v in private)} | **{statistics.median(private):.1f}** "
            f"| {' '.join(f'{v:.0f}' for v in cpu)} | **{statistics.median(cpu):.0f}** |"
        )


if __name__ == "__main__":
    main()
