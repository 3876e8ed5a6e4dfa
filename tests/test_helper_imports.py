"""One import convention for test helpers: every test folder is a package, and a test imports
the helpers beside it relatively (``from .helpers import ...``), never through ``sys.path``."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _test_folders() -> list[Path]:
    return sorted({path.parent for path in TESTS.rglob("test_*.py")} - {TESTS})


def test_every_test_folder_is_a_package():
    assert [str(folder.relative_to(TESTS)) for folder in _test_folders() if not (folder / "__init__.py").exists()] == []


def test_helpers_beside_a_test_are_imported_relatively():
    absolute = []
    for folder in [TESTS, *_test_folders()]:
        helpers = {path.stem for path in folder.glob("*.py")}
        for path in folder.glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                absolute += [f"{path.relative_to(TESTS)}: {name}" for name in names if name.split(".")[0] in helpers]
    assert absolute == []
