"""What TRL's GRPOTrainer can run as a study measures it: the space checked before the first probe."""

from __future__ import annotations

from autotune.config.knobs import ProbeConfig
from autotune.errors import UserError
from autotune.space.model import SearchSpace
from autotune.space.specs import OFFLOAD_KNOBS

__all__ = ["check_trl_space"]


def check_trl_space(space: SearchSpace) -> None:
    """Refuse, in one line, a space TRL's GRPOTrainer cannot run as the study would measure it: not GRPO, one
    completion per prompt, sharding or offload (accelerate's config, not GRPOConfig), or a hand-made config
    GRPOConfig refuses."""
    from autotune.config.rules import raise_for
    from autotune.formats.trl import trl_findings

    dynamic = [name for name in space.verl_knobs if name not in space.vllm_knobs]  # dynamic batch size
    if dynamic:
        raise UserError(
            f"{space.source}: knobs {', '.join(dynamic)} are verl's dynamic batch size: TRL's GRPOTrainer "
            f"pads fixed micro batches and has no token budget; fix: leave them out of the space (or "
            f"--target verl)"
        )
    held = [name for name in ("sharding", *OFFLOAD_KNOBS) if len(space.knob(name).values()) > 1]
    if held:
        raise UserError(
            f"{space.source}: knobs {', '.join(held)} are searched, but TRL holds the states by accelerate's "
            f"config, which the TRL export does not write: fix them (sharding: replicate, no offload)"
        )
    first = ProbeConfig(**space.fixed_fields)
    seeds = [finding for seed in space.seed_configs for finding in trl_findings(seed.config, space.gpus)]
    found = list({f.line: f for f in trl_findings(first, space.gpus) + seeds}.values())  # each once
    try:
        raise_for(found)
    except UserError as exc:
        raise UserError(f"{space.source}: for TRL: {exc}") from None
