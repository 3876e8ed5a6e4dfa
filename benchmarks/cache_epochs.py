"""Bytes and requests the loopback Hub serves per epoch (1-3), with the disk byte cache off and on.

Two datasets written by ``lerobot_nodes.testing.write_dataset`` stand for what LeRobot writes: AV1
with ``g=2`` (LeRobot's encoder settings) and H.264 GOP 30 with B-frames (x264 defaults), several
MP4 files per camera (``moov`` at the end for H.264), several data files. Each configuration gets
a fresh ``HF_LEROBOT_HOME`` and a fresh Hub; one ``StreamingLeRobotDataset`` then runs three
epochs with DataLoader workers. "open" is the dataset's construction (revision, listing,
metadata, MP4 index build); "restart" is a second dataset object on the same cache (a resumed or
restarted job) running one more epoch.

    python benchmarks/cache_epochs.py                       # both codecs, 2 workers
    python benchmarks/cache_epochs.py --episodes 8 --workers 0
    python benchmarks/cache_epochs.py --episodes 40 --height 240 --width 320 --video-file-mb 4 --lerobot \\
        --plot benchmarks/plots/cache_epochs/requests_bytes.png --json /tmp/cache_epochs.json

``--lerobot`` adds LeRobot 0.6.1's ``StreamingLeRobotDataset`` over the same kind of Hub (a fresh
one): run as a subprocess under its own venv (``$LEROBOT_VENV``, default
``/work/lerobot-train-venv``) through ``drivers/epochs_driver.py``, with fresh ``HF_HOME``,
``HF_DATASETS_CACHE`` and ``HF_LEROBOT_HOME``, ``HF_HUB_OFFLINE`` unset, 2 DataLoader workers
(persistent, as LeRobot's training sets them), 3 epochs of one DataLoader. LeRobot reads the data
Parquet through ``datasets`` and the MP4s through ``HfFileSystem`` (torchcodec on fsspec files).

Columns: requests the Hub answered per class (API: ``/api/...``; resolve: ``/resolve/`` on the
Hub; other: the CDN's signed payload reads), MB served (response bodies), the dataset's MB,
seconds. Samples/s against a local folder: ``cache_epoch_speed.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LEROBOT_PYTHON = Path(os.environ.get("LEROBOT_VENV", "/work/lerobot-train-venv")) / "bin" / "python"
READY, PHASE = "@@READY", "@@PHASE "
REQUEST_CLASSES = ("api", "resolve", "other")
LEROBOT = "LeRobot 0.6.1"
ONE_FILE_MB = 10_000.0
"""An MP4 rollover size no camera reaches: one MP4 file per camera."""
REPO = "lerobot-nodes/cache-epochs"
CAMERAS = ("observation.images.top", "observation.images.wrist")
WINDOW = {
    "action": [0.0, 1 / 30],
    "observation.images.top": [-1 / 30, 0.0],
    "observation.state": [-1 / 30, 0.0],
}
CODECS = {
    "av1-g2": {"codec": "av1", "gop": 2, "video_faststart": True},
    "h264-gop30-bframes": {"codec": "h264", "gop": 30, "video_faststart": False},
}


def make_dataset(
    root: Path, codec: str, episodes: int, length: int, height: int, width: int, video_mb: float
) -> Path:
    from lerobot_nodes.testing import write_dataset

    lengths = [length + (7 * i) % 23 - 11 for i in range(episodes)]
    return write_dataset(
        root,
        episode_lengths=lengths,
        cameras=CAMERAS,
        height=height,
        width=width,
        video_files_size_in_mb=video_mb,
        data_file_size_in_mb=0.05,
        seed=5,
        **CODECS[codec],
    )


def request_class(record: Any) -> str:
    """``api`` (``/api/...`` on the Hub), ``resolve`` (``/resolve/`` on the Hub), ``other`` (the CDN's
    signed payload reads, anything else)."""
    if record.origin == "hub" and record.path.startswith("/api/"):
        return "api"
    if record.origin == "hub" and "/resolve/" in record.path:
        return "resolve"
    return "other"


def count(records: Iterable[Any]) -> dict[str, int]:
    """Requests per class (:func:`request_class`) and ``bytes``: the response bodies' bytes."""
    counts = dict.fromkeys((*REQUEST_CLASSES, "bytes"), 0)
    for record in records:
        counts[request_class(record)] += 1
        counts["bytes"] += record.bytes_sent
    return counts


def hub_env(home: Path, endpoint: str) -> dict[str, str]:
    """A subprocess's environment: nothing cached from before (``home`` is fresh), online, no Xet."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD", "HF_HUB_OFFLINE")}
    env.update(
        {
            "HF_ENDPOINT": endpoint,
            "HF_LEROBOT_HOME": str(home / "lerobot"),
            "HF_HOME": str(home / "hf"),
            "HF_DATASETS_CACHE": str(home / "datasets"),
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    return env


def drive_epochs(
    python: Path, config: dict[str, Any], env: dict[str, str], hub: Any, timeout_s: float = 1800.0
) -> list[dict[str, Any]]:
    """Run ``drivers/epochs_driver.py`` under ``python``; its phases, each with the requests the hub
    answered during it (:func:`count`). Raises RuntimeError with the driver's last stderr lines."""
    process = subprocess.Popen(
        [str(python), str(HERE / "drivers" / "epochs_driver.py"), json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True).start()  # type: ignore[arg-type]
    phases: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    try:
        for line in process.stdout:
            if line.startswith(PHASE):
                phases.append({**json.loads(line[len(PHASE) :]), **count(list(hub.records))})
            elif not line.startswith(READY):
                continue
            if time.monotonic() > deadline:
                break
            hub.clear_records()  # nothing runs in the driver until it reads the next line
            process.stdin.write("go\n")
            process.stdin.flush()
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
    if process.returncode != 0:
        raise RuntimeError(
            f"{python.name} epochs driver exited {process.returncode}:\n" + "".join(errors[-15:])
        )
    return phases


def run(root: Path, cache_on: bool, workers: int, epochs: int) -> list[dict[str, Any]]:
    """This project's loader, in this process: one row per phase, ``phase``, :func:`count`'s keys, ``seconds``."""
    from lerobot_nodes.config import StreamingConfig
    from lerobot_nodes.dataset import StreamingLeRobotDataset
    from lerobot_nodes.loader import streaming_dataloader
    from lerobot_nodes.testing.hub import LoopbackHub

    config = StreamingConfig(streaming_episode_pool_size=4, streaming_disk_cache_gb=None if cache_on else 0)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as home, LoopbackHub() as hub:
        os.environ["HF_LEROBOT_HOME"] = home
        os.environ["HF_ENDPOINT"] = hub.endpoint
        hub.add_dataset(REPO, root)

        def measured(phase: str, action) -> None:  # type: ignore[no-untyped-def]
            hub.clear_records()
            started = time.perf_counter()
            action()
            rows.append(
                {"phase": phase, **count(list(hub.records)), "seconds": time.perf_counter() - started}
            )

        def open_dataset():  # type: ignore[no-untyped-def]
            return StreamingLeRobotDataset(
                repo_id=REPO, delta_timestamps=WINDOW, return_uint8=True, seed=3, config=config
            )

        def epoch(dataset) -> None:  # type: ignore[no-untyped-def]
            for _ in streaming_dataloader(dataset, batch_size=8, num_workers=workers):
                pass

        datasets = []
        measured("open", lambda: datasets.append(open_dataset()))
        for index in range(1, epochs + 1):
            measured(f"epoch {index}", lambda: epoch(datasets[0]))
        measured("restart", lambda: epoch(open_dataset()))
    return rows


def run_lerobot(root: Path, workers: int, epochs: int) -> list[dict[str, Any]]:
    """LeRobot 0.6.1's ``StreamingLeRobotDataset`` (its venv, a subprocess) over a fresh loopback Hub,
    with fresh ``HF_HOME`` / ``HF_DATASETS_CACHE`` / ``HF_LEROBOT_HOME``: rows as :func:`run`'s. Its
    "restart" is a second process on the same homes: its open and one epoch."""
    from lerobot_nodes.testing.hub import LoopbackHub

    config = {
        "loaders": [{"name": "lerobot-0.6.1", "kind": "lerobot", "repo_id": REPO, "root": None}],
        "delta_timestamps": WINDOW,
        "num_workers": workers,
        "batch_size": 8,
        "seed": 3,
        "epochs": epochs,
        "camera_key": CAMERAS[0],
    }
    with tempfile.TemporaryDirectory() as home, LoopbackHub() as hub:
        hub.add_dataset(REPO, root)
        env = hub_env(Path(home), hub.endpoint)
        phases = drive_epochs(LEROBOT_PYTHON, config, env, hub)
        again = drive_epochs(LEROBOT_PYTHON, {**config, "epochs": 1}, env, hub)
    restart = {key: sum(phase[key] for phase in again) for key in (*REQUEST_CLASSES, "bytes", "wall_s")}
    return [{**phase, "seconds": phase["wall_s"]} for phase in [*phases, {**restart, "phase": "restart"}]]


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """MB served and requests per phase (open, epochs, restart), one line per dataset and loader/cache setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(13, 6.2))
    styles = {"off": ("tab:red", "-"), "on": ("tab:green", "-"), LEROBOT: ("tab:blue", "--")}
    labels = list(dict.fromkeys(r["dataset"] for r in results))
    markers = dict(zip(labels, ("o", "s", "^", "D", "v"), strict=False))
    for result in results:
        if result.get("error"):
            continue
        rows = result["rows"]
        phases = [r["phase"] for r in rows]
        color, line = styles[result["setting"]]
        setting = result["setting"] if result["setting"] == LEROBOT else f"cache {result['setting']}"
        style = {
            "color": color,
            "linestyle": line,
            "marker": markers.get(result["dataset"], "x"),
            "label": f"{result['dataset']}: {setting}",
        }
        axes[0].plot(phases, [r["bytes"] / 1e6 for r in rows], **style)
        axes[1].plot(phases, [sum(r[k] for k in REQUEST_CLASSES) for r in rows], **style)
    titles = ("MB the Hub served (symlog)", "requests: API + resolve + CDN (symlog)")
    for axis, title, linear_below in zip(axes, titles, (0.1, 1), strict=True):
        axis.set_yscale("symlog", linthresh=linear_below)
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
    axes[0].set_ylabel("MB")
    handles, names = axes[0].get_legend_handles_labels()
    figure.legend(handles, names, loc="lower center", ncol=3, fontsize=8)
    figure.suptitle(
        "Loopback Hub traffic per phase, 2 workers: this project's disk byte cache off / on, "
        "LeRobot 0.6.1's StreamingLeRobotDataset"
    )
    figure.tight_layout(rect=(0, 0.17, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def describe(codec: str, root: Path) -> tuple[str, float]:
    """The dataset's label (codec, MP4 and data files) and its MB."""
    files = [p for p in root.rglob("*") if p.is_file()]
    mp4s = len([p for p in files if p.suffix == ".mp4"])
    parquets = len([p for p in files if p.suffix == ".parquet" and "data" in p.parts])
    return f"{codec} ({mp4s} mp4, {parquets} data parquet)", sum(p.stat().st_size for p in files) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", nargs="+", default=list(CODECS), choices=list(CODECS))
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--length", type=int, default=90, help="frames per episode (about)")
    parser.add_argument("--height", type=int, default=192)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--video-file-mb", type=float, default=1.0, help="MP4 rollover size")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--lerobot",
        action="store_true",
        help=f"also run LeRobot 0.6.1's StreamingLeRobotDataset ({LEROBOT_PYTHON}, $LEROBOT_VENV)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        help="save the plot here (PNG), e.g. benchmarks/plots/cache_epochs/requests_bytes.png",
    )
    parser.add_argument("--json", type=Path, help="write every row here too (for --replot)")
    parser.add_argument("--replot", type=Path, help="only draw --plot from a --json file of an earlier run")
    args = parser.parse_args(argv)
    if args.replot:
        if args.plot is None:
            parser.error("--replot needs --plot (where to save the figure)")
        plot(json.loads(args.replot.read_text()), args.plot)
        return 0
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.pop("HF_HUB_OFFLINE", None)
    print("| dataset | loader | phase | API | resolve | other (CDN) | MB served | dataset MB | s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for codec in args.codecs:
            layouts = [args.video_file_mb]
            while layouts:
                video_mb = layouts.pop(0)
                root = make_dataset(
                    Path(scratch) / f"{codec}-{video_mb:g}",
                    codec,
                    args.episodes,
                    args.length,
                    args.height,
                    args.width,
                    video_mb,
                )
                label, size_mb = describe(codec, root)
                for setting in ("off", "on", *((LEROBOT,) if args.lerobot else ())):
                    result: dict[str, Any] = {
                        "codec": codec,
                        "dataset": label,
                        "setting": setting,
                        "dataset_mb": size_mb,
                        "rows": [],
                    }
                    results.append(result)
                    if setting != LEROBOT:
                        result["rows"] = run(root, setting == "on", args.workers, args.epochs)
                    else:
                        try:
                            result["rows"] = run_lerobot(root, args.workers, args.epochs)
                        except RuntimeError as error:
                            result["error"] = str(error).strip().splitlines()[-1]
                            print(
                                f"| {label} | {LEROBOT} | **failed**: `{result['error']}` | | | | | {size_mb:.2f} | |"
                            )
                            # LeRobot 0.6.1 reads a frame at `index / fps` of its MP4: right only while a camera
                            # has one file. Then the same episodes with one MP4 per camera, which it can read.
                            if video_mb < ONE_FILE_MB:
                                layouts.append(ONE_FILE_MB)
                    name = setting if setting == LEROBOT else f"cache {setting}"
                    for row in result["rows"]:
                        print(
                            f"| {label} | {name} | {row['phase']} | {row['api']} | {row['resolve']} | {row['other']} | "
                            f"{row['bytes'] / 1e6:.2f} | {size_mb:.2f} | {row['seconds']:.1f} |",
                            flush=True,
                        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
