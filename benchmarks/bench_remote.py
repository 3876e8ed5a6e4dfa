"""Remote streaming over the loopback Hub, side by side with the same dataset read locally.

    /work/venv/bin/python benchmarks/bench_remote.py --output benchmarks/remote_results.md

The loopback Hub (``lerobot_nodes.testing.hub``) runs in this process and serves the dataset as
a dataset repo with a second "CDN" origin for redirected payload reads, like the real Hub, with
0 / 20 / 50 / 100 ms injected per request. Each measured loader runs as its own subprocess
through the drivers of ``benchmarks/drivers`` (the protocol of ``_driver_common.py``): A is this
project's ``StreamingLeRobotDataset`` (``repo_id`` only, so it streams from the Hub), C is
LeRobot 0.6.1's ``StreamingLeRobotDataset`` in the LeRobot venv (``setup_lerobot_env.sh``).
The server counts every request and byte, so bytes per payload and requests per episode are
measured where they cross the wire.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "drivers"))
import _driver_common as common  # noqa: E402

from lerobot_nodes.testing.hub import LoopbackHub  # noqa: E402

REPO = "lerobot-nodes/bench"
DEFAULT_DATASET = HERE.parent.parent / "shared" / "datasets" / "lerobot-writer-small"
OUR_PYTHON = Path(sys.executable)
LEROBOT_PYTHON = Path(os.environ.get("LEROBOT_VENV", "/work/lerobot-venv")) / "bin" / "python"


def dataset_facts(root: Path) -> dict[str, Any]:
    info = json.loads((root / "meta" / "info.json").read_text())
    cameras = [k for k, v in info["features"].items() if v.get("dtype") == "video"]
    payload = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.parts[len(root.parts)] in
                  ("data", "videos"))
    return {"fps": info["fps"], "cameras": cameras, "features": info["features"], "payload": payload,
            "episodes": info["total_episodes"], "frames": info["total_frames"]}


def run_driver(python: Path, script: str, config: dict[str, Any], env: dict[str, str], timeout: float) -> dict:
    """One loader pass in a subprocess; its ``@@RESULT`` dict (or an ``error``)."""
    process = subprocess.Popen(
        [str(python), str(HERE / "drivers" / script), json.dumps(config)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    stderr_lines: list[str] = []
    threading.Thread(target=lambda: stderr_lines.extend(process.stderr), daemon=True).start()  # type: ignore[arg-type]
    result: dict[str, Any] = {"error": "no result"}
    deadline = time.monotonic() + timeout
    try:
        for line in process.stdout:
            if line.startswith(common.READY):
                process.stdin.write("go\n")
                process.stdin.flush()
            elif line.startswith(common.RESULT):
                result = json.loads(line[len(common.RESULT):])
                process.stdin.write("exit\n")
                process.stdin.flush()
                break
            if time.monotonic() > deadline:
                result = {"error": f"timeout after {timeout} s"}
                break
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
    if "error" in result:
        result["stderr_tail"] = "".join(stderr_lines[-6:])
    return result


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.root = Path(args.dataset).resolve()
        self.facts = dataset_facts(self.root)
        self.work = Path(tempfile.mkdtemp(prefix="bench-remote-"))
        self.rows: list[dict[str, Any]] = []

    def config(self, remote: bool, num_workers: int, num_batches: int | None) -> dict[str, Any]:
        return {
            "repo_id": REPO if remote else "local/bench",
            "root": None if remote else str(self.root),
            "camera_keys": self.facts["cameras"],
            "delta_timestamps": common.delta_timestamps("act", self.facts["fps"], self.facts["cameras"],
                                                        self.facts["features"]),
            "num_workers": num_workers,
            "batch_size": self.args.batch_size,
            "prefetch_factor": 4,
            "mp_context": "spawn",
            "seed": 1000,
            "num_batches": num_batches,
            "decode_check_batches": 0,
        }

    def env(self, hub: LoopbackHub | None, home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD")}
        env.update({"HF_LEROBOT_HOME": str(home), "HF_HOME": str(home / "hf"), "HF_HUB_DISABLE_XET": "1",
                    "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"})
        if hub is not None:
            env["HF_ENDPOINT"] = hub.endpoint
        env.update(extra or {})
        return env

    def measure(self, label: str, loader: str, hub: LoopbackHub | None, home: Path, num_workers: int,
                num_batches: int | None, latency_ms: int | None, flags: dict[str, int] | None = None) -> dict:
        python, script = (OUR_PYTHON, "lerobot_nodes_driver.py") if loader == "A" else (
            LEROBOT_PYTHON, "lerobot_streaming_driver.py")
        config = self.config(hub is not None, num_workers, num_batches)
        env = self.env(hub, home, {"LEROBOT_NODES_BENCH_FLAGS": json.dumps(flags or {})})
        if hub is not None:
            hub.clear_records()
        started = time.perf_counter()
        result = run_driver(python, script, config, env, self.args.run_timeout)
        wall = time.perf_counter() - started
        row: dict[str, Any] = {"label": label, "loader": loader, "latency_ms": latency_ms, "workers": num_workers,
                               "flags": flags or {}, "batches": result.get("batches"),
                               "samples": result.get("samples"), "samples_per_s": result.get("samples_per_s"),
                               "ttfb_s": result.get("ttfb_s"), "wall_s": wall, "error": result.get("error"),
                               "stderr_tail": result.get("stderr_tail")}
        if hub is not None:
            records = list(hub.records)
            row["requests"] = len(records)
            row["range_reads"] = sum(1 for r in records if r.range)
            row["bytes_sent"] = sum(r.bytes_sent for r in records)
            row["payload_bytes_sent"] = sum(r.bytes_sent for r in records if "/meta/" not in r.path and r.range)
        self.rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "stderr_tail"}), flush=True)
        if row["error"]:
            print(row.get("stderr_tail"), file=sys.stderr, flush=True)
        return row

    def run(self) -> None:
        args = self.args
        local_home = self.work / "local-home"
        self.measure("warm-up (local)", "A", None, local_home, 2, 3, None)
        for rep in range(args.runs):
            for workers in args.workers:
                self.measure(f"local r{rep}", "A", None, local_home, workers, args.batches, None)
        for latency in args.latencies:
            with LoopbackHub(latency_s=latency / 1000) as hub:
                hub.add_dataset(REPO, self.root)
                home = self.work / f"home-{latency}"
                cold = self.measure("cold (index built over HTTP)", "A", hub, home, 2, 3, latency)
                cold["cold"] = True
                for rep in range(args.runs):
                    for workers in args.workers:
                        self.measure(f"remote r{rep}", "A", hub, home, workers, args.batches, latency)
                if latency == args.epoch_latency:
                    self.measure("full epoch", "A", hub, home, 2, None, latency)
                    for flags in ({"streaming_native_http_connections": 4},
                                  {"streaming_native_http_subranges": 4},
                                  {"streaming_native_http_connections": 64, "streaming_native_http_subranges": 4}):
                        self.measure("http flags", "A", hub, home, 2, args.batches, latency, flags)
                    if args.with_lerobot and LEROBOT_PYTHON.exists():
                        lerobot_home = self.work / f"lerobot-home-{latency}"
                        for workers in args.workers:
                            self.measure("LeRobot 0.6.1 streaming", "C", hub, lerobot_home, workers,
                                         args.batches, latency)

    def report(self) -> str:
        facts = self.facts
        rows = [r for r in self.rows if not r["error"]]

        def median(values: list[float | None]) -> float | None:
            present = [v for v in values if v is not None]
            return statistics.median(present) if present else None

        local = {w: median([r["samples_per_s"] for r in rows if r["label"].startswith("local r") and r["workers"] == w])
                 for w in self.args.workers}
        local_ttfb = {w: median([r["ttfb_s"] for r in rows if r["label"].startswith("local r") and r["workers"] == w])
                      for w in self.args.workers}
        lines = [
            "# Remote streaming over the loopback Hub (issue 10)",
            "",
            f"Dataset: `{self.root.name}` ({facts['episodes']} episodes, {facts['frames']} frames, "
            f"{len(facts['cameras'])} cameras, payload {facts['payload'] / 1e6:.1f} MB). ACT window, batch "
            f"{self.args.batch_size}, {self.args.batches} batches per run, median of {self.args.runs} runs, spawn workers. "
            f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; the loopback Hub runs "
            "in the harness process, so it shares the two cores with the loader.",
            "",
            f"Command: `{' '.join(['/work/venv/bin/python', 'benchmarks/bench_remote.py', *sys.argv[1:]])}`",
            "",
            "## Throughput and first batch, remote vs local (warm index cache)",
            "",
            "| latency per request | workers | samples/s remote | samples/s local | remote / local | first batch remote s | first batch local s | requests | range reads |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for latency in self.args.latencies:
            for workers in self.args.workers:
                chosen = [r for r in rows if r["label"].startswith("remote r") and r["latency_ms"] == latency
                          and r["workers"] == workers]
                if not chosen:
                    continue
                speed = median([r["samples_per_s"] for r in chosen])
                ratio = speed / local[workers] if speed and local[workers] else None
                lines.append(
                    f"| {latency} ms | {workers} | {_f(speed)} | {_f(local[workers])} | {_f(ratio, '{:.2f}')} | "
                    f"{_f(median([r['ttfb_s'] for r in chosen]), '{:.2f}')} | {_f(local_ttfb[workers], '{:.2f}')} | "
                    f"{int(median([r['requests'] for r in chosen]) or 0)} | {int(median([r['range_reads'] for r in chosen]) or 0)} |"
                )
        lines += ["", "## Cold open (index built over HTTP, metadata fetched), 2 workers", "",
                  "| latency | first batch s | requests |", "|---|---|---|"]
        for r in rows:
            if r.get("cold"):
                lines.append(f"| {r['latency_ms']} ms | {_f(r['ttfb_s'], '{:.2f}')} | {r['requests']} |")
        epoch = [r for r in rows if r["label"] == "full epoch"]
        if epoch:
            e = epoch[0]
            lines += [
                "", f"## One full epoch at {e['latency_ms']} ms, 2 workers", "",
                f"- samples: {e['samples']} of {facts['frames']}; wall {e['wall_s']:.1f} s",
                f"- bytes served for payload (data + videos) / payload: **{e['payload_bytes_sent'] / facts['payload']:.3f}**"
                f" ({e['payload_bytes_sent'] / 1e6:.1f} MB / {facts['payload'] / 1e6:.1f} MB); all bytes incl. metadata and "
                f"redirects: {e['bytes_sent'] / 1e6:.1f} MB",
                f"- requests per episode: **{e['requests'] / facts['episodes']:.1f}** ({e['requests']} requests, "
                f"{e['range_reads']} range reads, {facts['episodes']} episodes)",
            ]
        flag_rows = [r for r in rows if r["label"] == "http flags"]
        if flag_rows:
            base = median([r["samples_per_s"] for r in rows if r["label"].startswith("remote r")
                           and r["latency_ms"] == self.args.epoch_latency and r["workers"] == 2])
            lines += ["", f"## The two HTTP flags at {self.args.epoch_latency} ms, 2 workers", "",
                      "| flags | samples/s | vs defaults | requests |", "|---|---|---|---|",
                      f"| defaults (connections = max_num_shards x subranges, subranges 1) | {_f(base)} | 1.00 | |"]
            for r in flag_rows:
                text = " ".join(f"--dataset.{k}={v}" for k, v in r["flags"].items())
                lines.append(f"| `{text}` | {_f(r['samples_per_s'])} | {_f(r['samples_per_s'] / base if base and r['samples_per_s'] else None, '{:.2f}')} | {r['requests']} |")
        lerobot = [r for r in self.rows if r["loader"] == "C"]
        if lerobot:
            lines += ["", f"## LeRobot 0.6.1 `StreamingLeRobotDataset` over the same loopback Hub ({self.args.epoch_latency} ms)", "",
                      "| workers | samples/s | first batch s | requests | bytes served MB | error |", "|---|---|---|---|---|---|"]
            for r in lerobot:
                lines.append(f"| {r['workers']} | {_f(r['samples_per_s'])} | {_f(r['ttfb_s'], '{:.2f}')} | "
                             f"{r.get('requests')} | {_f((r.get('bytes_sent') or 0) / 1e6)} | {(r['error'] or '')[:80]} |")
        failed = [r for r in self.rows if r["error"]]
        if failed:
            lines += ["", "## Failed runs", ""] + [f"- {r['label']} ({r['loader']}, {r['latency_ms']} ms, "
                                                    f"{r['workers']} workers): {r['error']}" for r in failed]
        return "\n".join(lines) + "\n"

    def plot(self, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [r for r in self.rows if not r["error"] and r["label"].startswith("remote r")]
        local = [r for r in self.rows if not r["error"] and r["label"].startswith("local r")]
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for workers, color in zip(self.args.workers, ("#1f77b4", "#ff7f0e"), strict=False):
            xs = self.args.latencies
            ys = [statistics.median([r["samples_per_s"] for r in rows if r["latency_ms"] == x and r["workers"] == workers]
                                    or [float("nan")]) for x in xs]
            base = statistics.median([r["samples_per_s"] for r in local if r["workers"] == workers] or [float("nan")])
            axes[0].plot(xs, ys, "o-", color=color, label=f"remote, {workers} workers")
            axes[0].axhline(base, color=color, linestyle="--", label=f"local, {workers} workers")
            ttfb = [statistics.median([r["ttfb_s"] for r in rows if r["latency_ms"] == x and r["workers"] == workers]
                                      or [float("nan")]) for x in xs]
            axes[1].plot(xs, ttfb, "o-", color=color, label=f"{workers} workers")
        axes[0].set(xlabel="injected latency per request (ms)", ylabel="samples/s", title="throughput")
        axes[1].set(xlabel="injected latency per request (ms)", ylabel="s", title="time to first batch (warm index)")
        for ax in axes:
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=90)


def _f(value: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if value is None else fmt.format(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=str(DEFAULT_DATASET))
    parser.add_argument("--latencies", type=int, nargs="+", default=[0, 20, 50, 100])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--epoch-latency", type=int, default=50)
    parser.add_argument("--with-lerobot", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--run-timeout", type=float, default=900)
    parser.add_argument("--output", default=str(HERE / "remote_results.md"))
    parser.add_argument("--plot", default=str(HERE / "plots" / "remote.png"))
    args = parser.parse_args(argv)
    bench = Bench(args)
    try:
        bench.run()
    finally:
        (bench.work / "rows.json").write_text(json.dumps(bench.rows, indent=1, default=str))
        Path(args.output).write_text(bench.report())
        bench.plot(Path(args.plot))
        shutil.rmtree(bench.work / "local-home", ignore_errors=True)
        print(f"wrote {args.output} and {args.plot}; raw rows in {bench.work / 'rows.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
