"""The batch knobs of a PPO/GRPO job (the seed article's), and `--set KEY=VALUE` parsing.

Global sizes count *samples* (responses) across all ranks, as the seed article does; micro sizes are per
rank. With `rollout_n` > 1 each prompt is answered `rollout_n` times, so a rollout of R samples holds
R / rollout_n prompts (verl's `data.train_batch_size` counts prompts: the verl export divides by n).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from autotune.errors import UserError
from autotune.units import divisors, round_up

__all__ = [
    "ALGORITHMS",
    "BUDGET_KNOBS",
    "DEFAULT_HEADROOM",
    "KNOB_NAMES",
    "MAX_KL_COEF",
    "MINI_BATCH",
    "MIN_LOADER_WORKERS",
    "SHARDINGS",
    "VERL_DEFAULT_UTILIZATION",
    "VERL_KNOBS",
    "VLLM_KNOBS",
    "ProbeConfig",
    "job_of",
    "mini_batch_size",
    "parse_sets",
    "physical_cores",
    "resolve_mini_batch",
    "rollout_batch_fix",
    "same_job",
    "train_batch_fixes",
    "train_batch_step",
    "usable_cores",
]

ALGORITHMS = ("ppo", "grpo")
# How the training states are held across the W ranks: DDP replicas, or torch FSDP2 (verl's FSDP engine) that
# reshards the parameters after every forward (FULL_SHARD, verl's default) or keeps them for the backward
# (SHARD_GRAD_OP, verl's reshard_after_forward=false).
SHARDINGS = ("replicate", "full_shard", "shard_grad_op")
# feasible means peak <= budget × (1 − headroom): the rest is left to the allocator's fragmentation
DEFAULT_HEADROOM = 0.10
# 0 DataLoader workers: the training process loads the prompts itself (TRL's and transformers' default)
MIN_LOADER_WORKERS = 0
MAX_KL_COEF = 100.0  # a KL coefficient beyond this is a typo: the KL term would drown the policy loss


@dataclass(frozen=True)
class ProbeConfig:
    """One batch configuration: what a probe measures and what the report hands to a training job."""

    rollout_batch_size: int = 8
    train_batch_size: int = 16
    micro_batch_size: int = 4
    gradient_accumulation_steps: int = 2
    num_rollout_workers: int = 1
    max_prompt_length: int = 32
    max_response_length: int = 16
    # Forward-only passes (old/ref log-probs, values) carry no activations for backward: verl's guide says
    # about twice the training micro batch fits. None means "same as micro_batch_size".
    log_prob_micro_batch_size: int | None = None
    gradient_checkpointing: bool = True  # verl's default (model.enable_gradient_checkpointing)
    sharding: str = "replicate"  # one of SHARDINGS
    param_offload: bool = False  # verl's fsdp_config.param_offload: weights on the CPU outside their phases
    optimizer_offload: bool = False  # verl's optimizer_offload: Adam's states on the CPU outside the update
    # verl's fsdp_config.offload_policy (FSDP2's CPUOffloadPolicy): parameters, gradients and Adam's states
    # live on the CPU, each unit is copied in for its compute and the optimizer steps on the CPU
    offload_policy: bool = False
    algorithm: str = "ppo"
    rollout_n: int = 1
    use_lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    kl_coef: float = 0.05
    # verl's own knobs (VERL_KNOBS), searched and measured with `--engine verl` only: the built-in probe has
    # no vLLM pool, no tensor-parallel rollout and no dynamic batching. None = the export's rule
    # (autotune.formats.rollout) or verl's default.
    gpu_memory_utilization: float | None = None  # rollout.gpu_memory_utilization: vLLM's share of the card
    tensor_model_parallel_size: int | None = None  # rollout.tensor_model_parallel_size: divides the GPUs
    max_num_seqs: int | None = None  # rollout.max_num_seqs: vLLM's concurrent sequences (verl: 256)
    # actor.use_dynamic_bsz: micro-batches cut by a token budget per GPU instead of micro_batch_size samples;
    # the budget (actor.ppo_max_token_len_per_gpu, and the log-prob, reference and critic ones with it) is
    # None = the micro batch's tokens, micro_batch_size × (max_prompt_length + max_response_length)
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int | None = None
    # the forward-only passes' budget (rollout.log_prob_ and ref.log_prob_max_token_len_per_gpu; verl: the
    # actor's by interpolation, about twice as much fits) and the critic's
    # (critic.ppo_infer_max_token_len_per_gpu, both of its passes in V1); None = the actor's budget
    log_prob_max_token_len_per_gpu: int | None = None
    critic_max_token_len_per_gpu: int | None = None

    @property
    def use_kl(self) -> bool:
        """KL against a reference policy (verl builds the reference model only then): kl_coef > 0. PPO puts it
        in the reward (k1), GRPO in the loss (k3, verl's low_var_kl)."""
        return self.kl_coef > 0

    @property
    def sharded(self) -> bool:
        return self.sharding != "replicate"

    @property
    def offloaded(self) -> bool:
        return self.param_offload or self.optimizer_offload or self.offload_policy

    @property
    def forward_micro_batch_size(self) -> int:
        return self.log_prob_micro_batch_size or self.micro_batch_size

    @property
    def sequence_length(self) -> int:
        return self.max_prompt_length + self.max_response_length

    @property
    def uses_verl_knobs(self) -> bool:
        """Whether any of verl's own knobs departs from its rule or default."""
        return any(getattr(self, name) not in (None, False) for name in VERL_KNOBS)

    @property
    def uses_vllm_knobs(self) -> bool:
        """Whether any of vLLM's knobs is set (`--engine verl` only: the built-in probe has no vLLM)."""
        return any(getattr(self, name) is not None for name in VLLM_KNOBS)

    @property
    def token_budget(self) -> int:
        """Tokens per GPU micro-batch under dynamic batch size: the knob, else the micro batch's tokens."""
        return self.ppo_max_token_len_per_gpu or self.micro_batch_size * self.sequence_length

    @property
    def token_budgets(self) -> tuple[int, int, int]:
        """(update, forward passes, critic) token budgets per GPU under dynamic batch size."""
        update = self.token_budget
        return (
            update,
            self.log_prob_max_token_len_per_gpu or update,
            self.critic_max_token_len_per_gpu or update,
        )

    def with_fixed_micro_batches(self, gpus: int) -> ProbeConfig:
        """The config as fixed micro batches: under dynamic batch size verl packs whole sequences (every one
        is Lp + Lr tokens long in a probe) up to the token budget, at most a GPU's share of the mini batch
        (update) or of the train batch (forward passes). Unchanged without dynamic batch size."""
        if not self.use_dynamic_bsz:
            return self
        per_budget = max(1, self.token_budget // self.sequence_length)
        mini_share = self.micro_batch_size * self.gradient_accumulation_steps
        micro = min(per_budget, mini_share)
        forward = min(per_budget, max(1, self.train_batch_size // gpus))
        return dataclasses.replace(self, micro_batch_size=micro, log_prob_micro_batch_size=forward)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


KNOB_NAMES = tuple(f.name for f in fields(ProbeConfig))
# Under dynamic batch size verl cuts every micro-batch by the token budget and never reads the micro batch
# sizes (verl/workers/engine/utils.py, prepare_micro_batches): configs that differ only in them run one job.
UNREAD_UNDER_DYNAMIC_BSZ = ("micro_batch_size", "gradient_accumulation_steps", "log_prob_micro_batch_size")


def job_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config's fields (`ProbeConfig.to_dict()`) as the job verl runs: under dynamic batch size the sizes it
    does not read are dropped, the samples per GPU per optimizer step (m·g) kept."""
    job = dict(config)
    if job.get("use_dynamic_bsz"):
        job["mini_batch_per_gpu"] = job["micro_batch_size"] * job["gradient_accumulation_steps"]
        for key in UNREAD_UNDER_DYNAMIC_BSZ:
            job.pop(key, None)
    return job


def same_job(stored: Any, wanted: dict[str, Any]) -> bool:
    """Whether a trial's stored config dict runs the job `wanted` (a `job_of`)."""
    return isinstance(stored, dict) and job_of(stored) == wanted


VERL_DEFAULT_UTILIZATION = 0.5  # rollout.gpu_memory_utilization when unset (verl's rollout.yaml)
# vLLM's knobs: measured by verl itself only (`--engine verl`); the built-in probe has no vLLM
VLLM_KNOBS = ("gpu_memory_utilization", "tensor_model_parallel_size", "max_num_seqs")
# the token budgets under dynamic batch size: the update's, the forward passes', the critic's
BUDGET_KNOBS = ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu", "critic_max_token_len_per_gpu")
VERL_KNOBS = (*VLLM_KNOBS, "use_dynamic_bsz", *BUDGET_KNOBS)
_BOOL_WORDS = {
    "true": True,
    "1": True,
    "yes": True,
    "on": True,
    "false": False,
    "0": False,
    "no": False,
    "off": False,
}


def usable_cores() -> int:
    """Logical cores this process may run on: its CPU affinity (taskset, a batch scheduler's binding), not
    every core the machine has. Probes split these between their ranks."""
    return max(1, len(os.sched_getaffinity(0)))


def physical_cores() -> int:
    """Cores this process may use, counting physical cores only (the seed article: never more rollout workers
    than that)."""
    import psutil

    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return max(1, min(physical, usable_cores()))


def _field_types() -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(ProbeConfig)}


def _convert(key: str, raw: str, type_name: str) -> Any:
    text = raw.strip()
    if "bool" in type_name:
        if text.lower() not in _BOOL_WORDS:
            raise UserError(f"--set {key}={raw!r}: expected true or false")
        return _BOOL_WORDS[text.lower()]
    if "None" in type_name and text.lower() in ("none", "null", ""):
        return None
    if "int" in type_name:
        try:
            return int(text)
        except ValueError:
            raise UserError(f"--set {key}={raw!r}: expected a whole number, e.g. {key}=8") from None
    if "float" in type_name:
        try:
            return float(text)
        except ValueError:
            raise UserError(f"--set {key}={raw!r}: expected a number, e.g. {key}=0.05") from None
    return text


# --- the mini batch: the name every command, space and best_config.yaml takes ------------------------------

# Samples per optimizer step over all GPUs, M = m·g·W (verl's ppo_mini_batch_size × rollout_n). A config holds
# the accumulation steps g; every input may give M instead, and g follows from the micro batch and the GPUs.
MINI_BATCH = "mini_batch_size"


def mini_batch_size(config: ProbeConfig, gpus: int) -> int:
    return config.micro_batch_size * config.gradient_accumulation_steps * gpus


def resolve_mini_batch(values: Mapping[str, Any], gpus: int, where: str = "--set ") -> dict[str, Any]:
    """`values` with `mini_batch_size` M replaced by `gradient_accumulation_steps` g = M / (W·m).

    {"mini_batch_size": 16, "micro_batch_size": 4} on 2 GPUs -> {"micro_batch_size": 4,
    "gradient_accumulation_steps": 2}. A mini batch that is not whole micro-batches on every GPU, or a g given
    too that disagrees, is a UserError naming the fix; without M the values are returned unchanged."""
    values = dict(values)
    if values.get(MINI_BATCH) is None:
        values.pop(MINI_BATCH, None)
        return values
    mini = int(values.pop(MINI_BATCH))
    micro = int(values.get("micro_batch_size") or ProbeConfig.micro_batch_size)
    step = micro * gpus
    if mini < 1 or mini % step:
        suggestion = round_up(max(mini, 1), step)
        raise UserError(
            f"{where}mini_batch_size={mini}: not whole micro-batches on every GPU (micro batch {micro} × "
            f"{gpus} GPU(s) = {step}); use a multiple of {step}, e.g. mini_batch_size={suggestion}"
        )
    derived, given = mini // step, values.get("gradient_accumulation_steps")
    if given is not None and given != derived:
        raise UserError(
            f"{where}gradient_accumulation_steps={given} disagrees with mini_batch_size={mini} (= micro "
            f"batch {micro} × {derived} step(s) × {gpus} GPU(s)); give only mini_batch_size: the steps follow"
        )
    values["gradient_accumulation_steps"] = derived
    return values


def parse_sets(items: list[str]) -> dict[str, Any]:
    """Turn `["train_batch_size=16", ...]` into typed values; unknown knobs and bad syntax are UserErrors.
    `mini_batch_size` is taken as the spaces take it (`resolve_mini_batch` makes it accumulation steps)."""
    types = {**_field_types(), MINI_BATCH: "int"}
    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"--set {item!r}: expected KNOB=VALUE, e.g. --set micro_batch_size=4")
        if key not in types:
            known = ", ".join(sorted({*KNOB_NAMES, MINI_BATCH}))
            raise UserError(f"--set {key!r}: unknown knob; known knobs are {known}")
        values[key] = _convert(key, raw, types[key])
    return values


# --- sizes that keep every divisibility rule (autotune.config.rules), for the fixes a finding suggests ------


def train_batch_step(config: ProbeConfig, gpus: int) -> int:
    """What every valid train batch T is a multiple of, the other knobs held: the rollout batch (T % R), the
    mini batch m·g·W (whole optimizer steps) and lm·W (forward micro-batches split each GPU's share)."""
    mini = config.micro_batch_size * config.gradient_accumulation_steps * gpus
    return math.lcm(config.rollout_batch_size, mini, config.forward_micro_batch_size * gpus)


def train_batch_fixes(config: ProbeConfig, gpus: int) -> tuple[int, ...]:
    """The valid train batches nearest to config's, the next above and the next below (when there is one), so
    that a finding's fix never trades one broken rule for another (18 for a micro batch of 3 broke T % R)."""
    step, value = train_batch_step(config, gpus), config.train_batch_size
    up, down = round_up(value, step), value // step * step
    return (up,) if down in (0, up) else (up, down)


def rollout_batch_fix(config: ProbeConfig, gpus: int) -> int | None:
    """The rollout batch nearest to config's that holds whole prompt groups on every GPU (a multiple of
    gpus·rollout_n) and divides the train batch, preferring the larger; None when no such size exists."""
    group, value, train = gpus * config.rollout_n, config.rollout_batch_size, config.train_batch_size
    if train % group:  # a multiple of the group that divides T needs the group to divide T
        return None
    fits = [group * d for d in divisors(train // group)]
    return min(fits, key=lambda d: (abs(d - value), -d))
