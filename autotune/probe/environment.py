"""Run a check in another environment's python (verl's, TRL's) and get its last line, or one line that says
why it could not run there.

    last_line(Path("/opt/verl/bin/python"), ["-c", CODE], "--verl-python /opt/verl/bin/python",
              "`import verl`", "install it with ...")
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from autotune.errors import UserError

__all__ = ["last_line"]

CHECK_SECONDS = 300  # imports of torch and a trainer on a slow disk


def last_line(python: Path, argv: list[str], named: str, imports: str, fix: str) -> str:
    """The last line `python argv` printed (empty when none); UserError (exit 2) `<named>: cannot run it` or
    `<named>: <imports> fails there (<its last error line>); <fix>`."""
    try:
        found = subprocess.run([str(python), *argv], capture_output=True, text=True, timeout=CHECK_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"{named}: cannot run it ({exc})") from None
    if found.returncode != 0:
        last = (found.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"{named}: {imports} fails there ({last}); {fix}")
    return (found.stdout.strip().splitlines() or [""])[-1]
