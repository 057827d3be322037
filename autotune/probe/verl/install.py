"""The user's verl environment (`--verl-python`): checked once before the first verl probe, so that a wrong
path is one line at the start, not a crashed probe per trial."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from autotune.errors import UserError

__all__ = ["VERL_VERSION", "check_verl_python"]

VERL_VERSION = "0.9.1"  # the version autotune's exports and this backend are written and tested against
INSTALL = f'python3 -m venv /opt/verl && /opt/verl/bin/pip install "verl[vllm]=={VERL_VERSION}" orjson'


def check_verl_python(python: str | None) -> str:
    """verl's version as the environment reports it; UserError (exit 2) when it cannot run verl."""
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
    try:
        found = subprocess.run(
            [str(path), "-c", "import verl; print(verl.__version__)"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"--verl-python {python}: cannot run it ({exc})") from None
    if found.returncode != 0:
        last = (found.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(
            f"--verl-python {python}: `import verl` fails there ({last}); install it with {INSTALL}"
        )
    return found.stdout.strip() or "unknown"
