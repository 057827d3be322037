#!/usr/bin/env bash
# Create .venv and install autotune with its test tools. Safe to run again (it only adds what is missing).
# torch is pinned to 2.13.0: a CPU build on machines that carry it locally, PyPI's CUDA build on GPU machines.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
.venv/bin/python -c "import torch" 2>/dev/null || "${pip[@]}" "torch==2.13.0"
"${pip[@]}" -e ".[test]"
