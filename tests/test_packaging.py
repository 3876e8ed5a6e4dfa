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
