"""verl as the engine of a probe (`--engine verl`): `python -m verl.trainer.main_ppo` for a few steps
(autotune.probe.verl), its rollout engine included, so vLLM's pool is measured, not sized by rule."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from autotune.trainers.base import ProbeEngine, Trainer
from autotune.trainers.verl.verl_trainer import VERL

if TYPE_CHECKING:
    from rich.console import Console

    from autotune.config.knobs import ProbeConfig
    from autotune.config.rules import Finding
    from autotune.probe.contract import ProbeResult, ProbeSettings

__all__ = ["VERL_ENGINE", "VerlEngine"]


class VerlEngine(ProbeEngine):
    name = "verl"
    runs_rollout = True
    python_option = "verl_python"  # --verl-python

    trainer = VERL

    def check_environment(self, settings: ProbeSettings) -> str | None:
        from autotune.probe.verl.install import check_verl_python

        return check_verl_python(settings.engine_python, settings.device)

    def announce(self, settings: ProbeSettings, console: Console) -> None:
        from autotune.probe.verl.install import VERL_VERSION

        version = self.check_environment(settings)
        pool = "" if settings.device == "cpu" else " (it cannot predict vLLM's pool)"  # no vLLM on CPU
        console.print(
            f"probing with verl {version} ({settings.engine_python}): each trial runs python -m "
            f"verl.trainer.main_ppo for the warm-up and measured steps; the memory model prunes only the "
            f"training side{pool}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        if version != VERL_VERSION:
            console.print(
                f"[yellow]autotune's verl export is written for verl {VERL_VERSION}, not {version}[/yellow]"
            )
        if settings.device == "cpu":
            console.print(
                "[yellow]on CPU verl runs through autotune's CPU plugin: its FSDP actor on gloo, and Hugging "
                "Face generate for the rollout instead of vLLM, so generation's speed and pool are not a GPU "
                "job's[/yellow]"
            )

    def run(
        self, config: ProbeConfig, settings: ProbeSettings, cancel: threading.Event | None
    ) -> ProbeResult:
        from autotune.probe.verl.backend import run_verl_probe

        return run_verl_probe(config, settings, cancel)

    def knob_findings(self, config: ProbeConfig, device: str | None = None) -> list[Finding]:
        return []  # verl runs vLLM: its knobs are measured

    def pools_rollout(self, trainer: Trainer) -> bool:
        return True


VERL_ENGINE = VerlEngine()
