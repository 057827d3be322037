"""Every rule a configuration must keep, written once: `config_findings` returns each broken rule as a
`Finding` (key, value, rule, fix). `raise_for` makes one `UserError` of them (`autotune probe --set`),
`autotune check` prints them, the study and the verl export refuse a config that has any.

The rules and why (docs/design.md, "Knobs and invariants"), with W GPUs and n = rollout_n:

    sizes >= 1                      the divisibility rules below divide by them
    T % R == 0                      else each step generates more samples than it trains on: the rest are
                                    dropped, the trained distribution shifts and the KL can explode
    R % (W·n) == 0                  every GPU generates the same number of whole prompt groups
    T % (m·g·W) == 0                every optimizer step gets g full micro-batches on every GPU
    (T/W) % lm == 0                 forward-only micro-batches split a GPU's share evenly (verl's rule)
    w <= physical cores             more DataLoader workers than cores compete for them: rollout stalls
    Lp + Lr <= max positions        the model cannot attend beyond its position embeddings
    GRPO: n >= 2                    GRPO normalises rewards within a group of answers to one prompt

verl's own knobs (`--engine verl` only; None = the export's rule or verl's default), verl 0.9.1's paths:

    0 < gpu_memory_utilization < 1  vLLM's share of the card; the training states need the rest
    W % tensor_model_parallel == 0  rollout replicas = GPUs // TP (workers/rollout/llm_server.py:434-460):
                                    a TP that does not divide W leaves GPUs without a rollout engine
    max_num_seqs >= 1
    token budget >= Lp + Lr         verl asserts max_token_len >= the longest sequence before it cuts
                                    micro-batches (utils/seqlen_balancing.py:384-386)
    token budget only with use_dynamic_bsz: verl reads it only then
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from autotune.config.knobs import (
    ALGORITHMS,
    BUDGET_KNOBS,
    MAX_KL_COEF,
    MIN_LOADER_WORKERS,
    SHARDINGS,
    VLLM_KNOBS,
    ProbeConfig,
    physical_cores,
    rollout_batch_fix,
    train_batch_fixes,
)
from autotune.config.numbers import MAX_INT, MAX_RANKS, number_problem
from autotune.errors import UserError, single_line
from autotune.units import divisors, round_up

__all__ = [
    "POSITIVE_KNOBS",
    "Finding",
    "builtin_vllm_findings",
    "config_findings",
    "head_findings",
    "model_findings",
    "position_findings",
    "problems",
    "raise_for",
    "trl_vllm_findings",
    "value_findings",
    "verl_knob_findings",
    "worker_findings",
]

POSITIVE_KNOBS = (
    "rollout_batch_size",
    "train_batch_size",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "max_prompt_length",
    "max_response_length",
    "rollout_n",
    "lora_r",
)


@dataclass(frozen=True)
class Finding:
    """One broken rule (or, with severity "note", context worth saying), with its fix."""

    check: str  # values, divisibility, workers, lengths, memory, reward, rollout, schema, verl, gpus
    problem: str  # what is wrong, with the rule
    fix: str = ""
    severity: str = "problem"  # "problem" (exit 1, or a UserError) or "note" (context only)
    key: str = ""  # the knob or file key it is about, when there is one
    value: Any = None

    @property
    def line(self) -> str:
        """The finding as one line: the problem, then the fix."""
        return single_line(self.problem + (f"; fix: {self.fix}" if self.fix else ""))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def problems(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "problem"]


def raise_for(findings: list[Finding]) -> None:
    """One UserError, on one line, naming every problem among `findings`; nothing when there is none."""
    found = problems(findings)
    if found:
        raise UserError("; ".join(f.line for f in found))


def config_findings(
    config: ProbeConfig,
    world_size: int,
    cores: int | None = None,
    model_spec: Any = None,
    device: str | None = None,
) -> list[Finding]:
    """Every rule `config` breaks on `world_size` GPUs; `cores` defaults to this machine's physical cores,
    the model's rules (positions, attention heads) run when `model_spec` (a ModelSpec) is given, the offload
    rule when `device` is."""
    found = value_findings(config)
    if found:  # the divisibility rules below need positive sizes
        return found
    found += offload_findings(config, device)
    found += verl_knob_findings(config, world_size)
    found += _group_findings(config, world_size)
    found += _rollout_findings(config, world_size)
    found += _mini_batch_findings(config, world_size)
    found += worker_findings(config, cores)
    if model_spec is not None:
        found += model_findings(config, model_spec)
    return found


def value_findings(c: ProbeConfig) -> list[Finding]:
    """Sizes are whole numbers >= 1 (the forward micro batch may be unset; loader workers may be 0), kl_coef a
    finite number >= 0, the algorithm a known one; the same bounds as every number a user gives
    (`autotune.config.numbers`)."""
    bounds: dict[str, dict[str, Any]] = {key: {"integer": True, "minimum": 1} for key in POSITIVE_KNOBS}
    bounds["lora_alpha"] = {"integer": True, "minimum": 1}
    bounds["num_rollout_workers"] = {"integer": True, "minimum": MIN_LOADER_WORKERS}
    bounds["kl_coef"] = {"minimum": 0.0, "maximum": MAX_KL_COEF}
    if c.log_prob_micro_batch_size is not None:
        bounds["log_prob_micro_batch_size"] = {"integer": True, "minimum": 1}
    found = []
    for key, bound in bounds.items():
        value = getattr(c, key)
        problem = number_problem(value, **bound)
        if problem:
            found.append(
                Finding(
                    "values", f"{key}={value}: {problem}", f"{key}: {_example(bound)}", key=key, value=value
                )
            )
    if c.sharding not in SHARDINGS:
        fix = f"sharding: one of {', '.join(SHARDINGS)}"
        found.append(
            Finding("values", f"sharding={c.sharding}: unknown", fix, "problem", "sharding", c.sharding)
        )
    if c.algorithm not in ALGORITHMS:
        fix = f"algorithm: one of {', '.join(ALGORITHMS)}"
        found.append(
            Finding("values", f"algorithm={c.algorithm}: unknown", fix, "problem", "algorithm", c.algorithm)
        )
    return found


def _example(bound: dict[str, Any]) -> str:
    if bound.get("integer"):
        return f"a whole number from 1 to {MAX_INT}"
    return f"a number from 0 to {bound['maximum']:g}"


def _group_findings(c: ProbeConfig, gpus: int) -> list[Finding]:
    if c.algorithm != "grpo" or c.rollout_n >= 2:
        return []
    return [
        Finding(
            "divisibility",
            f"rollout_n={c.rollout_n}: GRPO normalises rewards within a group of answers to one prompt, "
            f"so rollout_n must be >= 2",
            "rollout_n: 4",
            key="rollout_n",
            value=c.rollout_n,
        )
    ]


def _rollout_findings(c: ProbeConfig, gpus: int) -> list[Finding]:
    found = []
    T, R = c.train_batch_size, c.rollout_batch_size
    if T % R:
        rollouts = -(-T // R)
        dropped = rollouts * R - T
        # the fixes keep every other rule too (whole mini-batches, forward micro-batches, prompt groups)
        fixes = train_batch_fixes(c, gpus)
        options = [f"train_batch_size: {fixes[0]} ({fixes[0] // R} rollouts)"]
        options += [f"{t} ({t // R})" for t in fixes[1:]]
        rollout = rollout_batch_fix(c, gpus)
        # no rollout batch of whole prompt groups divides T when gpus×rollout_n does not: T must change
        other = f", or rollout_batch_size: {rollout}" if rollout else ""
        found.append(
            Finding(
                "divisibility",
                f"train_batch_size={T} is not a multiple of rollout_batch_size={R}: each step generates "
                f"{rollouts}×{R}={rollouts * R} samples and trains on {T}, so {dropped} "
                f"({dropped / (rollouts * R):.0%}) are dropped: the trained distribution shifts and the KL "
                f"can explode",
                " or ".join(options) + other,
                key="train_batch_size",
                value=T,
            )
        )
    group = gpus * c.rollout_n
    if R % group:
        found.append(
            Finding(
                "divisibility",
                f"rollout_batch_size={R} is not a multiple of gpus×rollout_n={gpus}×{c.rollout_n}: every GPU "
                f"must generate the same number of whole prompt groups",
                _group_fix(c, gpus),
                key="rollout_batch_size",
                value=R,
            )
        )
    return found


def _group_fix(c: ProbeConfig, gpus: int) -> str:
    """A rollout batch of whole prompt groups per GPU that also divides the train batch; when none does (the
    train batch is not a multiple of gpus×rollout_n), the next group multiple with a train batch that fits."""
    rollout = rollout_batch_fix(c, gpus)
    if rollout:
        return f"rollout_batch_size: {rollout}"
    grouped = dataclasses.replace(c, rollout_batch_size=round_up(c.rollout_batch_size, gpus * c.rollout_n))
    return (
        f"rollout_batch_size: {grouped.rollout_batch_size} with train_batch_size: "
        f"{train_batch_fixes(grouped, gpus)[0]}"
    )


def _mini_batch_findings(c: ProbeConfig, gpus: int) -> list[Finding]:
    m, g, T = c.micro_batch_size, c.gradient_accumulation_steps, c.train_batch_size
    mini = m * g * gpus
    found = []
    if T % mini:
        # train batches valid for every rule, not this one only (18 for m=3 broke T % R=8)
        fixes = " or ".join(str(t) for t in train_batch_fixes(c, gpus))
        found.append(
            Finding(
                "divisibility",
                f"train_batch_size={T} is not a multiple of micro_batch_size×gradient_accumulation_steps×"
                f"gpus={m}×{g}×{gpus}={mini}: every optimizer step needs exactly {g} full micro-batches on "
                f"every GPU (verl rejects a partial mini-batch)",
                f"train_batch_size: {fixes}, or a micro_batch_size×gradient_accumulation_steps whose "
                f"product×gpus divides it",
                key="train_batch_size",
                value=T,
            )
        )
    forward = c.forward_micro_batch_size
    if T % gpus == 0 and (T // gpus) % forward:
        share = T // gpus
        divisor = max(d for d in divisors(share) if d <= forward)
        found.append(
            Finding(
                "divisibility",
                f"log_prob_micro_batch_size={forward} (the forward-only micro batch; none means "
                f"micro_batch_size) does not divide the per-GPU share train_batch_size/gpus={share}: "
                f"forward-only micro-batches must split it evenly (verl's rule)",
                f"log_prob_micro_batch_size: {divisor}, or train_batch_size: {train_batch_fixes(c, gpus)[0]}",
                key="log_prob_micro_batch_size",
                value=forward,
            )
        )
    return found


def verl_knob_findings(c: ProbeConfig, gpus: int) -> list[Finding]:
    """verl's own knobs, where set: the rules of the module docstring."""
    found = _verl_value_findings(c)
    if found:
        return found
    tp = c.tensor_model_parallel_size
    if tp is not None and gpus % tp:
        fix = f"tensor_model_parallel_size: one of {', '.join(map(str, divisors(gpus)))}"
        problem = (
            f"tensor_model_parallel_size={tp} does not divide the {gpus} GPU(s): verl starts GPUs // TP "
            f"rollout replicas, and the rest would have no rollout engine"
        )
        found.append(Finding("verl", problem, fix, key="tensor_model_parallel_size", value=tp))
    return found + _budget_findings(c)


def _budget_findings(c: ProbeConfig) -> list[Finding]:
    """A token budget is read only with dynamic batch size, and holds the longest sequence verl allows
    (verl/utils/seqlen_balancing.py `rearrange_micro_batches` asserts max_token_len >= the longest)."""
    found = []
    for key in BUDGET_KNOBS:
        budget = getattr(c, key)
        if budget is None:
            continue
        if not c.use_dynamic_bsz:
            problem = f"{key}={budget} without use_dynamic_bsz: verl reads it only then"
            found.append(
                Finding("verl", problem, f"use_dynamic_bsz: true, or no {key}", key=key, value=budget)
            )
        elif budget < c.sequence_length:
            problem = (
                f"{key}={budget} is below one sequence, max_prompt_length+max_response_length="
                f"{c.sequence_length}: verl asserts a micro-batch's token budget holds the longest sequence"
            )
            fix = f"{key}: {c.sequence_length} or more"
            found.append(Finding("verl", problem, fix, key=key, value=budget))
    return found


def builtin_vllm_findings(c: ProbeConfig) -> list[Finding]:
    """vLLM's knobs are measured by the trainer that runs vLLM: verl (its pool), or TRL (vLLM colocated in
    each training process: its share only, on CUDA). The built-in probe has no vLLM pool and no
    tensor-parallel rollout. Dynamic batch size and its budgets it packs as verl does."""
    if not c.uses_vllm_knobs:
        return []
    named = [name for name in VLLM_KNOBS if getattr(c, name) is not None]
    problem = (
        f"{', '.join(named)}: vLLM's knobs, measured only with --engine verl or, for the share, --engine trl "
        f"on CUDA (the built-in probe has no vLLM pool or tensor-parallel rollout)"
    )
    return [Finding("verl", problem, "--engine verl, or leave them out", key=named[0])]


def trl_vllm_findings(c: ProbeConfig, device: str | None = None) -> list[Finding]:
    """TRL colocates vLLM with a share of the card (vllm_gpu_memory_utilization); the rest autotune does not
    search for TRL, and vLLM needs CUDA (`device` None: not known yet)."""
    if not c.uses_vllm_knobs:
        return []
    named = [name for name in VLLM_KNOBS if getattr(c, name) is not None]
    others = [name for name in named if name != "gpu_memory_utilization"]
    if others:
        problem = f"{', '.join(others)}: not searched for TRL (it sets vLLM's sequences itself)"
        return [
            Finding(
                "trl", problem, "leave them out; gpu_memory_utilization is TRL's vLLM share", key=others[0]
            )
        ]
    if device is not None and device != "cuda":
        problem = (
            f"gpu_memory_utilization={c.gpu_memory_utilization}: TRL's vLLM colocation (use_vllm) runs on "
            f"CUDA only, not on {device}"
        )
        return [
            Finding(
                "trl",
                problem,
                "leave it out on CPU (TRL then generates with transformers)",
                key="gpu_memory_utilization",
            )
        ]
    return []


def _verl_value_findings(c: ProbeConfig) -> list[Finding]:
    """Numbers of the right kind: a share strictly between 0 and 1, whole sizes >= 1, a boolean switch."""
    bounds: dict[str, dict[str, Any]] = {
        "gpu_memory_utilization": {
            "minimum": 0.0,
            "maximum": 1.0,
            "open_minimum": True,
            "open_maximum": True,
        },
        "tensor_model_parallel_size": {"integer": True, "minimum": 1, "maximum": MAX_RANKS},
        "max_num_seqs": {"integer": True, "minimum": 1},
        **{name: {"integer": True, "minimum": 1} for name in BUDGET_KNOBS},
    }
    found = []
    for key, bound in bounds.items():
        value = getattr(c, key)
        problem = None if value is None else number_problem(value, **bound)
        if problem:
            fix = f"{key}: " + (
                "a number between 0 and 1, e.g. 0.5"
                if key == "gpu_memory_utilization"
                else "a whole number >= 1, or leave it out (the rule's or verl's default)"
            )
            found.append(Finding("values", f"{key}={value}: {problem}", fix, key=key, value=value))
    if not isinstance(c.use_dynamic_bsz, bool):
        problem = f"use_dynamic_bsz={c.use_dynamic_bsz}: must be true or false"
        found.append(Finding("values", problem, "use_dynamic_bsz: false", key="use_dynamic_bsz"))
    return found


def offload_findings(c: ProbeConfig, device: str | None = None) -> list[Finding]:
    """Offload moves FSDP's sharded states to the CPU between uses (verl's param/optimizer offload): it needs
    sharded states, and a GPU to offload from (on a CPU there is nowhere else to put them)."""
    if not c.offloaded:
        return []
    which = next(k for k in ("param_offload", "optimizer_offload", "offload_policy") if getattr(c, k))
    if not c.sharded:
        fix = "sharding: full_shard (or shard_grad_op), or no offload"
        return [
            Finding("offload", f"{which}=true with sharding={c.sharding}: offload is FSDP's", fix, key=which)
        ]
    if device == "cpu":
        problem = f"{which}=true on CPU: offload moves the states from a GPU to the CPU, and there is no GPU"
        return [Finding("offload", problem, f"{which}: false (offload is measured on CUDA)", key=which)]
    return []


def worker_findings(c: ProbeConfig, cores: int | None = None) -> list[Finding]:
    """More DataLoader workers than physical cores compete for them, and rollout stalls."""
    limit = physical_cores() if cores is None else cores
    if c.num_rollout_workers <= limit:
        return []
    where = "physical cores of this machine" if cores is None else "cores given"
    return [
        Finding(
            "workers",
            f"num_rollout_workers={c.num_rollout_workers} exceeds the {limit} {where}: workers "
            f"compete for cores and rollout stalls",
            f"num_rollout_workers: {limit}",
            key="num_rollout_workers",
            value=c.num_rollout_workers,
        )
    ]


def model_findings(c: ProbeConfig, model_spec: Any, tensor_parallel: int | None = None) -> list[Finding]:
    """The rules the model sets: lengths within its positions, a rollout tensor-parallel size (the config's,
    else `tensor_parallel`: a file's rollout engine) that splits its attention heads."""
    tp = c.tensor_model_parallel_size or tensor_parallel
    return position_findings(c, model_spec) + head_findings(tp, model_spec)


def head_findings(tensor_parallel: int | None, model_spec: Any) -> list[Finding]:
    """vLLM splits the attention heads over the tensor-parallel ranks and refuses to start when they do not
    divide evenly (vllm/config/model.py, ModelConfig.verify_with_parallel_config: "Total number of attention
    heads (28) must be divisible by tensor parallel size (8)")."""
    heads = getattr(model_spec.config, "num_attention_heads", None)
    if not tensor_parallel or not heads or heads % tensor_parallel == 0:
        return []
    problem = (
        f"tensor_model_parallel_size={tensor_parallel} does not divide {model_spec.name}'s {heads} attention "
        f"heads: vLLM splits the heads over the tensor-parallel ranks and refuses to start"
    )
    fix = f"tensor_model_parallel_size: a divisor of {heads} ({', '.join(map(str, divisors(heads)))})"
    return [Finding("verl", problem, fix, key="tensor_model_parallel_size", value=tensor_parallel)]


def position_findings(c: ProbeConfig, model_spec: Any) -> list[Finding]:
    """Prompt plus response must fit the model's position embeddings."""
    limit = getattr(model_spec.config, "max_position_embeddings", None)
    if not limit or c.sequence_length <= limit:
        return []
    return [
        Finding(
            "lengths",
            f"max_prompt_length+max_response_length={c.sequence_length} exceeds {model_spec.name}'s "
            f"max_position_embeddings={limit}",
            "shorten the lengths",
            key="max_response_length",
            value=c.max_response_length,
        )
    ]
