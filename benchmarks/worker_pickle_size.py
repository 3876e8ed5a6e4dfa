"""What a DataLoader worker receives of a dataset's metadata: the pickled ``DatasetMeta`` of a warm open.

DataLoader workers (the forked server, spawn, the stdlib forkserver) get the dataset as a pickle. An episodes
table mapped from the table cache pickles as its cache file (the worker maps the node's pages); a table held in
memory pickles as its arrays (a private copy per worker, the versions before). This prints both for a dataset
written by ``benchmarks/scale_open.py``:

    python benchmarks/worker_pickle_size.py /tmp/lerobot-nodes-scale-open/episodes-100000
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import time


def main(root: str) -> None:
    os.environ["HF_LEROBOT_HOME"] = tempfile.mkdtemp(prefix="lerobot-nodes-pickle-")
    from lerobot_nodes.format.meta import load_meta
    from lerobot_nodes.sources import LocalSource

    load_meta(LocalSource(root), check_files=False)  # fills the table cache
    meta = load_meta(LocalSource(root), check_files=False)  # maps it
    started = time.perf_counter()
    mapped = pickle.dumps(meta)
    mapped_s = time.perf_counter() - started
    object.__setattr__(meta.episodes, "mapped", None)  # the arrays themselves, as before
    started = time.perf_counter()
    copied = pickle.dumps(meta)
    copied_s = time.perf_counter() - started
    print(
        f"{len(meta.episodes)} episodes: pickled DatasetMeta {len(copied) / 1e6:.1f} MB ({copied_s:.2f} s) with the "
        f"arrays, {len(mapped) / 1e6:.2f} MB ({mapped_s * 1e3:.1f} ms) mapped from the table cache"
    )


if __name__ == "__main__":
    main(sys.argv[1])
