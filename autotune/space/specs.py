"""The search space's vocabulary: knob names and groups, the specs a space file becomes (`KnobSpec`,
`LoraSpec`, `ProbeSpec`, `SeedConfig`) and `SpaceError`, whose lines say every mistake at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.config.knobs import ProbeConfig
from autotune.config.numbers import is_int
from autotune.errors import UserError, single_line

__all__ = [
    "ACCUM",
    "BOOL_KNOBS",
    "BUDGET",
    "BUDGETS",
    "CHECKPOINTING",
    "CHOICES",
    "CRITIC_BUDGET",
    "DYNAMIC",
    "DYNAMIC_KNOBS",
    "EXPONENT_ORDER",
    "FIXED",
    "HOLDING_KNOBS",
    "KNOBS",
    "LENGTH_KNOBS",
    "LINEAR",
    "LOGPROB",
    "LOG_PROB_BUDGET",
    "MEMORY_EQUAL_FIELDS",
    "MEMORY_MONOTONE_KNOBS",
    "MICRO",
    "MINI",
    "OFFLOAD_KNOBS",
    "OPTIONAL_KNOBS",
    "OPTIONAL_MONOTONE_KNOBS",
    "POW2",
    "PROMPT",
    "RECIPE_KNOBS",
    "RESPONSE",
    "ROLLOUT",
    "SEQS",
    "SHARDING",
    "SYSTEM_KNOBS",
    "TIME_ONLY_KNOBS",
    "TP",
    "TRAIN",
    "UNIT_KNOBS",
    "UNREACHED",
    "UTILIZATION",
    "UTILIZATION_STEP",
    "VERL_KNOBS",
    "VERL_MAX_NUM_SEQS",
    "VLLM_KNOBS",
    "WORKERS",
    "KnobSpec",
    "LoraSpec",
    "ProbeSpec",
    "SeedConfig",
    "SpaceError",
    "near_units",
    "too_many_workers",
    "unit_form",
]


TRAIN, MINI, ROLLOUT = "train_batch_size", "mini_batch_size", "rollout_batch_size"


MICRO, LOGPROB = "micro_batch_size", "log_prob_micro_batch_size"


ACCUM = "gradient_accumulation_steps"  # ProbeConfig's field, derived: g = M/(W·m); not a knob


WORKERS, PROMPT, RESPONSE = "num_rollout_workers", "max_prompt_length", "max_response_length"


CHECKPOINTING, SHARDING = "gradient_checkpointing", "sharding"


OFFLOAD_KNOBS = ("param_offload", "optimizer_offload", "offload_policy")


HOLDING_KNOBS = (SHARDING, *OFFLOAD_KNOBS)  # how the training states are held: sampled together


# verl's own knobs: vLLM's share of the card, tensor parallel size (divisors of W) and max_num_seqs (measured
# with `--engine verl` only: `prepare` refuses them for the built-in probe, which has no vLLM), and dynamic
# batch size with its token budgets (the built-in probe packs micro batches as verl does: both measure them)
UTILIZATION, TP, SEQS = "gpu_memory_utilization", "tensor_model_parallel_size", "max_num_seqs"
VLLM_KNOBS = (UTILIZATION, TP, SEQS)


VERL_MAX_NUM_SEQS = 256  # max_num_seqs unset: verl's default (trainer/config/rollout/rollout.yaml)


DYNAMIC, BUDGET = "use_dynamic_bsz", "ppo_max_token_len_per_gpu"
LOG_PROB_BUDGET, CRITIC_BUDGET = "log_prob_max_token_len_per_gpu", "critic_max_token_len_per_gpu"
BUDGETS = (BUDGET, LOG_PROB_BUDGET, CRITIC_BUDGET)  # the update's, the forward passes', the critic's


VERL_KNOBS = (*VLLM_KNOBS, DYNAMIC, *BUDGETS)


DYNAMIC_KNOBS = (DYNAMIC, *BUDGETS)  # sampled together: the budgets only with dynamic batch size on


UTILIZATION_STEP = 0.05  # of a {min, max} share without a step


BOOL_KNOBS = (CHECKPOINTING, *OFFLOAD_KNOBS, DYNAMIC)


UNIT_KNOBS = (TRAIN, MINI, ROLLOUT)  # u·2^k


EXPONENT_ORDER = (TRAIN, MINI, ROLLOUT, MICRO, LOGPROB)  # sampling order: each range clipped by the earlier


LENGTH_KNOBS = (PROMPT, RESPONSE)


KNOBS = (*EXPONENT_ORDER, WORKERS, *LENGTH_KNOBS, CHECKPOINTING, *HOLDING_KNOBS, *VERL_KNOBS)


# What is trained per step (with algorithm, rollout_n, kl_coef and LoRA): fixed unless listed under `tune:`.
RECIPE_KNOBS = (TRAIN, MINI, PROMPT, RESPONSE)


SYSTEM_KNOBS = tuple(name for name in KNOBS if name not in RECIPE_KNOBS)  # speed and memory only: searched


OPTIONAL_KNOBS: dict[str, Any] = {  # omitted -> this value (verl's defaults)
    LOGPROB: None,
    CHECKPOINTING: True,
    SHARDING: "replicate",
    **dict.fromkeys(OFFLOAD_KNOBS, False),
    **dict.fromkeys(VERL_KNOBS, None),  # the export's rule or verl's default
    DYNAMIC: False,
}


# Kinds of KnobSpec.
FIXED, CHOICES, POW2, LINEAR = "fixed", "choices", "pow2", "linear"


# Memory (docs/design.md, "Knobs and invariants"): the peak grows with MEMORY_MONOTONE_KNOBS (the log-prob
# knob by its effective value, `None` = micro); gradient checkpointing goes the other way (True needs LESS
# memory); MEMORY_EQUAL_FIELDS must be equal to compare two configs at all (another holding moves the states
# between GPU and host in other ways); TIME_ONLY_KNOBS (ProbeConfig fields) change time, not the peak (T and
# g beyond a rollout buffer of a few MB; the workers are separate processes, outside a rank's CUDA memory
# and its RSS).
MEMORY_MONOTONE_KNOBS = (MICRO, ROLLOUT, PROMPT, RESPONSE, "forward_micro_batch_size")


# The monotone knobs a phase of verl's training does not reach (its rollout engine asleep): an OOM there says
# nothing about them
UNREACHED = {"update": (ROLLOUT, "forward_micro_batch_size"), "scoring": (MICRO, ROLLOUT)}


MEMORY_EQUAL_FIELDS = (
    "algorithm",
    "rollout_n",
    "use_lora",
    "lora_r",
    "use_kl",
    *HOLDING_KNOBS,
    TP,
    SEQS,
    DYNAMIC,
)


# monotone where both are set (vLLM's pool, the tokens per micro-batch); None (a rule) compares only with None
OPTIONAL_MONOTONE_KNOBS = (UTILIZATION, *BUDGETS)


TIME_ONLY_KNOBS = (TRAIN, ACCUM, WORKERS)


class SpaceError(UserError):
    """A search space with mistakes: `errors` holds one line per mistake, `<file>: <key>=<value>: <rule>`."""

    def __init__(self, errors: list[str]):
        self.errors = [single_line(error) for error in errors]
        super().__init__("\n".join(self.errors))


@dataclass(frozen=True)
class KnobSpec:
    """How one knob is searched.

    kind `fixed`: `choices` holds the one value. `choices`: a categorical over `choices`. `pow2`: the value is
    `unit·2^e` for e in [low, high] (batch knobs always have this kind, a fixed one with low == high; for a
    length `unit` is 1). `linear`: low, low+step, ..., high (for workers, `high` before clipping to cores).
    """

    name: str
    kind: str
    choices: tuple[Any, ...] = ()
    low: int = 0
    high: int = 0
    step: int = 1
    unit: int = 1

    @property
    def param(self) -> str:
        """The Optuna parameter name: the knob's own, with its real values (see the module docstring)."""
        return self.name

    @property
    def searched(self) -> bool:
        """Whether sampling asks the trial for it (a fixed knob adds no Optuna parameter)."""
        if self.kind == FIXED:
            return False
        return self.kind == CHOICES or self.high > self.low

    def value(self, exponent: int) -> int:
        return self.unit * 2**exponent

    def exponent(self, value: Any) -> int | None:
        """e with value == unit·2^e, or None."""
        if not is_int(value) or value < self.unit or value % self.unit:
            return None
        q = value // self.unit
        return q.bit_length() - 1 if q & (q - 1) == 0 else None

    def linear_high(self, cores: int | None = None) -> int:
        high = min(self.high, cores) if cores is not None and self.name == WORKERS else self.high
        return self.low + (high - self.low) // self.step * self.step

    def values(self, cores: int | None = None) -> tuple[Any, ...]:
        """Every value the knob can take, ignoring the other knobs (workers clipped to `cores`)."""
        if self.kind in (FIXED, CHOICES):
            return self.choices
        if self.kind == POW2:
            return tuple(self.value(e) for e in range(self.low, self.high + 1))
        return tuple(range(self.low, self.linear_high(cores) + 1, self.step))


@dataclass(frozen=True)
class LoraSpec:
    enabled: bool = False
    r: int = 16
    alpha: int = 32


@dataclass(frozen=True)
class ProbeSpec:
    iterations: int = 2
    warmup: int = 1
    timeout_seconds: float = 600.0


@dataclass(frozen=True)
class SeedConfig:
    """A hand-made configuration from the space file (a person's pick, to compare the tuner with)."""

    name: str
    config: ProbeConfig


def too_many_workers(cores: int) -> str:
    return f"exceeds the {cores} physical cores here: more workers compete for them and rollout stalls"


def unit_form(name: str, unit: int) -> str:
    if name in UNIT_KNOBS:
        return f"gpus×rollout_n×2^k = {unit}×2^k"
    return "a power of two"


def near_units(value: int, unit: int) -> str:
    """The values of the form unit·2^k around `value`, for a hint."""
    low = unit
    while low * 2 <= value:
        low *= 2
    return f"{low} or {low * 2}" if value > unit else str(unit)
