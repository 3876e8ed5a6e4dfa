#!/usr/bin/env bash
# A Python 3.12 venv with LeRobot 0.6.1's trainer (lerobot[training]: accelerate, wandb) and this
# repository installed editable, for `lerobot-nodes train` and tests/lerobot_train. Idempotent: a
# second run only checks. Prints the line to export for the tests.
#
#   bash scripts/setup_lerobot_train_venv.sh                 # venv at /work/lerobot-train-venv
#   LEROBOT_TRAIN_VENV=/elsewhere bash scripts/setup_lerobot_train_venv.sh
#   export LEROBOT_NODES_LEROBOT_PYTHON=/work/lerobot-train-venv/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${LEROBOT_TRAIN_VENV:-/work/lerobot-train-venv}"
LEROBOT_VERSION="0.6.1"

# LeRobot 0.6.1 needs Python >= 3.12; pyenv has one here.
if [[ -z "${PY312:-}" ]]; then
    PY312="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.* 2>/dev/null | sort -V | tail -n 1)/bin/python"
fi
if [[ ! -x "$PY312" ]]; then
    PY312="$(command -v python3.12 || true)"
fi
if [[ -z "$PY312" || ! -x "$PY312" ]]; then
    echo "no Python 3.12 found (pyenv versions/3.12.* or python3.12 on PATH); set PY312=/path/to/python3.12" >&2
    exit 1
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating $VENV with $PY312"
    "$PY312" -m venv "$VENV"
fi

check() {
    "$VENV/bin/python" - "$LEROBOT_VERSION" <<'PY'
import importlib.metadata as md
import sys

assert md.version("lerobot") == sys.argv[1], md.version("lerobot")
import accelerate  # noqa: F401
import torchdata  # noqa: F401
import lerobot.scripts.lerobot_train  # noqa: F401
from lerobot_nodes.cli.lerobot_train import check_lerobot

check_lerobot()
print(f"lerobot {md.version('lerobot')}, accelerate {md.version('accelerate')}, torch {md.version('torch')}, "
      f"torchdata {md.version('torchdata')}, lerobot-nodes {md.version('lerobot-nodes')}")
PY
}

if check 2>/dev/null; then
    echo "$VENV is ready"
else
    started=$(date +%s)
    # PyPI has no CPU-only torch for Linux x86_64: 'torch<2.12' (what LeRobot 0.6.1 accepts)
    # resolves to torch 2.11 with its CUDA libraries; it trains on CPU all the same.
    "$VENV/bin/pip" install -q "lerobot[training]==${LEROBOT_VERSION}" 'torch<2.12' 'torchdata>=0.11'
    "$VENV/bin/pip" install -q --no-deps -e .
    echo "installed in $(( $(date +%s) - started )) s"
    check
fi
echo "export LEROBOT_NODES_LEROBOT_PYTHON=$VENV/bin/python"
