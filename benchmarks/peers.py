"""Peers: this package against MosaicML Streaming (MDS, JPEG and raw frames) and LitData (issue 24).

The alternative a robot-learning user picks when a loader is too slow is to convert the dataset
to a peer's format. This script does that conversion itself, in one pass over the samples this
package delivers (``StreamingLeRobotDataset``, 0 workers, one epoch; the ACT window: ``action``
over 50 frames, cameras and state at offset 0, ``return_uint8=True``), into

* ``mds-jpeg``: ``streaming.MDSWriter``, every camera a ``jpeg`` column (PIL's default quality),
  state/action ``ndarray`` columns;
* ``mds-raw``: the same with every camera an ``ndarray`` of raw uint8 ``(C, H, W)``;
* ``litdata``: LitData's ``BinaryWriter`` (what ``litdata.optimize`` writes with), every camera a
  raw uint8 ``(C, H, W)`` numpy array, state/action numpy arrays (LitData decodes its JPEG
  columns with ``torchvision.io`` only, and no torchvision build loads on the CPU torch here: see
  :func:`import_streaming`);

timing the conversion and counting its bytes on disk. Then, for every dataset, place (``local``,
or ``s3`` through a moto S3 server on 127.0.0.1) and worker count (0, 2), it measures each loader
(``ours``: ``StreamingLeRobotDataset`` + ``streaming_dataloader``; ``mds-*``:
``streaming.StreamingDataset(shuffle=True)`` + torch ``DataLoader``; ``litdata``:
``litdata.StreamingDataset(shuffle=True)`` + ``StreamingDataLoader``), batch 32, the loaders
alternated (the order reversed each round), each measurement a fresh process that reads one byte
of every page of each batch's tensors, as a training step reads its batch (a batch that crosses
from a worker is mapped on first read):

* first batch: from just before the dataset is constructed to the first batch in hand;
* steady samples/s (batches 2..N) and CPU seconds per sample of the whole process tree;
* PSS of the process tree (``/proc/<pid>/smaps_rollup`` of every process, sampled every 50 ms
  by this parent): once the imports are done (``imports``) and the peak over the run;
* batch mixing (``lerobot_nodes.batch_mixing``): distinct episodes per batch and same-batch pairs
  of one episode within 5 frames, next to the uniform shuffle of the same selection;
* frame exactness: the delivered frames of the last batch against this package's frames for the
  same ``(episode, frame)`` (``MapStyleLeRobotDataset``): max abs difference and PSNR;
* for ``ours``, the metrics report's decoded frames kept (peak) and batch segments created.

Run it in the peers venv (``bash benchmarks/setup_peers_env.sh``)::

    /work/peers-venv/bin/python benchmarks/peers.py            # about 40 min on an idle machine
    /work/peers-venv/bin/python benchmarks/peers.py --quick    # h264-g30, 12 batches, 1 round
    /work/peers-venv/bin/python benchmarks/peers.py --report-only FILE.jsonl...  # table + plot

Converted copies (GBs for the raw ones) live under ``$LRN_BENCH_DATA/peers/converted`` until the
dataset's measurements end (``--keep`` keeps them, ``--reuse`` measures kept ones again); the
S3 server's objects and every loader's download cache live in ``/dev/shm`` (``LRN_PEERS_CACHE``).

JSON lines go to ``--out`` (``/work/bench-data/peers/results.jsonl``), a summary table to stdout,
and the plot to ``benchmarks/plots/peers/``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("LRN_BENCH_DATA", "/work/bench-data")) / "peers"
SHARED_DATASET = Path("/work/shared/datasets/lerobot-writer-small")
# Over S3 every loader caches what it downloads (Mosaic's local shards, LitData's chunks, our disk
# byte cache), and moto spools objects over 8 MB to temporary files: all of it in RAM (tmpfs), a
# fresh folder per measurement, so the raw copies (GBs) never fill a shared disk.
CACHE = Path(os.environ.get("LRN_PEERS_CACHE", "/dev/shm/lerobot-nodes-peers"))
BUCKET = "peers"
FPS_WINDOW = 50  # ACT: action over 50 frames
BATCH_SIZE = 32
LOADERS = ("ours", "ours-per-worker", "mds-jpeg", "mds-raw", "litdata")
OURS = ("ours", "ours-per-worker")
"""``ours-per-worker``: this package with ``streaming_batches_across_workers=false`` (a batch from one worker)."""
FORMATS = ("mds-jpeg", "mds-raw", "litdata")
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
READY, TIMED, RESULT = "@@READY", "@@TIMED", "@@RESULT "


# -- MosaicML Streaming without torchvision ----------------------------------------------------
def import_streaming() -> Any:
    """``import streaming``, on a venv without torchvision.

    ``streaming/__init__.py`` imports ``streaming.vision``, whose module bodies import
    ``torchvision.datasets.VisionDataset``, ``torchvision.datasets.CIFAR10`` and
    ``torchvision.transforms.functional.to_tensor``. This benchmark uses only ``streaming.base``
    (``MDSWriter``, ``StreamingDataset``), which never touches torchvision. PyPI's torchvision
    wheels are CUDA builds (``_C.so`` links ``libtorch_cuda.so``): on the CPU torch
    ``import torchvision`` fails (``operator torchvision::nms does not exist``), and a CPU build is
    only on PyTorch's own index, which this machine cannot reach. So without a torchvision those
    three names are placeholders that raise if anything calls them.
    """
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or a CUDA build that cannot load here
        import importlib.machinery
        import types

        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]

        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("torchvision is not installed in the peers venv (see benchmarks/peers.py)")

        class Placeholder:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                unavailable()

        modules = {
            n: types.ModuleType(n)
            for n in (
                "torchvision",
                "torchvision.datasets",
                "torchvision.transforms",
                "torchvision.transforms.functional",
            )
        }
        modules["torchvision.datasets"].VisionDataset = Placeholder  # type: ignore[attr-defined]
        modules["torchvision.datasets"].CIFAR10 = Placeholder  # type: ignore[attr-defined]
        modules["torchvision.transforms.functional"].to_tensor = unavailable  # type: ignore[attr-defined]
        modules["torchvision"].datasets = modules["torchvision.datasets"]  # type: ignore[attr-defined]
        modules["torchvision"].transforms = modules["torchvision.transforms"]  # type: ignore[attr-defined]
        modules["torchvision.transforms"].functional = modules["torchvision.transforms.functional"]  # type: ignore[attr-defined]
        for name, module in modules.items():
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # find_spec() asks for one
        sys.modules.update(modules)
    import streaming

    return streaming


# -- datasets ---------------------------------------------------------------------------------
def dataset_roots(names: list[str]) -> dict[str, Path]:
    """``lerobot-small``: the LeRobot-written dataset in shared/ (AV1 g=2, 40 episodes, 2 cameras
    240x320). ``h264-g30``: section 14's H.264 GOP-30 B-frame dataset (6 x 90 frames, 3 cameras
    480x640), written here by ``lerobot_nodes.testing.write_dataset`` if missing."""
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.mixing_curve import RECIPES

    roots: dict[str, Path] = {}
    for name in names:
        if name == "lerobot-small":
            roots[name] = SHARED_DATASET
            continue
        root = DATA / "datasets" / name
        if not (root / "meta" / "info.json").is_file():
            from lerobot_nodes.testing import write_dataset

            write_dataset(root, **RECIPES[name])
        roots[name] = root
    return roots


def act_window(fps: int) -> dict[str, list[float]]:
    return {"action": [i / fps for i in range(FPS_WINDOW)]}


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def dataset_bytes(meta: Any, episodes: list[int] | None, root: Path) -> int:
    """Bytes on disk of the dataset; with an episode selection, the selected episodes' share of it
    (their frames over all frames: the videos are multi-episode files)."""
    total = tree_bytes(root)
    if episodes is None:
        return total
    lengths = meta.episodes.length
    return int(total * int(sum(int(lengths[e]) for e in episodes)) / int(sum(int(x) for x in lengths)))


# -- conversion (one pass over this package's samples, every format written from it) -----------
def _plain(sample: dict[str, Any], cameras: list[str], jpeg: bool) -> dict[str, Any]:
    """One converted sample: the index columns, state/action arrays, and every camera (a PIL image
    for a ``jpeg`` column, else the raw uint8 ``(C, H, W)`` array)."""
    import numpy as np
    from PIL import Image

    row: dict[str, Any] = {
        "episode_index": int(sample["episode_index"]),
        "frame_index": int(sample["frame_index"]),
        "index": int(sample["index"]),
        "observation.state": sample["observation.state"].numpy(),
        "action": sample["action"].numpy(),
        "action_is_pad": sample["action_is_pad"].numpy().astype("uint8"),  # MDS ndarray has no bool
    }
    for key in cameras:
        frame = np.ascontiguousarray(sample[key].numpy())  # (C, H, W) uint8
        row[key] = Image.fromarray(np.ascontiguousarray(frame.transpose(1, 2, 0))) if jpeg else frame
    return row


class _Writer:
    """One format's writer: ``write(sample)`` then ``close()``; the seconds spent in both."""

    def __init__(self, fmt: str, out: Path, cameras: list[str]) -> None:
        self.fmt, self.out, self.cameras, self.seconds, self.count = fmt, out, cameras, 0.0, 0
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        if fmt.startswith("mds"):
            columns = {"episode_index": "int", "frame_index": "int", "index": "int"}
            columns.update({"observation.state": "ndarray", "action": "ndarray", "action_is_pad": "ndarray"})
            columns.update({key: "jpeg" if fmt == "mds-jpeg" else "ndarray" for key in cameras})
            self.writer: Any = import_streaming().MDSWriter(out=str(out), columns=columns)
        else:
            from litdata.streaming.writer import BinaryWriter  # what litdata.optimize writes with

            out.mkdir(parents=True)
            self.writer = BinaryWriter(str(out), chunk_bytes="64MB")
        self.seconds += time.perf_counter() - started

    def write(self, sample: dict[str, Any]) -> None:
        started = time.perf_counter()
        row = _plain(sample, self.cameras, jpeg=self.fmt == "mds-jpeg")
        if self.fmt.startswith("mds"):
            self.writer.write(row)
        else:
            self.writer[self.count] = row
        self.count += 1
        self.seconds += time.perf_counter() - started

    def close(self) -> None:
        started = time.perf_counter()
        if self.fmt.startswith("mds"):
            self.writer.finish()
        else:
            self.writer.done()
            self.writer.merge()
        self.seconds += time.perf_counter() - started


def convert(config: dict[str, Any]) -> dict[str, Any]:
    """Write every format of ``config['formats']`` of ``config['root']`` under ``config['out']``.

    One pass over ``StreamingLeRobotDataset`` (0 workers, one epoch): the decoding is timed once
    (``decode_s``, what every format's conversion pays) and each writer's own encoding and
    writing apart (``write_s``); a format's conversion time is their sum.
    """
    from lerobot_nodes import StreamingLeRobotDataset

    root, out = config["root"], Path(config["out"])
    cpu0 = os.times()
    dataset = StreamingLeRobotDataset(
        root=root, episodes=config["episodes"], delta_timestamps=act_window(config["fps"]), return_uint8=True
    )
    cameras = list(dataset.meta.video_keys)
    writers = [_Writer(fmt, out / fmt, cameras) for fmt in config["formats"]]
    decode_s, samples = 0.0, 0
    mark = time.perf_counter()
    for sample in dataset:
        decode_s += time.perf_counter() - mark
        samples += 1
        for writer in writers:
            writer.write(sample)
        mark = time.perf_counter()
    for writer in writers:
        writer.close()
    cpu1 = os.times()
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {
        "samples": samples,
        "decode_s": decode_s,
        "cpu_s": cpu,
        "formats": {w.fmt: {"write_s": w.seconds, "bytes": tree_bytes(w.out)} for w in writers},
    }


# -- process-tree figures ----------------------------------------------------------------------
def tree_pids(root: int) -> list[int]:
    sys.path.insert(0, str(HERE / "drivers"))
    import _driver_common as common

    return common.process_tree(root)


def tree_pss(root: int) -> int:
    """PSS bytes of ``root`` and its descendants (``/proc/<pid>/smaps_rollup``)."""
    total = 0
    for pid in tree_pids(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                for line in handle:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


def tree_cpu(root: int) -> float:
    try:
        import psutil
    except ImportError:
        sys.path.insert(0, str(HERE / "drivers"))
        import _driver_common as common

        return common.tree_cpu(root)
    total = 0.0
    try:
        process = psutil.Process(root)
        for p in [process, *process.children(recursive=True)]:
            try:
                times = p.cpu_times()
                total += times.user + times.system + times.children_user + times.children_system
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    return total


# -- one measurement (a fresh process) ---------------------------------------------------------
def build_loader(config: dict[str, Any]) -> tuple[Any, Any]:
    """(dataset, iterable of batches) for ``config['loader']``."""
    import torch

    loader, workers, where = config["loader"], config["num_workers"], config["where"]
    if loader in OURS:
        from lerobot_nodes import StreamingConfig, StreamingLeRobotDataset, streaming_dataloader

        options: dict[str, Any] = {"streaming_batches_across_workers": loader == "ours"}
        if where == "s3":
            options["streaming_disk_cache_dir"] = config["cache_dir"]
        dataset = StreamingLeRobotDataset(
            root=config["root"],
            episodes=config["episodes"],
            delta_timestamps=act_window(config["fps"]),
            return_uint8=True,
            seed=config["seed"],
            max_num_shards=max(1, workers),
            config=StreamingConfig(**options),
        )
        extra = {"prefetch_factor": 2} if workers else {}
        return dataset, streaming_dataloader(dataset, BATCH_SIZE, workers, **extra)
    if loader.startswith("mds"):
        import numpy as np

        StreamingDataset = import_streaming().StreamingDataset
        cameras = config["cameras"]

        class Frames(StreamingDataset):  # type: ignore[misc]
            def __getitem__(self, index: int) -> dict[str, Any]:
                row = super().__getitem__(index)
                for key in cameras:
                    value = row[key]
                    if not isinstance(value, np.ndarray):  # a PIL image (jpeg column): HWC -> CHW
                        value = np.asarray(value).transpose(2, 0, 1)
                    row[key] = torch.from_numpy(np.ascontiguousarray(value))
                return row

        if where == "s3":
            source = {"remote": config["remote"], "local": config["cache_dir"]}
        else:
            source = {"local": config["root"]}
        dataset = Frames(**source, shuffle=True, shuffle_seed=config["seed"], batch_size=BATCH_SIZE)
        extra = {"prefetch_factor": 2, "persistent_workers": True} if workers else {}
        return dataset, torch.utils.data.DataLoader(
            dataset, batch_size=BATCH_SIZE, num_workers=workers, **extra
        )
    import litdata

    if where == "s3":
        import litdata.streaming.downloader as downloader

        # LitData fetches chunks with obstore, which refuses a plain-http endpoint ("BadScheme")
        # unless its client allows http; LitData passes no option for it (moto serves http only).
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[index]
        dataset = litdata.StreamingDataset(
            config["remote"],
            shuffle=True,
            seed=config["seed"],
            cache_dir=config["cache_dir"],
            storage_options={"endpoint_url": config["endpoint"]},
        )
    else:
        dataset = litdata.StreamingDataset(config["root"], shuffle=True, seed=config["seed"])
    extra = {"prefetch_factor": 2} if workers else {}
    return dataset, litdata.StreamingDataLoader(dataset, batch_size=BATCH_SIZE, num_workers=workers, **extra)


def frame_check(batch: dict[str, Any], config: dict[str, Any], limit: int = 8) -> dict[str, float]:
    """Max abs difference and PSNR of the batch's first ``limit`` samples' frames against this package's."""
    import numpy as np

    from lerobot_nodes import MapStyleLeRobotDataset

    reference = MapStyleLeRobotDataset(
        root=config["local_root"], delta_timestamps=act_window(config["fps"]), return_uint8=True
    )
    worst, squared, count = 0, 0.0, 0
    for position in range(min(limit, int(batch["index"].shape[0]))):
        expected = reference[int(batch["index"][position])]
        assert int(expected["episode_index"]) == int(batch["episode_index"][position])
        assert int(expected["frame_index"]) == int(batch["frame_index"][position])
        for key in config["cameras"]:
            got = np.asarray(batch[key][position], dtype=np.int16)
            want = expected[key].numpy().astype(np.int16)
            difference = np.abs(got - want)
            worst = max(worst, int(difference.max()))
            squared += float((difference.astype(np.float64) ** 2).sum())
            count += difference.size
    mse = squared / count if count else float("nan")
    return {"max_abs_diff": worst, "psnr_db": float("inf") if mse == 0 else 10 * math.log10(255**2 / mse)}


def run_one(config: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch  # (its import is part of the "imports" PSS figure)

    if config["loader"] in OURS:
        # The lazy exports resolved here (torchdata, PyAV, pyarrow, ...), as the peers' packages
        # are imported whole: the first batch times construction, not imports.
        from lerobot_nodes import StreamingConfig, StreamingLeRobotDataset, streaming_dataloader  # noqa: F401
        from lerobot_nodes.loader import shutdown_dataloader  # noqa: F401
    elif config["loader"].startswith("mds"):
        import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    else:
        import litdata  # noqa: F401
    from lerobot_nodes.batch_mixing import MixingTally

    print(READY, flush=True)
    sys.stdin.readline()  # the parent has taken the imports' PSS
    started = time.perf_counter()
    dataset, loader = build_loader(config)
    tally = MixingTally()
    batches, samples, first_s, first_at, cpu_at_first = 0, 0, float("nan"), 0.0, 0.0
    last: Any = None
    while batches < config["batches"]:
        for batch in loader:
            batches += 1
            for value in batch.values():  # one byte of every page, as a training step reads its batch
                if isinstance(value, torch.Tensor) and value.nbytes >= 4096:
                    value.reshape(-1).view(torch.uint8)[::4096].sum()
            tally.observe(batch["episode_index"], batch["frame_index"])
            if batches == 1:
                first_at = time.perf_counter()
                first_s = first_at - started
                cpu_at_first = tree_cpu(os.getpid())
            else:
                samples += int(batch["episode_index"].shape[0])
            last = batch
            if batches >= config["batches"]:
                break
    elapsed = time.perf_counter() - first_at
    cpu = tree_cpu(os.getpid()) - cpu_at_first
    print(TIMED, flush=True)
    sys.stdin.readline()  # the parent has stopped sampling PSS
    result: dict[str, Any] = {
        "first_batch_s": first_s,
        "batches": batches,
        "samples_per_s": samples / elapsed if elapsed > 0 else None,
        "cpu_ms_per_sample": 1e3 * cpu / samples if samples else None,
        "batch_mb": sum(v.nbytes for v in last.values() if hasattr(v, "nbytes")) / 1e6,
    }
    if config["loader"] in OURS:
        report = dataset.metrics.report()
        result["peak_decoded_mb"] = report.peak_decoded_bytes / 1e6
        result["decoded_budget_mb"] = report.decoded_budget_bytes / 1e6
        result["batch_segments_created"] = report.batch_segments_created
        result["batch_parts_in_ring"] = report.batch_parts_in_ring
        result["decoded_per_delivered"] = report.decoded_per_delivered
    lengths = np.asarray(config["lengths"], dtype=np.int64)
    mixing = tally.figures(lengths)
    result.update(
        distinct_episodes=mixing.distinct_episodes,
        uniform_distinct_episodes=mixing.uniform_distinct_episodes,
        pairs_within_5_pct=100 * mixing.near_pairs,
        uniform_pairs_within_5_pct=100 * mixing.uniform_near_pairs,
    )
    result.update(frame_check(last, config))
    if config["loader"] in OURS:
        from lerobot_nodes.loader import shutdown_dataloader

        shutdown_dataloader(loader)
    return result


def run_imports_only(config: dict[str, Any]) -> None:
    """A process that only imports torch and this package (the floor of ``ours``' PSS)."""
    import torch  # noqa: F401

    import lerobot_nodes  # noqa: F401
    from lerobot_nodes import StreamingLeRobotDataset  # noqa: F401  (the lazy exports, resolved)

    print(READY, flush=True)
    sys.stdin.readline()


def measure(config: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Run one measurement in a fresh process, sampling its tree's PSS every 50 ms."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--one", json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdin and process.stdout and process.stderr
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True).start()  # type: ignore[union-attr]
    peak, imports, stop = [0], [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_pss(process.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    result: dict[str, Any] = {}
    for line in process.stdout:
        if line.startswith(READY):
            imports[0] = tree_pss(process.pid)
            sampler.start()
            process.stdin.write("\n")
            process.stdin.flush()
        elif line.startswith(TIMED):
            stop.set()
            sampler.join()
            process.stdin.write("\n")
            process.stdin.flush()
        elif line.startswith(RESULT):
            result = json.loads(line[len(RESULT) :])
    process.wait(timeout=120)
    stop.set()
    if process.returncode or (not result and config["loader"] != "imports"):
        tail = "".join(errors)[-3000:]
        raise RuntimeError(f"{config['loader']} failed ({process.returncode}): {tail}")
    return {"imports_pss_mb": imports[0] / 1e6, "peak_pss_mb": peak[0] / 1e6, **result}


# -- the S3-compatible server ------------------------------------------------------------------
class MotoServer:
    """``moto_server`` in its own process on 127.0.0.1 (not in any measured process tree)."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        moto = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
        spool = CACHE / "moto"
        spool.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [moto, "-H", "127.0.0.1", "-p", str(self.port)],
            env={**os.environ, "TMPDIR": str(spool)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.endpoint = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise RuntimeError("moto_server did not start")

    def env(self) -> dict[str, str]:
        return {**S3_ENV, "AWS_ENDPOINT_URL": self.endpoint, "S3_ENDPOINT_URL": self.endpoint}

    def upload(self, local: Path, key: str) -> str:
        import boto3

        client = boto3.client(
            "s3", endpoint_url=self.endpoint, **{k.lower(): v for k, v in S3_ENV.items() if "KEY" in k}
        )
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=BUCKET)
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            client.upload_file(str(path), BUCKET, f"{key}/{path.relative_to(local).as_posix()}")
        return f"s3://{BUCKET}/{key}"

    def remove(self, prefix: str) -> None:
        import boto3

        resource = boto3.resource(
            "s3", endpoint_url=self.endpoint, **{k.lower(): v for k, v in S3_ENV.items() if "KEY" in k}
        )
        resource.Bucket(BUCKET).objects.filter(Prefix=f"{prefix}/").delete()

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


# -- the run -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="one round, 12 batches, local + s3 on h264-g30 only"
    )
    parser.add_argument("--datasets", nargs="+", default=["lerobot-small", "h264-g30"])
    parser.add_argument("--where", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    parser.add_argument("--workers", nargs="+", type=int, default=[0, 2])
    parser.add_argument("--loaders", nargs="+", default=list(LOADERS), choices=LOADERS)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds of the alternated loaders (order reversed each)"
    )
    parser.add_argument(
        "--episodes",
        type=int,
        default=10,
        help="convert and read the first N episodes of lerobot-small (all of h264-g30)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the converted copies (GBs) after the run")
    parser.add_argument(
        "--reuse", action="store_true", help="measure the kept copies instead of converting again"
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="ours reads with an empty $HF_LEROBOT_HOME per measurement: no metadata or video index cached (a "
        "first run ever; the peers' download caches are fresh per measurement either way)",
    )
    parser.add_argument("--out", type=Path, default=DATA / "results.jsonl")
    parser.add_argument("--plot", type=Path, default=HERE / "plots" / "peers")
    parser.add_argument(
        "--report-only",
        nargs="+",
        type=Path,
        metavar="JSONL",
        help="table and plot from earlier runs' JSON lines",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--convert", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        config = json.loads(args.one)
        if config["loader"] == "imports":
            run_imports_only(config)
            return 0
        print(RESULT + json.dumps(run_one(config)), flush=True)
        return 0
    if args.convert:
        print(RESULT + json.dumps(convert(json.loads(args.convert))), flush=True)
        return 0
    if args.report_only:
        rows = [
            json.loads(line)
            for path in args.report_only
            for line in path.read_text().splitlines()
            if line.strip()
        ]
        print(table(rows))
        plot(rows, args.plot)
        return 0
    if args.quick:
        args.datasets, args.batches, args.rounds = ["h264-g30"], 12, 1
    return run(args)


def run(args: argparse.Namespace) -> int:
    from lerobot_nodes import MapStyleLeRobotDataset

    args.out.parent.mkdir(parents=True, exist_ok=True)
    roots = dataset_roots(args.datasets)
    base_env = {k: v for k, v in os.environ.items()}
    rows: list[dict[str, Any]] = []
    out = open(args.out, "a")  # noqa: SIM115 - closed in the finally below, rows written as they come

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        out.write(json.dumps(row) + "\n")
        out.flush()

    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # The floor of our PSS: a process that only imports torch and this package.
    for _ in range(2):
        emit({"stamp": stamp, "kind": "imports-only", **measure({"loader": "imports"}, base_env)})
    print(f"imports only (torch + lerobot_nodes): {rows[-1]['imports_pss_mb']:.0f} MB PSS", flush=True)

    server = MotoServer() if "s3" in args.where else None
    try:
        for name, root in roots.items():
            meta_ds = MapStyleLeRobotDataset(root=root)
            meta = meta_ds.meta
            cameras = list(meta.video_keys)
            episodes = (
                list(range(min(args.episodes, meta.total_episodes))) if name == "lerobot-small" else None
            )
            lengths = [
                int(x) for x in meta.episodes.length[episodes if episodes is not None else slice(None)]
            ]
            base = {
                "fps": int(meta_ds.fps),
                "cameras": cameras,
                "lengths": lengths,
                "episodes": episodes,
                "local_root": str(root),
                "seed": args.seed,
                "batches": args.batches,
            }
            stores: dict[str, Path] = {"ours": root, "ours-per-worker": root}
            formats = [fmt for fmt in FORMATS if fmt in args.loaders]
            target = DATA / "converted" / name
            stamp_file = target / "conversion.json"
            if formats and args.reuse and stamp_file.is_file():
                converted = json.loads(stamp_file.read_text())
                formats = [] if set(formats) <= set(converted["formats"]) else formats
            if formats:
                request = {"root": str(root), "out": str(target), "formats": formats, "episodes": episodes}
                request["fps"] = base["fps"]
                done = subprocess.run(
                    [sys.executable, __file__, "--convert", json.dumps(request)],
                    capture_output=True,
                    text=True,
                )
                lines = [line[len(RESULT) :] for line in done.stdout.splitlines() if line.startswith(RESULT)]
                if done.returncode or not lines:
                    raise RuntimeError(f"converting {name} failed: {done.stderr[-3000:]}")
                converted = json.loads(lines[-1])
                stamp_file.write_text(lines[-1])
                print(
                    f"{name}: {converted['samples']} samples decoded in {converted['decode_s']:.1f} s "
                    f"({converted['cpu_s']:.1f} CPU s for the whole conversion)",
                    flush=True,
                )
            if any(fmt in args.loaders for fmt in FORMATS):
                for fmt, figures in converted["formats"].items():
                    seconds = converted["decode_s"] + figures["write_s"]
                    row = {
                        "stamp": stamp,
                        "kind": "convert",
                        "dataset": name,
                        "format": fmt,
                        "seconds": seconds,
                        "decode_s": converted["decode_s"],
                        "write_s": figures["write_s"],
                        "bytes": figures["bytes"],
                        "samples": converted["samples"],
                    }
                    emit(row)
                    print(
                        f"  -> {fmt}: {seconds:.1f} s ({figures['write_s']:.1f} s writing), "
                        f"{figures['bytes'] / 1e6:.1f} MB",
                        flush=True,
                    )
                    stores[fmt] = target / fmt
            emit(
                {
                    "stamp": stamp,
                    "kind": "convert",
                    "dataset": name,
                    "format": "ours",
                    "seconds": 0.0,
                    "bytes": dataset_bytes(meta, episodes, root),
                    "samples": sum(lengths),
                }
            )
            remotes: dict[str, str] = {}
            for where in args.where:
                if where == "s3" and server is not None and not remotes:  # after the local runs
                    for loader, path in stores.items():
                        if loader in args.loaders:
                            remotes[loader] = server.upload(path, f"{name}/{loader}")
                env = {**base_env, **(server.env() if where == "s3" and server else {})}
                for workers in args.workers:
                    for round_index in range(args.rounds):
                        order = list(args.loaders) if round_index % 2 == 0 else list(reversed(args.loaders))
                        for loader in order:
                            CACHE.mkdir(parents=True, exist_ok=True)
                            cache = Path(tempfile.mkdtemp(prefix=f"{loader}-", dir=CACHE))
                            config = {
                                **base,
                                "loader": loader,
                                "where": where,
                                "num_workers": workers,
                                "root": remotes[loader] if where == "s3" else str(stores[loader]),
                                "remote": remotes.get(loader),
                                "endpoint": server.endpoint if server else None,
                                "cache_dir": str(cache),
                            }
                            home = {"HF_LEROBOT_HOME": str(cache / "home")} if args.cold and loader in OURS else {}
                            try:
                                figures = measure(config, {**env, **home})
                            except RuntimeError as error:
                                print(
                                    f"FAILED {name} {where} w{workers} {loader}: {error}",
                                    file=sys.stderr,
                                    flush=True,
                                )
                                continue
                            finally:
                                shutil.rmtree(cache, ignore_errors=True)
                            row = {
                                "stamp": stamp,
                                "kind": "measure",
                                "dataset": name,
                                "where": where,
                                "num_workers": workers,
                                "loader": loader,
                                "round": round_index,
                                "cold": bool(home),
                                **figures,
                            }
                            emit(row)
                            print(line_of(row), flush=True)
            if server is not None:
                server.remove(name)
            if not args.keep:
                shutil.rmtree(DATA / "converted" / name, ignore_errors=True)  # the raw copies are GBs
    finally:
        if server is not None:
            server.close()
        out.close()
    print(table(rows))
    plot(rows, args.plot)
    return 0


def line_of(row: dict[str, Any]) -> str:
    return (
        f"{row['dataset']} {row['where']} w{row['num_workers']} {row['loader']:8s} r{row['round']}: "
        f"{row['samples_per_s']:.1f} samples/s, {row['cpu_ms_per_sample']:.2f} CPU ms/sample, first batch "
        f"{row['first_batch_s']:.2f} s, PSS imports {row['imports_pss_mb']:.0f} / peak {row['peak_pss_mb']:.0f} MB, "
        f"episodes/batch {row['distinct_episodes']:.1f} ({row['uniform_distinct_episodes']:.1f}), within 5 "
        f"{row['pairs_within_5_pct']:.2f} % ({row['uniform_pairs_within_5_pct']:.2f} %), max diff "
        f"{row['max_abs_diff']}, PSNR {row['psnr_db']:.1f} dB"
    )


def median(values: list[float]) -> float:
    values = sorted(v for v in values if v is not None and not math.isnan(v))
    if not values:
        return float("nan")
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median over rounds per (dataset, where, workers, loader)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("kind") == "measure":
            groups.setdefault((row["dataset"], row["where"], row["num_workers"], row["loader"]), []).append(
                row
            )
    sizes = {(r["dataset"], r["format"]): r for r in rows if r.get("kind") == "convert"}
    cells = []
    order = {loader: i for i, loader in enumerate(LOADERS)}
    ordered = sorted(groups.items(), key=lambda item: (item[0][0], item[0][1], item[0][2], order[item[0][3]]))
    for (dataset, where, workers, loader), group in ordered:
        cell = {
            "dataset": dataset,
            "where": where,
            "num_workers": workers,
            "loader": loader,
            "runs": len(group),
        }
        for key in (
            "samples_per_s",
            "cpu_ms_per_sample",
            "first_batch_s",
            "peak_pss_mb",
            "imports_pss_mb",
            "distinct_episodes",
            "uniform_distinct_episodes",
            "pairs_within_5_pct",
            "uniform_pairs_within_5_pct",
            "max_abs_diff",
            "psnr_db",
        ):
            cell[key] = median([r.get(key) for r in group])
        cell["samples_per_s_all"] = [round(r["samples_per_s"], 1) for r in group]
        converted = sizes.get((dataset, loader))
        cell["disk_mb"] = converted["bytes"] / 1e6 if converted else float("nan")
        cell["convert_s"] = converted["seconds"] if converted else float("nan")
        cells.append(cell)
    return cells


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| dataset | where | workers | loader | samples/s (runs) | CPU ms/sample | first batch s | peak PSS MB "
        "(imports) | episodes/batch (uniform) | within 5 frames % (uniform) | max diff / PSNR dB | disk MB | convert s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in summary(rows):
        psnr = "exact" if c["max_abs_diff"] == 0 else f"{c['max_abs_diff']:.0f} / {c['psnr_db']:.1f}"
        runs = "/".join(f"{v:.0f}" for v in c["samples_per_s_all"])
        lines.append(
            f"| {c['dataset']} | {c['where']} | {c['num_workers']} | {c['loader']} | {c['samples_per_s']:.0f} ({runs}) | "
            f"{c['cpu_ms_per_sample']:.2f} | {c['first_batch_s']:.2f} | {c['peak_pss_mb']:.0f} ({c['imports_pss_mb']:.0f}) | "
            f"{c['distinct_episodes']:.1f} ({c['uniform_distinct_episodes']:.1f}) | {c['pairs_within_5_pct']:.2f} "
            f"({c['uniform_pairs_within_5_pct']:.2f}) | {psnr} | {c['disk_mb']:.1f} | {c['convert_s']:.0f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = summary(rows)
    if not cells:
        return
    folder.mkdir(parents=True, exist_ok=True)
    groups = sorted({(c["dataset"], c["where"], c["num_workers"]) for c in cells})
    loaders = [loader for loader in LOADERS if any(c["loader"] == loader for c in cells)]
    figure, axes = plt.subplots(3, 1, figsize=(max(8, 1.2 * len(groups)), 10), sharex=True)
    width = 0.8 / len(loaders)
    for axis, (key, label) in zip(
        axes,
        [
            ("samples_per_s", "samples/s"),
            ("peak_pss_mb", "peak PSS of the tree (MB)"),
            ("first_batch_s", "first batch (s)"),
        ],
        strict=True,
    ):
        for position, loader in enumerate(loaders):
            values = []
            for group in groups:
                found = [
                    c[key]
                    for c in cells
                    if (c["dataset"], c["where"], c["num_workers"]) == group and c["loader"] == loader
                ]
                values.append(found[0] if found else 0)
            axis.bar([i + position * width for i in range(len(groups))], values, width, label=loader)
        axis.set_ylabel(label)
        axis.grid(axis="y", alpha=0.3)
    axes[0].legend(ncols=len(loaders), fontsize=8)
    axes[-1].set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
    axes[-1].set_xticklabels([f"{d}\n{w}, {n} workers" for d, w, n in groups], fontsize=7)
    figure.suptitle("Peers: ACT window, batch 32, shuffle (median of rounds)")
    figure.tight_layout()
    figure.savefig(folder / "peers.png", dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    raise SystemExit(main())
