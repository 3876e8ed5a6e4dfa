"""What ``pip install`` gives a user: every subpackage, and ``graphs/`` as ``lerobot_nodes.graphs``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import lerobot_nodes

REPOSITORY = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_for_installation():
    listed = set(tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    source = REPOSITORY / "src"
    present = {".".join(p.parent.relative_to(source).parts) for p in (source / "lerobot_nodes").rglob("__init__.py")}
    assert present | {"lerobot_nodes.graphs"} == listed


def test_graphs_import_outside_the_repository(tmp_path):
    code = "import lerobot_nodes.graphs as g; print(g.streaming_graph.__module__)"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "lerobot_nodes.graphs.default"
    assert Path(lerobot_nodes.__file__).parent.name == "lerobot_nodes"


def test_ci_runs_the_readme_test_command_verbatim():
    readme = (REPOSITORY / "README.md").read_text()
    ci = (REPOSITORY / ".ci" / "run").read_text()
    commands = [line for line in readme.splitlines() if "python -m pytest" in line and line.startswith("pip install")]
    assert len(commands) == 1, commands
    assert commands[0] in ci.splitlines()
    for constraints in (part for part in commands[0].split() if part.endswith(".txt")):
        assert (REPOSITORY / constraints).is_file(), constraints
