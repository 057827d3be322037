"""What a config file says, in autotune's terms, whichever format it is in (see `autotune.formats.read`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from autotune.config.knobs import DEFAULT_HEADROOM, ProbeConfig
from autotune.config.rules import Finding

__all__ = ["ASSUMED", "DEFAULT_LAYOUT", "Measured", "Target", "looks_like_overrides"]


# What a file that names no sharding runs as: verl always holds the states with FSDP, full-shard over every
# GPU unless told otherwise (fsdp_size -1, reshard_after_forward true). Both formats read an absent key so.
DEFAULT_LAYOUT = ("full_shard", "FSDP FULL_SHARD (verl's default)")
ASSUMED = "assumed: the file names no sharding"


@dataclass(frozen=True)
class Measured:
    """best_config.yaml's `measured:` block: the study's measurement of this config on its device."""

    peak_bytes: int
    device: str  # "cpu" | "cuda": where the probe ran
    gpus: int  # ranks per probe
    budget_bytes: float | None  # the study's memory budget per rank
    headroom: float = DEFAULT_HEADROOM
    gpu: str | None = None  # the card's name, on CUDA
    samples_per_sec: float | None = None

    @property
    def limit(self) -> float | None:
        """The study's feasibility limit: the budget less its headroom."""
        return None if self.budget_bytes is None else self.budget_bytes * (1.0 - self.headroom)

    @property
    def where(self) -> str:
        return (self.gpu or "CUDA") if self.device == "cuda" else self.device.upper()


@dataclass
class Target:
    """A config file read back: the configuration, the model and how its training states are held."""

    kind: str  # "seed schema" | "verl overrides" | "TRL config"
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
    measured: Measured | None = None  # best_config.yaml's measurement, when it has a usable one
    layout_assumed: bool = False  # the file names no sharding: DEFAULT_LAYOUT was applied
    device: str | None = None  # the device the file says it runs on (TRL's use_cpu); None: a GPU's
    prompt_known: bool = True  # False: the file cannot say its prompts' length (TRL's, not autotune's)
    call_line: int | None = None  # a launch script's: the line of the trainer call that was read
    call_file: str | None = None  # and the file it is written in (another, when the script sources it)

    def __post_init__(self) -> None:
        # YAML and Hydra type a bare `1` or `true` as a number or a boolean; a model path is text.
        for name in ("model", "reward_model"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                setattr(self, name, str(value))


def looks_like_overrides(text: str) -> bool:
    """Every non-comment line is a Hydra override `key=value` (verl_overrides.txt)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return bool(lines) and all(re.match(r"^[+~]?[A-Za-z_][\w.]*=", ln) for ln in lines)
