"""TRL as the engine of a probe (`--engine trl`): TRL's GRPOTrainer on this machine's ranks
(autotune.probe.trl_backend), whose LM head and loss are fused (`Passes.TRL_FUSED`)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from autotune.config.passes import Passes
from autotune.errors import UserError
from autotune.trainers.base import ProbeEngine, Trainer
from autotune.trainers.trl.trl_trainer import TRL

if TYPE_CHECKING:
    from rich.console import Console

    from autotune.config.knobs import ProbeConfig
    from autotune.config.rules import Finding
    from autotune.probe.contract import ProbeResult, ProbeSettings
    from autotune.space.model import SearchSpace

__all__ = ["TRL_ENGINE", "TrlEngine"]


class TrlEngine(ProbeEngine):
    name = "trl"
    on_ray = False  # TRL's probes run on this machine only
    python_option = "trl_python"  # --trl-python

    trainer = TRL

    def check_environment(self, settings: ProbeSettings) -> str | None:
        from autotune.probe.trl_backend import check_trl_python

        return check_trl_python(settings.engine_python)

    def announce(self, settings: ProbeSettings, console: Console) -> None:
        version = self.check_environment(settings)
        console.print(
            f"probing with TRL {version}: each trial runs TRL's GRPOTrainer for the warm-up (on CPU, and one "
            f"more round that sets the peak) and the measured rounds; samples/sec from TRL's own step_time",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    def run(
        self, config: ProbeConfig, settings: ProbeSettings, cancel: threading.Event | None
    ) -> ProbeResult:
        from autotune.probe.launcher import run_ranks, runner_path
        from autotune.probe.trl_backend import trl_job, trl_python

        job = trl_job(config, settings)
        return run_ranks(config, settings, runner_path("trl_probe.py"), cancel, trl_python(settings), job)

    def knob_findings(self, config: ProbeConfig, device: str | None = None) -> list[Finding]:
        from autotune.config.rules import trl_vllm_findings

        return trl_vllm_findings(config, device)

    def check_space_knobs(self, space: SearchSpace, device: str | None = None) -> None:
        named = space.vllm_knobs
        others = [name for name in named if name != "gpu_memory_utilization"]
        if others:
            raise UserError(
                f"{space.source}: knobs {', '.join(others)} are not searched for TRL (TRL sets vLLM's "
                f"sequences itself): leave them out; gpu_memory_utilization is TRL's vLLM share (use_vllm, "
                f"colocated)"
            )
        if named and device is not None and device != "cuda":
            raise UserError(
                f"{space.source}: knob gpu_memory_utilization is TRL's vLLM share (use_vllm, colocated), "
                f"and vLLM runs on CUDA only, not on {device}: leave it out (TRL then generates with "
                f"transformers)"
            )

    def model_passes(self, passes: Passes) -> Passes:
        return Passes.TRL_FUSED  # TRL 1.16's own passes: its LM head fused with the loss

    def pools_rollout(self, trainer: Trainer) -> bool:
        return trainer is self.trainer  # vLLM colocated, for a TRL job only

    def untimed_rounds(self, settings: ProbeSettings) -> int:
        from autotune.probe.trl_backend import Rounds

        plan = Rounds(settings.warmup_iterations, settings.iterations, 1, cpu=settings.device != "cuda")
        return plan.untimed


TRL_ENGINE = TrlEngine()
