#!/usr/bin/env bash
# The tests, as CI runs them (.ci/run): style, types, then pytest. `./setup.sh test` makes what they need.
#   ./check.sh                 everything
#   ./check.sh -m "not e2e"    the same checks, and only the fast tier of pytest (arguments go to pytest)
set -euo pipefail
cd "$(dirname "$0")"
py=.venv/bin/python
[ -x "$py" ] || { echo "check.sh: no .venv here: run ./setup.sh test first" >&2; exit 2; }
step() { echo "check.sh: $*" >&2; "$py" -m "$@"; }
step ruff check .
step ruff format --check .
step mypy
step pytest -q "$@"
