#!/usr/bin/env bash
# Create .venv and install autotune. Safe to run again (it only adds what is missing).
#   ./setup.sh        the tool (torch pinned to 2.13.0: a local CPU build where the machine carries one,
#                     PyPI's CUDA build on GPU machines; an already installed torch is kept)
#   ./setup.sh test   also what the tests need: pytest and ruff; hydra-core and verl 0.9.1's config files
#                     (verl without its dependencies, aside in .venv/verl-0.9.1, never imported); Debian's
#                     chromium for the report's browser test (installed with apt-get when run as root)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
.venv/bin/python -c "import torch" 2>/dev/null || "${pip[@]}" "torch==2.13.0"
if [ "${1:-}" != "test" ]; then
  "${pip[@]}" -e .
  exit 0
fi
"${pip[@]}" -e ".[test]" hydra-core
[ -f .venv/verl-0.9.1/verl/trainer/config/ppo_trainer.yaml ] \
  || "${pip[@]}" --no-deps --target .venv/verl-0.9.1 "verl==0.9.1"
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
