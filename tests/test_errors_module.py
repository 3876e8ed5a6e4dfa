"""Every error class of the package lives in ``lerobot_nodes.errors`` and is exported from the root."""

from __future__ import annotations

import ast
from pathlib import Path

import lerobot_nodes
from lerobot_nodes import errors

PACKAGE_ROOT = Path(lerobot_nodes.__file__).parent
PRIVATE_SIGNALS = {"_Retry", "_Redirected", "Stopped"}
"""Control-flow exceptions that never leave their module (``Stopped``: a signal, caught by the CLI's main)."""
TEST_SERVER = {"HttpError"}
"""The loopback Hub's internal route error (lerobot_nodes.testing), never raised to users."""


def _exception_classes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(isinstance(base, ast.Name) and (base.id.endswith(("Error", "Exception")) or base.id == "Exception")
                for base in node.bases)
    ]


def test_error_classes_are_defined_in_the_errors_module_only():
    stray = {
        f"{path.relative_to(PACKAGE_ROOT)}: {name}"
        for path in PACKAGE_ROOT.rglob("*.py")
        if path.name != "errors.py"
        for name in _exception_classes(path)
        if name not in PRIVATE_SIGNALS | TEST_SERVER
    }
    assert not stray


def test_every_public_error_is_exported_from_the_package_root():
    public = {name for name in _exception_classes(PACKAGE_ROOT / "errors.py") if not name.startswith("_")}
    assert public <= set(lerobot_nodes.__all__), sorted(public - set(lerobot_nodes.__all__))
    for name in public:
        assert issubclass(getattr(errors, name), errors.LeRobotNodesError)
