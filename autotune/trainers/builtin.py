"""The built-in probe as an engine (`--engine builtin`): autotune's own PPO iteration, in the trainer's passes
(autotune.probe.rank.ppo), on this machine's ranks or a Ray cluster's (autotune.probe.launcher)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from autotune.errors import UserError
from autotune.trainers.base import ProbeEngine

if TYPE_CHECKING:
    from autotune.config.knobs import ProbeConfig
    from autotune.config.rules import Finding
    from autotune.probe.contract import ProbeResult, ProbeSettings
    from autotune.space.model import SearchSpace

__all__ = ["BUILTIN", "BuiltinEngine"]


class BuiltinEngine(ProbeEngine):
    name = "builtin"

    def run(
        self, config: ProbeConfig, settings: ProbeSettings, cancel: threading.Event | None
    ) -> ProbeResult:
        from autotune.probe.launcher import run_probe

        return run_probe(config, settings, None, cancel)

    def knob_findings(self, config: ProbeConfig, device: str | None = None) -> list[Finding]:
        from autotune.config.rules import builtin_vllm_findings

        return builtin_vllm_findings(config)

    def check_space_knobs(self, space: SearchSpace, device: str | None = None) -> None:
        """The built-in probe has no vLLM: a share, a tensor-parallel rollout or max_num_seqs would be
        searched without being measured (fixing them silently would hand back a config nobody probed)."""
        if space.vllm_knobs:
            raise UserError(
                f"{space.source}: knobs {', '.join(space.vllm_knobs)} are vLLM's, measured only with "
                f"--engine verl (the built-in probe has no vLLM pool or tensor-parallel rollout) or, for "
                f"gpu_memory_utilization, --engine trl on CUDA: run with such an engine, or leave them out"
            )


BUILTIN = BuiltinEngine()
