"""`--engine trl`: a probe that is TRL's own GRPOTrainer, run for a few steps on the candidate configuration.

The ranks run `runners/trl_probe.py` with the TRL environment's python (`--trl-python`, default this one),
started and judged as the built-in probe's are (autotune.probe.launcher: one process group, a wall-clock
limit, the same result files and classification). The job carries the GRPOConfig fields the export writes
(autotune.formats.trl), so a probe runs exactly what trl_config.yaml hands over.

    version = check_trl_python(None)                  # "1.16.0"; UserError when TRL or autotune is missing
    run_ranks(config, settings, runner_path("trl_probe.py"), python=trl_python(settings),
              job=trl_job(config, settings))          # what autotune.probe.launcher.run_probe does
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.config.knobs import ProbeConfig
from autotune.formats.trl import TRL_VERSION, trl_fields
from autotune.probe.contract import ProbeSettings
from autotune.probe.environment import last_line

__all__ = ["INSTALL", "Rounds", "check_trl_python", "trl_job", "trl_python"]


# What to install where: TRL, and autotune beside it (the probe program imports autotune's rank helpers).
INSTALL = f'trl=={TRL_VERSION} and autotune in that environment (from a checkout: pip install ".[trl]")'
# Run with the environment's python: TRL's version, and that autotune (the probe program's helpers) imports.
PROBE = "import trl, autotune.probe.rank.process; print(trl.__version__)"


@dataclass(frozen=True)
class Rounds:
    """A TRL probe's generation rounds (runners/trl_probe.py): untimed ones, then the timed ones. On CPU the
    untimed rounds are the warm-up and one more, on mappings: they set the peak. The timed rounds run on the
    heap. On CUDA the untimed rounds are the warm-up; the allocator's peak is over every round."""

    warmup: int
    iterations: int
    steps_per_round: int
    cpu: bool

    @property
    def untimed(self) -> int:
        # on CPU at least two: the peak needs a round after the first optimizer step (Adam's states)
        return max(self.warmup, 1) + 1 if self.cpu else self.warmup

    @property
    def total(self) -> int:
        return self.untimed + self.iterations

    def per_round(self, step_seconds: list[float]) -> tuple[list[float], list[float]]:
        """(untimed, timed) seconds per round from TRL's step times, in step order."""
        each = self.steps_per_round
        rounds = [sum(step_seconds[i : i + each]) for i in range(0, len(step_seconds), each)]
        return rounds[: self.untimed], rounds[self.untimed :]


def trl_python(settings: ProbeSettings) -> str:
    return settings.engine_python or sys.executable


def check_trl_python(python: str | None) -> str:
    """TRL's version in the environment of `python` (default this one); UserError (exit 2) when it cannot run
    the TRL probe: no such python, no TRL, or no autotune there."""
    path = Path(python or sys.executable).expanduser()
    version = last_line(
        path, ["-c", PROBE], f"--trl-python {path}", "`import trl, autotune`", f"install {INSTALL}"
    )
    return version or "unknown"


def trl_job(config: ProbeConfig, settings: ProbeSettings) -> dict[str, Any]:
    """What the TRL probe's job adds to the built-in one's: the export's fields for this configuration."""
    return {"trl": trl_fields(config).to_dict()}
