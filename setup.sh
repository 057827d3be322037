#!/usr/bin/env bash
# Create .venv and install autotune. Safe to run again (it only adds what is missing).
#   ./setup.sh        the tool (torch pinned to 2.13.0: a local CPU build where the machine carries one,
#                     PyPI's CUDA build on GPU machines; an already installed torch is kept)
#   ./setup.sh test   also what the tests need (then ./check.sh runs them): pytest, ruff, mypy, psycopg2,
#                     hypothesis; verl 0.9.1
#                     with its dependencies in its own environment .venv-verl (never imported by autotune),
#                     with what verl needs to run on CPU (the tests run verl itself there).
#                     As root with apt-get: Debian's chromium for the report's browser test, and Debian's
#                     postgresql for the PostgreSQL tests: its own cluster "autotune" on 127.0.0.1 only,
#                     started with pg_ctlcluster (no systemd needed), a role "autotune" and a database
#                     "autotune_test" with a random password, the URL in .venv/postgres-url (mode 600).
#                     Otherwise those tests skip.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
say() { echo "setup.sh: $*"; } # each step, so that a minute of pip is not a silent minute
[ -x .venv/bin/python ] || { say "creating .venv"; "$PYTHON" -m venv .venv; }
pip_into() { # VENV ARGS...: pip install, quietly
  "$1/bin/python" -m pip install -q --disable-pip-version-check "${@:2}"
}
install_torch() {
  .venv/bin/python -c "import torch" 2>/dev/null && return 0
  say "installing torch 2.13.0 (seconds from a local CPU build, minutes from PyPI)"
  pip_into .venv "$@" "torch==2.13.0"
}
if [ "${1:-}" != "test" ]; then
  install_torch
  say "installing autotune and its dependencies into .venv"
  pip_into .venv -e .
  say "done: .venv/bin/autotune --help"
  exit 0
fi
# Three lanes at once, as each mostly waits on one core: .venv, .venv-verl, and (as root) Debian's packages.
# pip does not compile every module it installs (--no-compile: 17,500 files in .venv, half of pip's time);
# each lane then imports what the tests use once, with bytecode caching on, so that only those files
# (about 3,000) are compiled, once.
compile_imports() { # VENV MODULE...: import each (bytecode caching on); name those that fail
  env -u PYTHONDONTWRITEBYTECODE "$1/bin/python" -W ignore - "${@:2}" >/dev/null 2>&1 <<'PY' \
    || echo "setup.sh: note: $1 could not import all of: ${*:2}" >&2
import importlib, sys
failed = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name)
sys.exit(1 if failed else 0)
PY
}
verl_lane() { # verl 0.9.1 with its own dependencies, in its own environment: the tests compose autotune's
  # exports with its Hydra config and run its validate_config; autotune never imports it.
  [ -x .venv-verl/bin/python ] || "$PYTHON" -m venv .venv-verl
  .venv-verl/bin/python -c "import verl, transfer_queue, cachetools, fastapi, uvicorn" 2>/dev/null && return 0
  say "installing verl 0.9.1 and its dependencies into .venv-verl (the exports' referee; about a minute)"
  pip_into .venv-verl --no-compile "torch==2.13.0" "verl==0.9.1" orjson
  # What verl's V1 trainer imports on CPU (autotune/probe/verl/install.py RUNTIME_CPU): part of verl's
  # `verl-core` extra, whose other packages (CUDA builds among them) verl on CPU does not need; their own
  # dependencies are verl's already, so pinned and without resolving.
  pip_into .venv-verl --no-compile --no-deps "transferqueue==0.1.11" "pyzmq==27.3.0" "msgspec==0.23.0" \
    "cachetools==8.0.3" "fastapi==0.165.0" "starlette==1.10.0" "uvicorn==0.55.0"
  compile_imports .venv-verl verl.trainer.main_ppo verl.workers.config verl.utils.config \
    verl.workers.engine.fsdp.transformer_impl verl.trainer.ppo.core_algos verl.single_controller.ray.base \
    verl.workers.rollout.replica verl.utils.dataset.rl_dataset verl.utils.torch_functional hydra ray
}
main_lane() {
  install_torch --no-compile
  say "installing autotune with the test tools (pytest, ruff, mypy, hypothesis, psycopg2, TRL) into .venv"
  pip_into .venv --no-compile -e ".[test]"
  compile_imports .venv torch transformers peft trl optuna ray hypothesis pytest autotune.cli \
    autotune.probe.rank.ppo autotune.probe.rank.trace transformers.models.llama.modeling_llama
}
debian_lane() { # chromium for the browser tests; PostgreSQL for the shared-study tests
  apt_install() { # quietly, with one `apt-get update` per run
    [ -n "${apt_updated:-}" ] || { apt-get update -qq && apt_updated=1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  }
  if ! command -v chromium >/dev/null; then
    say "installing Debian's chromium (the report's browser tests)"
    apt_install chromium
  fi
  # PostgreSQL: the server package once, then our own cluster (created once, started whenever it is down, e.g.
  # after a reboot), then the role and database; the password is kept only in .venv/postgres-url.
  if ! compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; then
    say "installing Debian's postgresql (the PostgreSQL storage tests)"
    apt_install --no-install-recommends postgresql
  fi
  pg_cluster() { pg_lsclusters -h | awk '$2 == "autotune" { print $1, $3, $4 }'; } # version port status
  read -r pg_ver pg_port pg_status <<<"$(pg_cluster)"
  if [ -z "$pg_ver" ]; then
    pg_ver=$(find /usr/lib/postgresql/*/bin/postgres | sort -V | tail -1 | cut -d/ -f5)
    LC_ALL=C.UTF-8 pg_createcluster -q --locale C.UTF-8 "$pg_ver" autotune >/dev/null
    # (not `pg_createcluster -o`: it would write 127.0.0.1 unquoted, which PostgreSQL cannot parse)
    echo "listen_addresses = '127.0.0.1'" >"/etc/postgresql/$pg_ver/autotune/conf.d/listen.conf"
    read -r pg_ver pg_port pg_status <<<"$(pg_cluster)"
  fi
  if [[ "$pg_status" != online* ]]; then
    say "starting the PostgreSQL cluster 'autotune'"
    pg_ctlcluster "$pg_ver" autotune start
  fi
  # The role is the machine's, shared by every clone: its password is kept beside the cluster's config (root
  # only), so that a second clone's setup reuses it instead of changing it under the first.
  pg_url_file=.venv/postgres-url
  pg_pass_file="/etc/postgresql/$pg_ver/autotune/autotune-test-password"
  pg_works() {
    [ -n "$1" ] && PGPASSWORD="$1" PGCONNECT_TIMEOUT=5 psql -X -qtA -h 127.0.0.1 -p "$pg_port" \
      -U autotune -d autotune_test -c "SELECT 1" >/dev/null 2>&1
  }
  pg_pass=$(sed -n 's#^postgresql+psycopg2://autotune:\([0-9a-f]*\)@.*#\1#p' "$pg_url_file" 2>/dev/null || true)
  pg_works "$pg_pass" || pg_pass=$(cat "$pg_pass_file" 2>/dev/null || true)
  if ! pg_works "$pg_pass"; then
    pg_pass=$("$PYTHON" -c "import secrets; print(secrets.token_hex(16))")
    pg_sql() { (cd / && runuser -u postgres -- psql -X -qtA -v ON_ERROR_STOP=1 -p "$pg_port"); } # SQL on stdin
    [ "$(pg_sql <<<"SELECT 1 FROM pg_roles WHERE rolname = 'autotune'")" = 1 ] \
      || pg_sql <<<"CREATE ROLE autotune"
    pg_sql <<<"ALTER ROLE autotune LOGIN PASSWORD '$pg_pass'"
    [ "$(pg_sql <<<"SELECT 1 FROM pg_database WHERE datname = 'autotune_test'")" = 1 ] \
      || pg_sql <<<"CREATE DATABASE autotune_test OWNER autotune"
  fi
  (umask 077 && echo "$pg_pass" >"$pg_pass_file")
  (umask 077 && echo "postgresql+psycopg2://autotune:$pg_pass@127.0.0.1:$pg_port/autotune_test" >"$pg_url_file")
  chmod 600 "$pg_url_file"
}
# Each lane in its own process group (set -m): if setup fails or is interrupted, the verl lane's pip stops with
# it. The Debian lane is left to finish: an apt-get or a cluster stopped halfway is worse than one that ends.
set -m
verl_lane &
verl_pid=$!
trap 'kill -- "-$verl_pid" 2>/dev/null || true' EXIT
debian_pid=
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  debian_lane &
  debian_pid=$!
else
  echo "setup.sh: not root with apt-get, so no Debian chromium or postgresql: the tests needing them skip" \
    "(the PostgreSQL tests use AUTOTUNE_TEST_POSTGRES=postgresql+psycopg2://... when set)"
fi
main_lane
wait "$verl_pid"
trap - EXIT
[ -z "$debian_pid" ] || wait "$debian_pid"
say "done: ./check.sh runs the tests"
