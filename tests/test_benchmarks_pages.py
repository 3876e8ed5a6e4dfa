"""benchmarks/ as a product: the suites' presets, and the pages' links point at files that exist.

Nothing is measured here (speed is never asserted in tests); the harness is only parsed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _parsed(*argv: str) -> dict:
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from benchmarks import run\n"
        "args = run.parse_args(sys.argv[1:])\n"
        "print(json.dumps({k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_full_suite_is_the_matrix_of_the_speed_page() -> None:
    args = _parsed("--suite", "full")
    assert args["loaders"] == ["A", "D"]
    assert args["datasets"] == ["small", "large", "long-gop"]
    assert args["windows"] == ["none", "act", "diffusion"]
    assert args["workers"] == [0, 2]
    assert (args["runs"], args["batches_small"], args["batches_large"], args["epoch_check"]) == (
        3,
        20,
        20,
        False,
    )
    assert args["report_out"] == str(BENCHMARKS / "speed_results.md")


def test_explicit_options_override_the_suite() -> None:
    args = _parsed("--suite", "quick", "--loaders", "A", "--runs", "2")
    assert args["loaders"] == ["A"] and args["runs"] == 2
    assert args["datasets"] == ["small"] and args["workers"] == [0, 2]
    assert args["report_out"] is None  # quick writes inside its run directory
    assert _parsed("--quick")["suite"] == "quick"


def test_results_page_is_never_the_harness_output() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--report-out",
            "benchmarks/RESULTS.md",
            "--report-only",
            "x",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "written by hand" in out.stderr


def test_pages_link_to_files_that_exist() -> None:
    pages = sorted(BENCHMARKS.glob("*.md"))
    assert BENCHMARKS / "RESULTS.md" in pages
    missing = [
        f"{page.name}: {target}"
        for page in pages
        for target in LINK.findall(page.read_text())
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert missing == []


def test_no_dated_result_pages() -> None:
    """Older passes live in git history, not in per-pass pages beside RESULTS.md."""
    dated = [p.name for p in BENCHMARKS.rglob("*") if re.search(r"issue\d+_|session\d|\d{8}-\d{6}", p.name)]
    assert dated == []
