"""The user's verl environment (`--verl-python`): checked once before the first verl probe, so that a wrong
path or a missing piece is one line at the start, not a crashed probe per trial.

verl 0.9.1's V1 trainer (the one its PPO entry point runs, trainer.use_v1: true) needs beyond `verl` itself
(versions from verl 0.9.1's own metadata and source, in .venv-verl):
- `transfer_queue`, the TransferQueue distribution >= 0.1.10 (its `verl-core` extra, which `verl[vllm]`
  pulls in), imported by trainer/main_ppo.py:137 and trainer/ppo/v1/replay_buffer.py:20;
- vLLM >= 0.18, the oldest verl's rollout supports (verl/third_party/vllm/__init__.py:46, which reads the
  installed distribution's version as this check does; `verl[vllm]` pins 0.24.0);
- `orjson`, which the file logger the probe reads imports (verl/utils/tracking.py:29) but no extra declares.
vLLM is not imported here (seconds, and CUDA libraries); the other two are.
On `--device cpu` (probe/verl/cpu.py) verl generates with autotune's `hf_cpu` rollout instead of vLLM, and
imports what vLLM's extra would bring: `cachetools` (workers/rollout/router.py:21), `fastapi` and `uvicorn`
(workers/rollout/utils.py); those are checked there instead of vLLM (RUNTIME_CPU).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from autotune.errors import UserError
from autotune.probe.environment import last_line

__all__ = ["RUNTIME", "RUNTIME_CPU", "VERL_VERSION", "check_verl_python", "missing_pieces"]

VERL_VERSION = "0.9.1"  # the version autotune's exports and this backend are written and tested against
INSTALL = f'python3 -m venv /opt/verl && /opt/verl/bin/pip install "verl[vllm]=={VERL_VERSION}" orjson'
# (what to call it, the module imported or None, the distribution, the lowest version)
RUNTIME = (
    ("transfer_queue", "transfer_queue", "TransferQueue", "0.1.10"),
    ("vLLM", None, "vllm", "0.18"),
    ("orjson", "orjson", "orjson", None),
)
CPU_PIECES = '"transferqueue==0.1.11" cachetools fastapi uvicorn orjson'  # vLLM's place on CPU (RUNTIME_CPU)
CPU_INSTALL = f'/opt/verl/bin/pip install "verl=={VERL_VERSION}" {CPU_PIECES}'
RUNTIME_CPU = (
    RUNTIME[0],
    ("cachetools", "cachetools", "cachetools", None),
    ("fastapi", "fastapi", "fastapi", None),
    ("uvicorn", "uvicorn", "uvicorn", None),
    RUNTIME[2],
)
# Run with the environment's python: verl's version, then per piece its import error and installed version.
PROBE = """
import importlib, importlib.metadata as metadata, json, sys
import verl
def version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
def failure(module):
    if module is None:
        return None
    try:
        importlib.import_module(module)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
pieces = json.loads(sys.argv[1])
found = {name: {"error": failure(module), "version": version(dist)} for name, module, dist, _ in pieces}
print(json.dumps({"verl": getattr(verl, "__version__", "unknown"), "pieces": found}))
"""


def _release(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version string: "0.24.0rc1" -> (0, 24, 0)."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def missing_pieces(found: dict[str, dict[str, str | None]], runtime: tuple = RUNTIME) -> list[str]:
    """The `runtime` pieces `found` (PROBE's report per piece) lacks or has too old, as words for a user."""
    missing = []
    for name, module, dist, lowest in runtime:
        piece = found.get(name) or {}
        version = piece.get("version")
        absent = piece.get("error") is not None if module else version is None
        wanted = f"{name} ({dist} >= {lowest})" if lowest else name
        if absent:
            missing.append(wanted)
        elif lowest and version and _release(version) < _release(lowest):
            missing.append(f"{wanted}, not {version}")
    return missing


def _probe(path: Path, python: str, runtime: tuple) -> dict:
    """What PROBE reports from the environment of `path`; UserError when it cannot run or verl is absent."""
    argv = ["-c", PROBE, json.dumps(runtime)]
    report = last_line(path, argv, f"--verl-python {python}", "`import verl`", f"install it with {INSTALL}")
    try:
        return json.loads(report or "{}")
    except ValueError:
        raise UserError(
            f"--verl-python {python}: its check printed no report; is it verl's python?"
        ) from None


def check_verl_python(python: str | None, device: str = "cuda") -> str:
    """verl's version as the environment reports it; UserError (exit 2) when it cannot run verl's V1
    trainer on `device`: no such python, no verl, or a runtime piece missing (RUNTIME, RUNTIME_CPU), said in
    one line."""
    if not python:
        raise UserError(
            f"--engine verl needs --verl-python PATH: the python of an environment with verl {VERL_VERSION} "
            f"(e.g. {INSTALL}, then --verl-python /opt/verl/bin/python)"
        )
    path = Path(python).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UserError(
            f"--verl-python {python}: not an executable file; give the python of verl's environment"
        )
    runtime, install = (RUNTIME_CPU, CPU_INSTALL) if device == "cpu" else (RUNTIME, INSTALL)
    report = _probe(path, python, runtime)
    missing = missing_pieces(report.get("pieces") or {}, runtime)
    if missing:
        where = " on CPU" if device == "cpu" else ""
        raise UserError(
            f"--verl-python {python}: verl's V1 trainer{where} needs {', '.join(missing)}, which that "
            f"environment lacks; install with {install}"
        )
    return str(report.get("verl") or "unknown")
