"""What to change when a configuration does not fit: one ordered list of remedies, for the report and `check`.

The order is the seed article's first aid for an out-of-memory run: halve the micro batch first, then the
forward-only micro batch, then the rollout batch (its KV cache; the train batch stays), then shorten the
lengths (never below what the data needs), then trade time for
memory (gradient checkpointing), then change what is trained (LoRA) or where the states live (FSDP with CPU
offload). Raising gradient accumulation does not lower the peak: it only lengthens the step.

    [r.change for r in remedies(config)]          # the report's tips for a trial that did not fit
    first_aid(arch, config, gpus, card, ...)      # `check`: each step on top of the previous, with its peak
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autotune.config.knobs import ProbeConfig
from autotune.memory.model import Architecture
from autotune.memory.sharded import estimate_memory, gib
from autotune.units import round_up

__all__ = ["Remedy", "first_aid", "remedies", "shorter_lengths"]

GRADIENT_ACCUMULATION_NOTE = (
    "raising gradient_accumulation_steps does not lower the peak: it only lengthens the step"
)


@dataclass(frozen=True)
class Remedy:
    """One change that lowers the peak: its name, what to do, and the config (and state layout) after it."""

    name: str  # micro, forward_micro, rollout, lengths, checkpointing, lora, offload
    change: str
    config: ProbeConfig


def shorter_lengths(
    config: ProbeConfig, prompt_suggestion: int | None = None, response_suggestion: int | None = None
) -> tuple[int, int]:
    """The data's suggestions where they are shorter than the config's lengths, else half (multiples of 8)."""
    half = (
        max(8, round_up(config.max_prompt_length // 2, 8)),
        max(8, round_up(config.max_response_length // 2, 8)),
    )
    if prompt_suggestion is None:
        return half
    prompt = min(config.max_prompt_length, prompt_suggestion)
    response = min(config.max_response_length, response_suggestion or config.max_response_length)
    unchanged = (prompt, response) == (config.max_prompt_length, config.max_response_length)
    return half if unchanged else (prompt, response)


def remedies(config: ProbeConfig, lengths: tuple[int, int] | None = None, gpus: int = 1) -> list[Remedy]:
    """Single changes that lower the peak of `config` on `gpus` GPUs, in first-aid order (see the module
    docstring)."""
    c, found = config, []
    if c.micro_batch_size > 1:
        m = c.micro_batch_size // 2
        found.append(
            Remedy("micro", f"micro_batch_size {c.micro_batch_size}→{m}", _with(c, micro_batch_size=m))
        )
    if c.forward_micro_batch_size > c.micro_batch_size:
        lm = c.forward_micro_batch_size // 2
        change = f"log_prob_micro_batch_size {c.forward_micro_batch_size}→{lm}"
        found.append(Remedy("forward_micro", change, _with(c, log_prob_micro_batch_size=lm)))
    half = c.rollout_batch_size // 2
    if c.rollout_batch_size % 2 == 0 and half % (gpus * c.rollout_n) == 0:
        change = f"rollout_batch_size {c.rollout_batch_size}→{half}"
        found.append(Remedy("rollout", change, _with(c, rollout_batch_size=half)))
    lp, lr = lengths or shorter_lengths(c)
    if (lp, lr) != (c.max_prompt_length, c.max_response_length):
        change = (
            f"max_prompt_length {c.max_prompt_length}→{lp}, max_response_length {c.max_response_length}→{lr}"
        )
        found.append(Remedy("lengths", change, _with(c, max_prompt_length=lp, max_response_length=lr)))
    if not c.gradient_checkpointing:
        found.append(
            Remedy("checkpointing", "gradient_checkpointing: true", _with(c, gradient_checkpointing=True))
        )
    if not c.use_lora:
        found.append(Remedy("lora", f"use_lora: true (r={c.lora_r})", _with(c, use_lora=True)))
    if not c.offload_policy:
        change = "sharding: full_shard with offload_policy: true (states on the CPU, Adam steps there)"
        found.append(Remedy("offload", change, _with(c, sharding="full_shard", offload_policy=True)))
    return found


def _with(config: ProbeConfig, **changes: object) -> ProbeConfig:
    return dataclasses.replace(config, **changes)


def first_aid(
    arch: Architecture,
    config: ProbeConfig,
    gpus: int,
    card_bytes: float,
    lengths: tuple[int, int] | None = None,
) -> str:
    """First aid for a config (held as it says) predicted not to fit `card_bytes`: each step on top of the
    previous, with the predicted peak after it (CUDA priors, as `estimate_memory`)."""

    def peak(c: ProbeConfig) -> float:
        return estimate_memory(arch, c, gpus).peak

    def mark(value: float) -> str:
        return f"{gib(value)} GiB" + (" fits" if value <= card_bytes else "")

    by_name = {r.name: r for r in remedies(config, lengths, gpus)}
    current, steps = config, []
    if "micro" in by_name:
        current = by_name["micro"].config
        steps.append(f"{by_name['micro'].change}: {mark(peak(current))}")
    if peak(current) > card_bytes and "rollout" in by_name:
        current = _with(current, rollout_batch_size=by_name["rollout"].config.rollout_batch_size)
        steps.append(f"+ {by_name['rollout'].change}: {mark(peak(current))}")
    lp, lr = lengths or shorter_lengths(config)
    if peak(current) > card_bytes and "lengths" in by_name:
        current = _with(current, max_prompt_length=lp, max_response_length=lr)
        steps.append(f"+ {by_name['lengths'].change}: {mark(peak(current))}")
    options = []
    if peak(current) > card_bytes and "lora" in by_name:
        options.append(f"+ {by_name['lora'].change}: {mark(peak(_with(current, use_lora=True)))}")
    if peak(current) > card_bytes and "offload" in by_name:
        offloaded = _with(current, sharding="full_shard", offload_policy=True)
        options.append(f"+ {by_name['offload'].change}: {mark(peak(offloaded))}")
    if options:
        steps.append(" or ".join(options))
    numbered = [f"{i}) {step}" for i, step in enumerate(steps, start=1)]
    tail = ""
    if "checkpointing" in by_name:
        tail = f"Also gradient_checkpointing: true alone: {mark(peak(by_name['checkpointing'].config))}. "
    return f"in first-aid order: {'; '.join(numbered)}. {tail}{GRADIENT_ACCUMULATION_NOTE.capitalize()}"
