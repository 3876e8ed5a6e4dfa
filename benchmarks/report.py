"""Write a suite's page and its plots from harness runs (``benchmarks/run.py``).

The page lands where ``--report-out`` says (``--suite full``: ``benchmarks/speed_results.md``), its
plots beside it in ``plots/<page name without _results>/`` (``benchmarks/plots/speed/``).
``benchmarks/RESULTS.md`` is hand-written around these pages and never written here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LOADER_ORDER = ("A", "B", "C", "D")
LOADER_COLORS = {"A": "#1f77b4", "B": "#ff7f0e", "C": "#2ca02c", "D": "#d62728"}
WINDOW_ORDER = ("none", "act", "diffusion")
WINDOW_TEXT = {
    "none": "no window",
    "act": "ACT (action 50 future, cams [0])",
    "diffusion": "Diffusion (obs [-1,0], action 16)",
}

# (metric, column title, format, plot title, lower is better)
COLUMNS = [
    ("samples_per_s", "samples/s", "{:.1f}", "samples/s (steady state)", False),
    ("decode_fraction", "% decode limit", "{:.1%}", "fraction of the decode limit (all cores)", False),
    ("cpu_ms_per_sample", "CPU ms/sample", "{:.1f}", "", True),
    ("decode_cpu_share", "decode CPU share", "{:.0%}", "", False),
    ("ttfb_s", "first batch s", "{:.2f}", "time to first batch (s)", True),
    ("peak_rss_mb", "peak RSS MB", "{:.0f}", "", True),
    ("peak_pss_mb", "peak PSS MB", "{:.0f}", "peak PSS, process + workers (MB)", True),
    ("pss_growth_mb", "PSS growth MB", "{:.0f}", "", True),
    ("dataset_read_mb", "dataset read MB", "{:.1f}", "", True),
    (
        "dataset_read_per_payload",
        "dataset read / payload",
        "{:.2f}",
        "dataset bytes read / payload of delivered samples",
        True,
    ),
    (
        "steady_rchar_per_payload",
        "rchar / payload",
        "{:.1f}",
        "read() bytes / payload of delivered samples",
        True,
    ),
    ("decoded_per_delivered", "decoded / delivered", "{:.2f}", "decoded frames per delivered frame", True),
    ("distinct_episodes", "episodes / batch", "{:.1f}", "", False),
    ("uniform_distinct_episodes", "episodes / batch, uniform", "{:.1f}", "", False),
    ("pairs_within_5_pct", "pairs within 5 frames %", "{:.2f}", "", True),
    ("uniform_pairs_within_5_pct", "within 5, uniform %", "{:.2f}", "", True),
    ("wait_p95_ms", "wait p95 ms", "{:.0f}", "", True),
    ("wait_p99_ms", "wait p99 ms", "{:.0f}", "batch wait p99 (ms)", True),
    ("other_cores", "other load (cores)", "{:.2f}", "", True),
]
PLOTTED = [c for c in COLUMNS if c[3]]
LOG_SCALE = {"steady_rchar_per_payload"}


def _value(row: dict, metric: str, stat: str = "median") -> float | None:
    entry = row["metrics"].get(metric)
    return None if entry is None else entry[stat]


def _fmt(value: float | None, pattern: str) -> str:
    return "–" if value is None else pattern.format(value)


def decode_limit_fps(limit: dict) -> float | None:
    """All-core decode limit: one thread's frames per CPU-second times the cores (idle machine)."""
    return limit.get("cpu_limit_fps") or limit.get("per_core", {}).get("fps")


def _add_decode_fraction(summary: list[dict], meta: dict) -> None:
    for row in summary:
        limit = meta["decode_limits"].get(row["dataset"], {})
        all_cores = decode_limit_fps(limit)
        one_cpu = limit.get("single", {}).get("fps_per_cpu_second")
        sps = row["metrics"].get("samples_per_s")
        fps = row["metrics"].get("frames_per_sample")
        cpu = row["metrics"].get("cpu_ms_per_sample")
        if all_cores and sps and fps:
            row["metrics"]["decode_fraction"] = {
                k: sps[k] * fps["median"] / all_cores for k in ("median", "min", "max")
            }
        if one_cpu and cpu and fps:
            decode_ms = 1000 * fps["median"] / one_cpu
            # min/max swap: more CPU per sample is a smaller share
            row["metrics"]["decode_cpu_share"] = {
                "median": decode_ms / cpu["median"],
                "min": decode_ms / cpu["max"],
                "max": decode_ms / cpu["min"],
            }


def _loader_label(row: dict) -> str:
    return f"{row['loader']}{' (placeholder)' if row['placeholder'] else ''}"


def _table(rows: list[dict]) -> list[str]:
    head = ["window", "workers", "loader", *[c[1] for c in COLUMNS], "runs"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [WINDOW_TEXT[row["window"]], str(row["num_workers"]), _loader_label(row)]
        cells += [_fmt(_value(row, c[0]), c[2]) for c in COLUMNS]
        runs = str(row["runs"]) + (f" ({row['failed']} failed)" if row["failed"] else "")
        out.append("| " + " | ".join(cells + [runs]) + " |")
    return out


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(
        rows,
        key=lambda r: (WINDOW_ORDER.index(r["window"]), r["num_workers"], LOADER_ORDER.index(r["loader"])),
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _targets(summary: list[dict]) -> list[str]:
    """The issue's target ratios, for loader A, per dataset and worker count."""
    fixed = [r for r in summary if r["mode"] == "fixed"]
    index = {(r["dataset"], r["window"], r["num_workers"], r["loader"]): r for r in fixed}
    epoch = {
        (r["dataset"], r["num_workers"]): r for r in summary if r["mode"] == "epoch" and r["loader"] == "A"
    }
    lines = [
        "| dataset | workers | A/B samples/s, ACT (>= 4) | A % of decode limit, ACT (>= 70 %) | "
        "A decoded/delivered, ACT (<= 1.3) | A dataset read / payload, full epoch, no window (<= 1.05) | "
        "A/C first batch, ACT (<= 0.2) | A/C peak PSS, ACT (<= 0.33) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for dataset, workers in sorted({(r["dataset"], r["num_workers"]) for r in fixed}):
        a = index.get((dataset, "act", workers, "A"))
        b = index.get((dataset, "act", workers, "B"))
        c = index.get((dataset, "act", workers, "C"))
        if a is None:
            continue
        cells = [
            _fmt(_ratio(_value(a, "samples_per_s"), b and _value(b, "samples_per_s")), "{:.2f}x"),
            _fmt(_value(a, "decode_fraction"), "{:.1%}"),
            _fmt(_value(a, "decoded_per_delivered"), "{:.2f}"),
            _fmt(_value(epoch[(dataset, workers)], "dataset_read_per_payload"), "{:.2f}")
            if (dataset, workers) in epoch
            else "n/a (epoch check: small, 2 workers)",
            _fmt(_ratio(_value(a, "ttfb_s"), c and _value(c, "ttfb_s")), "{:.2f}"),
            _fmt(_ratio(_value(a, "peak_pss_mb"), c and _value(c, "peak_pss_mb")), "{:.2f}"),
        ]
        lines.append(f"| {dataset} | {workers} | " + " | ".join(cells) + " |")
    return lines


def _sps(value: float | None) -> str:
    return "–" if value is None else (f"{value:.0f}" if value >= 100 else f"{value:.3g}")


def _bold(text: str, met: bool) -> str:
    return f"**{text}**" if met else text


def versus_d(summary: list[dict], dataset_order: list[str]) -> list[str]:
    """A against D per configuration, with the targets of issue 12 in bold where met: A/D samples/s
    >= 3, >= 70 % of the decode limit with workers, decoded/delivered <= 1.3, first batch <= 1/3 of
    D's, PSS growth beyond the imports <= D's."""
    fixed = [r for r in summary if r["mode"] == "fixed"]
    index = {(r["dataset"], r["window"], r["num_workers"], r["loader"]): r for r in fixed}
    lines = [
        "| dataset | window | workers | A samples/s | D samples/s | A/D (>= 3) | % decode limit, A (>= 70 % "
        "with workers) | decoded / delivered, A / D (<= 1.3) | first batch A / D s (A/D <= 1/3) | "
        "PSS growth A / D MB (A <= D) | CPU ms/sample A / D |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset in dataset_order:
        first = True
        for window in WINDOW_ORDER:
            for workers in sorted({r["num_workers"] for r in fixed}):
                a = index.get((dataset, window, workers, "A"))
                d = index.get((dataset, window, workers, "D"))
                if a is None or d is None:
                    continue
                a_sps, d_sps = _value(a, "samples_per_s"), _value(d, "samples_per_s")
                speed = _ratio(a_sps, d_sps)
                limit = _value(a, "decode_fraction")
                a_dec, d_dec = _value(a, "decoded_per_delivered"), _value(d, "decoded_per_delivered")
                a_first, d_first = _value(a, "ttfb_s"), _value(d, "ttfb_s")
                first_ratio = _ratio(a_first, d_first)
                a_pss, d_pss = _value(a, "pss_growth_mb"), _value(d, "pss_growth_mb")
                cells = [
                    dataset if first else "",
                    WINDOW_TEXT[window].split(" (")[0],
                    str(workers),
                    _sps(a_sps),
                    _sps(d_sps),
                    _bold(_fmt(speed, "{:.2f}x"), speed is not None and speed >= 3),
                    _bold(_fmt(limit and 100 * limit, "{:.1f} %"), bool(workers and limit and limit >= 0.7)),
                    _bold(_fmt(a_dec, "{:.2f}"), a_dec is not None and a_dec <= 1.3)
                    + " / "
                    + _fmt(d_dec, "{:.2f}"),
                    f"{_fmt(a_first, '{:.2f}')} / {_fmt(d_first, '{:.2f}')} ("
                    + _bold(_fmt(first_ratio, "{:.2f}"), first_ratio is not None and first_ratio <= 1 / 3)
                    + ")",
                    _bold(_fmt(a_pss, "{:.0f}"), a_pss is not None and d_pss is not None and a_pss <= d_pss)
                    + " / "
                    + _fmt(d_pss, "{:.0f}"),
                    f"{_fmt(_value(a, 'cpu_ms_per_sample'), '{:.1f}')} / "
                    f"{_fmt(_value(d, 'cpu_ms_per_sample'), '{:.1f}')}",
                ]
                lines.append("| " + " | ".join(cells) + " |")
                first = False
    return lines


def plot_dir_of(filename: str) -> Path:
    """Plots of a page, relative to it: ``plots/<page name without _results>/``."""
    stem = Path(filename).stem
    return Path("plots") / (stem[: -len("_results")] if stem.endswith("_results") else stem)


def _plots(summary: list[dict], out_dir: Path, preliminary: bool) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    fixed = [r for r in summary if r["mode"] == "fixed"]
    for dataset in sorted({r["dataset"] for r in fixed}):
        rows = [r for r in fixed if r["dataset"] == dataset]
        configs = sorted(
            {(r["window"], r["num_workers"]) for r in rows}, key=lambda k: (WINDOW_ORDER.index(k[0]), k[1])
        )
        loaders = [x for x in LOADER_ORDER if any(r["loader"] == x for r in rows)]
        placeholder = {r["loader"] for r in rows if r["placeholder"]}
        fig, axes = plt.subplots(2, 4, figsize=(20, 8.5))
        for ax, (metric, _col, _fmt_s, title, lower) in zip(axes.flat, PLOTTED, strict=False):
            width = 0.8 / max(1, len(loaders))
            for j, loader in enumerate(loaders):
                xs, ys, lo, hi = [], [], [], []
                for i, (window, workers) in enumerate(configs):
                    row = next(
                        (
                            r
                            for r in rows
                            if (r["window"], r["num_workers"], r["loader"]) == (window, workers, loader)
                        ),
                        None,
                    )
                    value = None if row is None else _value(row, metric)
                    if value is None:
                        continue
                    xs.append(i + (j - (len(loaders) - 1) / 2) * width)
                    ys.append(value)
                    lo.append(value - _value(row, metric, "min"))
                    hi.append(_value(row, metric, "max") - value)
                label = loader + (" (placeholder)" if loader in placeholder else "")
                ax.bar(
                    xs,
                    ys,
                    width,
                    yerr=[lo, hi],
                    capsize=2,
                    label=label,
                    color=LOADER_COLORS[loader],
                    hatch="//" if loader in placeholder else None,
                    edgecolor="white",
                )
            ax.set_xticks(range(len(configs)))
            ax.set_xticklabels([f"{w}\nw={n}" for w, n in configs], fontsize=8)
            ax.set_title(title + (" (lower is better)" if lower else " (higher is better)"), fontsize=9)
            ax.grid(axis="y", alpha=0.3)
            if metric == "decoded_per_delivered":
                ax.axhline(1.3, color="red", lw=0.8, ls="--", label="target 1.3")
            elif metric == "decode_fraction":
                ax.axhline(0.7, color="red", lw=0.8, ls="--", label="target 70 %")
            elif metric in LOG_SCALE:
                ax.set_yscale("log")
        axes.flat[0].legend(fontsize=8)
        suptitle = f"{dataset}: median of runs (bars: min-max)"
        if preliminary:
            placeholder = any(r["placeholder"] for r in summary if r["loader"] == "A")
            suptitle = (
                "PRELIMINARY — "
                + ("A is a placeholder — " if placeholder else "quick pass, noisy — ")
                + suptitle
            )
        fig.suptitle(suptitle, fontsize=12)
        fig.tight_layout()
        path = out_dir / f"{dataset}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def _shown(path: Path, cwd: str | None) -> str:
    """``path`` relative to the directory the harness ran in, when it lies inside it."""
    try:
        return path.resolve().relative_to(Path(cwd or "/").resolve()).as_posix()
    except ValueError:
        return str(path)


def write(
    meta: dict[str, Any],
    records: list[dict],
    summary: list[dict],
    bench_dir: Path,
    filename: str,
) -> Path:
    _add_decode_fraction(summary, meta)
    preliminary = any(r["placeholder"] for r in summary if r["loader"] == "A") or meta["args"].get("quick")
    plot_dir = plot_dir_of(filename)
    try:
        plots = _plots(summary, bench_dir / plot_dir, preliminary)
    except ImportError:  # matplotlib is not a dependency of the package
        plots = None
    args = meta["args"]
    machine = meta["machine"]
    present = [x for x in LOADER_ORDER if any(r["loader"] == x for r in summary)]
    others = [x for x in present if x != "A"]
    title = "# Speed: loader A (lerobot_nodes)" + (
        " against " + ", ".join(f"{x}: {meta['drivers'][x]['name']}" for x in others) if others else ""
    )
    lines: list[str] = [title, ""]
    if preliminary:
        lines += [
            "> **PRELIMINARY.** "
            + (
                "Loader A is a PLACEHOLDER: this project's map-style reader (`MapStyleLeRobotDataset` + "
                "`DataLoader`), not the streaming dataset of issue 6, which does not exist yet. The A "
                "figures and every A/B or A/C ratio below say nothing about the streaming design. "
                if any(r["placeholder"] for r in summary)
                else ""
            )
            + (
                "This was a `--suite quick` pass (one repetition, few batches): it proves the harness end to end; "
                "its numbers are noisy."
                if args.get("quick")
                else ""
            ),
            "",
        ]
    runs = meta.get("runs") or [{"run_id": meta["run_id"], "command": meta["command"], "args": args}]
    results_dir = meta.get("results_dir", "/work/bench-data/results")
    walls = meta.get("matrix_wall_s_each") or [meta.get("matrix_wall_s")]
    lines += [
        f"{meta['started']} to {meta.get('finished', '?')}; command(s), run from `{meta.get('cwd', '/work/main')}`:",
        "",
    ]
    for run, wall in zip(runs, walls, strict=False):
        took = f" ({wall / 60:.1f} min)" if wall else ""
        lines += [f"Run `{run['run_id']}`{took}:", "", "```", run["command"], "```", ""]
    lines += [
        f"Loaders: A = {meta['drivers']['A']['name']} (`benchmarks/drivers/{meta['drivers']['A']['script']}`, "
        f"`{meta['drivers']['A']['python']}`), B = {meta['drivers']['B']['name']}, C = {meta['drivers']['C']['name']} "
        f"(B and C under `{meta['drivers']['B']['python']}`)"
        + (
            f", D = {meta['drivers']['D']['name']} (`benchmarks/drivers/{meta['drivers']['D']['script']}`, "
            f"`{meta['drivers']['D']['python']}`)"
            if "D" in meta["drivers"]
            else ""
        )
        + ". Labels reported by the drivers:",
        "",
    ]
    for loader in LOADER_ORDER:
        label = next((r["label"] for r in summary if r["loader"] == loader and r["label"]), None)
        if label:
            lines.append(f"- {loader}: {label}")
    lines += [
        "",
        f"Settings: batch size {args['batch_size']}, DataLoader `prefetch_factor={args['prefetch_factor']}`, "
        f"`persistent_workers=True`, `multiprocessing_context={args['mp_context']!r}` (LeRobot training's "
        f"defaults), seed {args['seed']}, {args['runs']} repetition(s) per configuration (median shown), "
        f"{args['batches_small']} batches per run on the small dataset and {args['batches_large']} on the "
        f"generated one; page cache of the dataset files dropped before every run; one unmeasured warm-up per "
        f"dataset and loader.",
        "",
        "## Datasets",
        "",
        "| dataset | episodes | frames | cameras | payload MB (video + data) | files MB |",
        "|---|---|---|---|---|---|",
    ]
    for d in meta["datasets"]:
        lines.append(
            f"| {d['name']} (`{d['root']}`) | {d['total_episodes']} | {d['total_frames']} | {d['resolution']} | "
            f"{d['payload_bytes'] / 2**20:.1f} ({d['video_payload_bytes'] / 2**20:.1f} + "
            f"{d['data_payload_bytes'] / 2**20:.1f}) | {d['file_bytes'] / 2**20:.1f} |"
        )
    lines += [
        "",
        "## Decode limit (`benchmarks/decode_limit.py`)",
        "",
        "Sequential PyAV decode from the first frame, `to_ndarray(format='rgb24')` per frame.",
        "",
        "| dataset | decoder | 1 thread fps (wall) | 1 thread frames per CPU-s | limit: all cores, idle (fps) | "
        "one process per core, measured (fps) | FFmpeg auto threads (fps) | load avg during |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, limit in meta["decode_limits"].items():
        lines.append(
            f"| {name} | {limit['codec']} (PyAV {limit['pyav']}) | {limit['single']['fps']:.0f} | "
            f"{_fmt(limit['single'].get('fps_per_cpu_second'), '{:.0f}')} | "
            f"{_fmt(decode_limit_fps(limit), '{:.0f}')} | "
            f"{limit['per_core']['fps']:.0f} ({limit['per_core']['processes']} processes) | "
            f"{limit['auto_threads']['fps']:.0f} | {' '.join(limit.get('loadavg', []))} |"
        )
    lines += [
        "",
        "The limit is one decoder thread's frames per CPU-second times the cores: what the machine "
        "would do idle, unaffected by other programs running at the same time (the wall-clock figures "
        "are). `% decode limit` = samples/s × frames per sample ÷ that limit. `decode CPU share` = the "
        "CPU that pure decoding of a sample's frames costs ÷ the CPU the loader spent per sample "
        "(process + workers, steady state): it does not depend on how loaded the machine was.",
        "",
        "## Results",
        "",
        "Medians over repetitions. samples/s is steady state (batches 2..N over the time from batch 1 to N); "
        "first batch is measured from just before the dataset is constructed. Memory is summed over the "
        "loader process and its DataLoader workers (RSS double counts shared pages, PSS does not); "
        "`PSS growth` is that peak minus the driver's PSS after its imports, before the dataset exists. "
        "`dataset read` is what the run read from storage of the dataset's files (plus LeRobot's HF "
        "`datasets` Arrow cache, for B): their bytes in the page cache after the run, the files having "
        "been evicted before it (`fincore`; readahead included, library loading of spawned workers "
        "excluded). `dataset read / payload` divides it by the payload share of the samples delivered "
        "(samples × payload bytes per frame); in these short runs it mostly shows how much a loader "
        "reads before and beyond what it delivers (readahead, prefetch, whole files), the full-epoch "
        "table below gives the per-epoch figure. `rchar / payload` is the steady-state (batch 1 to N) "
        "delta of bytes returned by `read()` calls, cached or not (memory-mapped reads are not in it), "
        "over the payload share of the samples delivered in that span: what a loader would pull over "
        "a network without a local cache. `decoded / delivered` is frames returned by "
        "`avcodec_receive_frame` (all processes) per video frame delivered, counted over a few extra "
        "batches pulled after the timed ones between two points where the loader is idle (all "
        "prefetched work done), so prefetching does not skew it. "
        "`other load` is the average number of cores busy with programs other than the loader during "
        "the run (this machine is shared with other developers' test suites).",
        "",
    ]
    for dataset in [d["name"] for d in meta["datasets"]]:
        rows = _sorted([r for r in summary if r["dataset"] == dataset and r["mode"] == "fixed"])
        if not rows:
            continue
        lines += [f"### {dataset}", "", *_table(rows), ""]
        plot = bench_dir / plot_dir / f"{dataset}.png"
        if plots is None:
            lines += [
                "(No plot: matplotlib is not installed; `pip install matplotlib` and `--report-only`.)",
                "",
            ]
        elif plot in plots:
            lines += [f"![{dataset}]({(plot_dir / plot.name).as_posix()})", ""]
    epoch_rows = _sorted([r for r in summary if r["mode"] == "epoch"])
    if epoch_rows:
        lines += [
            "### One full epoch (small dataset, no window, 2 workers)",
            "",
            "Over a whole epoch nothing is left in flight, so whole-run ratios are exact:",
            "",
            "| loader | samples | samples/s | dataset read MB | dataset read / payload | rchar / payload "
            "(after batch 1) | decoded / delivered | peak PSS MB |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in epoch_rows:
            lines.append(
                f"| {_loader_label(row)} | {_fmt(_value(row, 'samples'), '{:.0f}')} | "
                f"{_fmt(_value(row, 'samples_per_s'), '{:.1f}')} | "
                f"{_fmt(_value(row, 'dataset_read_mb'), '{:.1f}')} | "
                f"{_fmt(_value(row, 'dataset_read_per_payload'), '{:.2f}')} | "
                f"{_fmt(_value(row, 'steady_rchar_per_payload'), '{:.1f}')} | "
                f"{_fmt(_value(row, 'decoded_per_delivered_total'), '{:.2f}')} | "
                f"{_fmt(_value(row, 'peak_pss_mb'), '{:.0f}')} |"
            )
        lines.append("")
    if "D" in present:
        lines += [
            "## A against D (targets of issue 12 in bold where met)",
            "",
            *versus_d(summary, [d["name"] for d in meta["datasets"]]),
            "",
        ]
    if "B" in present or "C" in present:
        lines += ["## Targets of issue 7 (loader A against B and C)", ""]
        if preliminary:
            lines += ["Preliminary: one repetition of few batches, so these ratios are not the verdict.", ""]
        lines += [*_targets(summary), ""]
    failures = [r for r in records if r["status"] != "ok"]
    if failures:
        lines += ["## Failed runs", ""]
        for r in failures:
            tail = " / ".join(r.get("error_tail", [])[-3:])
            lines.append(
                f"- {r['loader']} {r['dataset']} {r['window']} w{r['num_workers']} "
                f"{'warm-up' if r['warmup'] else 'rep ' + str(r['rep'])}: {r.get('error')} — `{tail[:400]}`"
            )
        lines.append("")
    shapes = {}
    for r in summary:
        if r["shapes"] and r["mode"] == "fixed":
            shapes.setdefault((r["dataset"], r["window"]), {})[r["loader"]] = r["shapes"]
    lines += ["## Camera tensor shapes of the first batch (sanity check: same work for every loader)", ""]
    for (dataset, window), by_loader in sorted(shapes.items()):
        cells = "; ".join(
            f"{loader}: " + ", ".join(f"{k.split('.')[-1]} {v}" for k, v in s.items())
            for loader, s in sorted(by_loader.items())
        )
        lines.append(f"- {dataset} / {window}: {cells}")
    lines += [
        "",
        "## Machine",
        "",
        "```",
        machine["lscpu"],
        "",
        machine["memory"],
        "",
        machine["disk"],
        "```",
        "",
        f"- kernel: {machine['kernel']}",
        f"- project venv (`{meta['drivers']['A']['python']}`): {machine['project_env']}",
        f"- LeRobot venv (`{meta['drivers']['B']['python']}`): {machine['lerobot_env']}",
        *(
            [
                f"- LeRobot episode-streaming venv (`{meta['drivers']['D']['python']}`): {machine['lerobot_episode_env']}"
            ]
            if "lerobot_episode_env" in machine
            else []
        ),
        f"- system FFmpeg (torchcodec): {' '.join(machine['ffmpeg'])}",
        "",
        "Raw per-run records: `raw.jsonl` and `meta.json` in "
        + ", ".join(f"`{results_dir}/{r['run_id']}/`" for r in runs)
        + " (driver logs in `logs/`). Rebuild this page with `python -m benchmarks.run --report-only "
        + " ".join(f"{results_dir}/{r['run_id']}" for r in runs)
        + f" --report-out {_shown(bench_dir / filename, meta.get('cwd'))}`.",
        "",
    ]
    out = bench_dir / filename
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    return out
