#!/usr/bin/env bash
# Set up the peers of benchmarks/peers.py (MosaicML Streaming 0.13.0, LitData) beside this package
# in their own venv, on the CPU torch. Idempotent: a second run only checks.
#
#   bash benchmarks/setup_peers_env.sh            # venv at /work/peers-venv
#   PEERS_VENV=/elsewhere bash benchmarks/setup_peers_env.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
VENV="${PEERS_VENV:-/work/peers-venv}"
PY311="${PY311:-python3.11}"
# The CPU torch wheel lies on this machine's disk (PyPI has only CUDA builds of torch for Linux).
TORCH_WHEEL="${TORCH_WHEEL:-$(ls /opt/wheels/torch-2.13.0+cpu-cp311-*.whl 2>/dev/null | head -n 1)}"
if [[ -z "$TORCH_WHEEL" ]]; then
    echo "no CPU torch 2.13.0 wheel in /opt/wheels; set TORCH_WHEEL=/path/to/torch-2.13.0+cpu-cp311-*.whl" >&2
    exit 1
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating $VENV with $PY311"
    "$PY311" -m venv "$VENV"
fi

check() {
    "$VENV/bin/python" - "$HERE" <<'PY'
import importlib.metadata as md
import sys

sys.path.insert(0, sys.argv[1])
import litdata  # noqa: F401
import torch
from peers import import_streaming

import lerobot_nodes  # noqa: F401

import_streaming()

assert "+cpu" in torch.__version__ or not torch.version.cuda, torch.__version__
cuda = [d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia")]
assert not cuda, cuda
print(f"torch {torch.__version__}, "
      f"mosaicml-streaming {md.version('mosaicml-streaming')}, litdata {md.version('litdata')}, "
      f"moto {md.version('moto')}, lerobot-nodes {md.version('lerobot-nodes')}")
PY
}

if check 2>/dev/null; then
    echo "$VENV is ready"
    exit 0
fi

# torch first, from the CPU wheel: the constraints then hold it (torch==2.13.0 admits 2.13.0+cpu).
"$VENV/bin/pip" install "$TORCH_WHEEL"
"$VENV/bin/pip" install -c "$REPO/constraints/peers.txt" -e "$REPO[s3]" \
    mosaicml-streaming litdata "moto[server]>=5" psutil matplotlib
# Both peers require torchvision, and PyPI's torchvision wheels are CUDA builds: on the CPU torch
# `import torchvision` fails ("operator torchvision::nms does not exist"; _C.so links
# libtorch_cuda.so). Neither needs it on the paths measured (MDSWriter / StreamingDataset; LitData
# with raw arrays), so it goes: benchmarks/peers.py's import_streaming() stands in for the three
# names streaming.vision imports. `pip check` reports the missing requirement; that is expected.
"$VENV/bin/pip" uninstall -y torchvision
check
