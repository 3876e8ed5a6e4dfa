"""``--help``, ``cache list`` and usage errors answer without importing torch (or the streaming code).

Each command runs in a fresh interpreter, as its console script does, and reports which heavy
modules it imported by the time it returned: a behavioural check of what the start pays for
(torch alone takes seconds to import), not a timing assert.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "torchdata", "pyarrow", "av", "lerobot_nodes.dataset", "lerobot_nodes.sources")
"""Modules none of these commands needs before it has parsed its arguments."""

RUN = """
import contextlib, io, json, sys
from {module} import main
with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
    code = main({argv!r})
print(json.dumps({{"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
                  "heavy": [name for name in {heavy!r} if name in sys.modules]}}))
"""

MAIN = "lerobot_nodes.cli.main"
SIDECAR = "lerobot_nodes.cli.build_sidecar"


def _run(module: str, argv: list[str], tmp_path: Path) -> dict[str, object]:
    code = RUN.format(module=module, argv=argv, heavy=HEAVY)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "module,argv,code,says",
    [
        (MAIN, ["--help"], 0, "stream"),
        (MAIN, ["-h"], 0, "stream"),
        (MAIN, ["stream", "--help"], 0, "--dataset.streaming_episode_pool_size"),
        (MAIN, ["inspect", "--help"], 0, "--dataset.revision"),
        (MAIN, ["cache", "--help"], 0, "list"),
        (MAIN, ["demo", "--help"], 0, "--samples"),
        (MAIN, ["strem"], 2, "did you mean stream?"),
        (MAIN, ["stream", "--dataset.rooot=/data"], 2, "did you mean --dataset.root?"),
        (MAIN, ["stream", "--batch-size=4"], 2, "did you mean --batch_size?"),
        (MAIN, ["stream", "--steps=0"], 2, "--steps must be >= 1"),
        (MAIN, ["cache", "clear"], 2, "one of the arguments"),
        (SIDECAR, ["--help"], 0, "--data-root"),
        (SIDECAR, [], 2, "the following arguments are required: --output"),
        (SIDECAR, ["--output=x.npz", "--workers=0"], 2, "--workers must be >= 1"),
    ],
)
def test_help_and_usage_errors_import_no_torch(
    module: str, argv: list[str], code: int, says: str, tmp_path: Path
) -> None:
    outcome = _run(module, argv, tmp_path)
    assert outcome["code"] == code, outcome
    assert says in f"{outcome['stdout']}{outcome['stderr']}", outcome
    assert outcome["heavy"] == [], f"{argv} imported {outcome['heavy']} before answering"


def test_cache_list_imports_no_torch(tmp_path: Path) -> None:
    outcome = _run(MAIN, ["cache", "list"], tmp_path)
    assert outcome["code"] == 0, outcome
    # The cache layout and its locks only: the mp4 and sidecar packages import their decoders lazily.
    assert "torch" not in outcome["heavy"] and "av" not in outcome["heavy"], outcome


def test_the_package_imports_its_public_names_on_first_use(tmp_path: Path) -> None:
    """``import lerobot_nodes`` (which every ``lerobot_nodes.cli`` import runs first) is light; the
    public names still import, the lazy ones on first use."""
    code = (
        "import sys, lerobot_nodes\n"
        "light = 'torch' not in sys.modules and 'lerobot_nodes.dataset' not in sys.modules\n"
        "from lerobot_nodes import StreamingLeRobotDataset, SourceAuthError, open_source\n"
        "missing = [name for name in lerobot_nodes.__all__ if not hasattr(lerobot_nodes, name)]\n"
        "print(light, StreamingLeRobotDataset.__module__, 'torch' in sys.modules, missing,\n"
        "      set(lerobot_nodes.__all__) <= set(dir(lerobot_nodes)))\n"
        "try:\n"
        "    lerobot_nodes.NoSuchName\n"
        "except AttributeError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "True lerobot_nodes.dataset True [] True",
        "module 'lerobot_nodes' has no attribute 'NoSuchName'",
    ]
