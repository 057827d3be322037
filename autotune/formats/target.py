"""What a config file says, in autotune's terms, whichever format it is in (see `autotune.formats.read`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from autotune.config.knobs import ProbeConfig
from autotune.config.rules import Finding

__all__ = ["Target", "looks_like_overrides"]


@dataclass
class Target:
    """A config file read back: the configuration, the model and how its training states are held."""

    kind: str  # "seed schema" | "verl overrides"
    config: ProbeConfig | None  # None: an override file without the sizes the memory model needs
    model: str | None = None
    reward_model: str | None = None
    reward_trainable: bool = False
    sharding: str = "none"  # "none" | "full_shard" | "shard_grad_op"
    sharding_label: str = "replicated (DDP)"
    offload: bool = False
    gpus: int | None = None  # what the file says (best_config's measured.gpus, verl's trainer.*)
    memory_gib: float | None = None  # best_config's measured.budget_gib
    findings: list[Finding] = field(default_factory=list)  # found while reading (unknown keys, ...)
    overrides: dict[str, Any] | None = None  # a verl override file's values
    engine: Any = None  # the rollout engine settings the file names (autotune.formats.rollout.RolloutEngine)


def looks_like_overrides(text: str) -> bool:
    """Every non-comment line is a Hydra override `key=value` (verl_overrides.txt)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return bool(lines) and all(re.match(r"^[+~]?[A-Za-z_][\w.]*=", ln) for ln in lines)
