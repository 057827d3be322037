"""What runs a probe (`--engine`), and the check of its environment before the first probe.

check_engine_environment(settings)     # "0.9.1" for verl, "1.16.0" for TRL, None for the built-in probe
"""

from __future__ import annotations

from autotune.probe.contract import ProbeSettings

__all__ = ["check_engine_environment"]


def check_engine_environment(settings: ProbeSettings) -> str | None:
    """The trainer's version in the environment its probes run in; UserError (exit 2) when they cannot run
    there, said in one line before any probe starts. None for the built-in probe (this environment)."""
    if settings.engine == "verl":
        from autotune.probe.verl.install import check_verl_python

        return check_verl_python(settings.verl_python)
    if settings.engine == "trl":
        from autotune.probe.trl import check_trl_python

        return check_trl_python(settings.trl_python)
    return None
