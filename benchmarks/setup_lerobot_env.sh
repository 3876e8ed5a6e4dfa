#!/usr/bin/env bash
# Set up LeRobot 0.6.1 in its own venv for the benchmarks (loaders B and C). Idempotent: a second
# run only checks. See benchmarks/README.md for what this does and why.
#
#   bash benchmarks/setup_lerobot_env.sh            # venv at /work/lerobot-venv
#   LEROBOT_VENV=/elsewhere bash benchmarks/setup_lerobot_env.sh
set -euo pipefail

VENV="${LEROBOT_VENV:-/work/lerobot-venv}"
LEROBOT_VERSION="0.6.1"

# LeRobot 0.6.1 needs Python >= 3.12; pyenv has one here (3.12.1 when this was written).
if [[ -z "${PY312:-}" ]]; then
    PY312="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.* 2>/dev/null | sort -V | tail -n 1)/bin/python"
fi
if [[ ! -x "$PY312" ]]; then
    echo "no Python 3.12 found (looked in \$PYENV_ROOT/versions/3.12.*); set PY312=/path/to/python3.12" >&2
    exit 1
fi

# LeRobot's StreamingLeRobotDataset always decodes with torchcodec, whose wheel has no FFmpeg of
# its own: it loads the system's shared libraries (Debian 12: FFmpeg 5.1, with libdav1d for AV1).
if ! ldconfig -p | grep -q 'libavcodec\.so\.59'; then
    echo "installing Debian's ffmpeg (shared FFmpeg libraries for torchcodec)"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ffmpeg
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating $VENV with $PY312"
    "$PY312" -m venv "$VENV"
fi

check() {
    "$VENV/bin/python" - "$LEROBOT_VERSION" <<'EOF'
import importlib.metadata as md
import sys

assert md.version("lerobot") == sys.argv[1], md.version("lerobot")
import torch
import torchcodec.decoders  # noqa: F401  (fails when the FFmpeg libraries are missing)
from lerobot.datasets import LeRobotDataset  # noqa: F401
from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset  # noqa: F401

assert tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 12), torch.__version__
print(f"lerobot {md.version('lerobot')}, torch {torch.__version__}, torchcodec {md.version('torchcodec')}, "
      f"av {md.version('av')}, datasets {md.version('datasets')}")
EOF
}

if check 2>/dev/null; then
    echo "$VENV is ready"
    exit 0
fi

# PyPI has no CPU-only torch for Linux x86_64: 'torch<2.12' resolves to torch 2.11.0 with its
# CUDA 13 libraries (about 5.4 GB in the venv; nothing uses a GPU here). The CPU wheel on this
# machine (/opt/wheels) is 2.13.0 for Python 3.11, which LeRobot 0.6.1 does not accept.
# The pip cap in /etc/xdg/pip (torch<=2.14.1) does not get in the way of <2.12.
"$VENV/bin/pip" install "lerobot[dataset]==${LEROBOT_VERSION}" 'torch<2.12'
check
