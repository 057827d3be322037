#!/usr/bin/env bash
# The tests, as CI runs them (.ci/run): style, types, then pytest. `./setup.sh test` makes what they need.
#   ./check.sh                 everything
#   ./check.sh -m "not e2e"    the same checks, and only the fast tier of pytest (arguments go to pytest)
set -euo pipefail
cd "$(dirname "$0")"
py=.venv/bin/python
[ -x "$py" ] || { echo "check.sh: no .venv here: run ./setup.sh test first" >&2; exit 2; }
# Cache bytecode even where the machine turns it off (PYTHONDONTWRITEBYTECODE): the suite starts hundreds of
# Python processes, and without the cache each one compiles autotune again and each pytest worker rewrites
# every test module's asserts again (about 4 s of every worker's collection). The caches go to __pycache__/.
unset PYTHONDONTWRITEBYTECODE
step() { echo "check.sh: $*" >&2; "$py" -m "$@"; }
# mypy and pytest on up to 4 cores (mypy without a cache, as in a fresh clone, takes most of a minute on one)
workers=${AUTOTUNE_TEST_WORKERS:-$(nproc)}
[ "$workers" -le 4 ] || workers=4
step ruff check .
step ruff format --check .
step mypy --num-workers "$workers"
# pytest: one worker per core (tests/conftest.py pins each; a test file stays on one worker, so its module
# fixtures are built once); AUTOTUNE_TEST_WORKERS=1 runs it in this process. The 15 slowest tests close every
# run, so the next slowdown shows where it lands.
parallel=()
# whole files to each worker, in the order tests/conftest.py gives them (a trainer's long waits first)
[ "$workers" -le 1 ] || parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
step pytest -q "${parallel[@]}" --durations=15 "$@"
