"""What to change when a configuration does not fit: one ordered list of remedies, for the report and `check`.

The order is the seed article's first aid for an out-of-memory run: halve the micro batch first, then the
forward-only micro batch (verl's passes; under dynamic batch size the token budgets instead), or the rollout
batch (its KV cache; the train batch stays) where the trainer generates in the training process, then
shorten the lengths (never below what the data needs), then trade time for memory (gradient checkpointing),
then change what is trained (LoRA) or where the states live (FSDP with CPU offload). Raising gradient
accumulation does not lower the peak: it only lengthens the step.

`check`'s first aid offers only fixes that fit, each whole with its predicted peak: a switch that changes
no batch and no length (`switches`: gradient checkpointing on, the states sharded over the GPUs) alone first;
then the batch knobs halved while that lowers the peak, with what else is needed on top; then LoRA or
offload alone. A change that lowers nothing (its phase does not decide the peak) is never offered.

    [r.change for r in remedies(config)]          # the report's tips for a trial that did not fit
    first_aid(model, config, limit, lengths)      # `check`: "fits with any one of: 1) ...: 63.3 GiB; 2) ..."
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from autotune.config.knobs import ProbeConfig
from autotune.memory.calibration import MemoryModel
from autotune.units import gib, round_up

__all__ = ["Remedy", "first_aid", "remedies", "shorter_lengths", "switches", "trl_first_aid"]

GRADIENT_ACCUMULATION_NOTE = (
    "raising gradient_accumulation_steps does not lower the peak: it only lengthens the step"
)


@dataclass(frozen=True)
class Remedy:
    """One change that lowers the peak: its name, what to do, and the config (and state layout) after it."""

    name: str  # micro, forward_micro, budget, rollout, lengths, checkpointing, lora, offload
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
    if c.use_dynamic_bsz:  # verl cuts micro batches by the token budgets: the micro batch sizes are unread
        budget = _halved_budgets(c)
        if budget is not None:
            found.append(budget)
    elif c.micro_batch_size > 1:
        m = c.micro_batch_size // 2
        found.append(
            Remedy("micro", f"micro_batch_size {c.micro_batch_size}→{m}", _with(c, micro_batch_size=m))
        )
    if c.forward_micro_batch_size > c.micro_batch_size and not c.use_dynamic_bsz:
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


BUDGETS = ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu", "critic_max_token_len_per_gpu")


def _halved_budgets(c: ProbeConfig) -> Remedy | None:
    """Every token budget halved, none below one sequence (verl asserts a budget holds the longest)."""
    before = c.token_budgets
    after = tuple(max(c.sequence_length, b // 2) for b in before)
    if after == before:
        return None
    shown = ", ".join(f"{name} {old}→{new}" for name, old, new in zip(BUDGETS, before, after, strict=True))
    return Remedy("budget", shown, _with(c, **dict(zip(BUDGETS, after, strict=True))))


def _with(config: ProbeConfig, **changes: Any) -> ProbeConfig:
    return dataclasses.replace(config, **changes)


def switches(config: ProbeConfig, gpus: int = 1) -> list[Remedy]:
    """Changes that cost no batch and no length, only time or traffic: gradient checkpointing on, and the
    states sharded over the GPUs (FSDP full-shard) when they are replicated on several."""
    found = []
    if not config.gradient_checkpointing:
        change = "gradient_checkpointing: true"
        found.append(Remedy("checkpointing", change, _with(config, gradient_checkpointing=True)))
    if gpus > 1 and not config.sharded:
        change = f"sharding: full_shard (FSDP: states ÷ {gpus})"
        found.append(Remedy("sharding", change, _with(config, sharding="full_shard")))
    return found


CHANGES = {  # the fields each remedy changes, to apply it on top of others
    "micro": ("micro_batch_size",),
    "forward_micro": ("log_prob_micro_batch_size",),
    "budget": BUDGETS,
    "rollout": ("rollout_batch_size",),
    "lengths": ("max_prompt_length", "max_response_length"),
    "checkpointing": ("gradient_checkpointing",),
    "sharding": ("sharding",),
    "lora": ("use_lora",),
    "offload": ("sharding", "offload_policy"),
}


def _on_top(current: ProbeConfig, remedy: Remedy) -> ProbeConfig:
    return _with(current, **{name: getattr(remedy.config, name) for name in CHANGES[remedy.name]})


def first_aid(
    model: MemoryModel, config: ProbeConfig, limit: float, lengths: tuple[int, int] | None = None
) -> str:
    """First aid for a config (held as it says) predicted above `limit` bytes per rank by `model` (the
    study's memory model). Every fix offered fits, each a whole change with its predicted peak: a switch that
    fits alone (no batch or length changes) first; then the batch knobs in the article's order, each halved
    while that lowers the peak (a knob whose halving lowers nothing, because another phase decides the peak,
    is not offered), with a switch, shorter lengths, LoRA or offload on top as far as needed and no further;
    then LoRA or offload alone. When nothing fits, the line says so with the closest."""

    def fits(c: ProbeConfig) -> bool:
        return model.predict(c) <= limit

    def shown(c: ProbeConfig) -> str:
        return f"{gib(model.predict(c), None)} GiB"

    alone = [r for r in switches(config, model.world_size) if fits(r.config)]
    offered = [f"{r.change} alone: {shown(r.config)}" for r in alone]
    stages = _stages(model, config, limit, lengths)
    combined = _apply(config, stages)
    texts = [text for text, _ in stages]
    if stages and fits(combined) and texts not in ([r.change] for r in alone):  # not a switch said alone
        offered.append(f"{', '.join(texts)}: {shown(combined)}")
    for name in ("lora", "offload"):  # what is trained, or where the states live, alone
        remedy = _next_remedy(model, config, name, lengths)
        if remedy is not None and fits(remedy.config) and texts != [remedy.change]:
            offered.append(f"{remedy.change} alone: {shown(remedy.config)}")
    note = GRADIENT_ACCUMULATION_NOTE.capitalize()
    if not offered:
        closest = f"{', '.join(texts)}: {shown(combined)}" if stages else f"as it is: {shown(config)}"
        return (
            f"nothing autotune can change fits {gib(limit, None)} GiB (closest, {closest}): a larger card, "
            f"more GPUs or a smaller model. {note}"
        )
    numbered = "; ".join(f"{i}) {fix}" for i, fix in enumerate(offered, start=1))
    return f"fits with any one of: {numbered}. {note}"


Stage = tuple[str, dict[str, Any]]  # a change as said, and the fields it sets


def _stages(
    model: MemoryModel, config: ProbeConfig, limit: float, lengths: tuple[int, int] | None
) -> list[Stage]:
    """The changes that make `config` fit, fewest first: the batch knobs halved while that lowers the peak,
    then a switch, shorter lengths, LoRA, offload, each only when it lowers the peak; then every change the
    rest fits without is dropped."""
    current, stages = _halve_batches(model, config, limit)
    for name in ("switch", "lengths", "lora", "offload"):
        if model.predict(current) <= limit:
            break
        remedy = _next_remedy(model, current, name, lengths)
        if remedy is not None and model.predict(_on_top(current, remedy)) < model.predict(current):
            fields = {field: getattr(remedy.config, field) for field in CHANGES[remedy.name]}
            stages.append((remedy.change, fields))
            current = _with(current, **fields)
    return _prune(model, config, stages, limit)


def _prune(model: MemoryModel, config: ProbeConfig, stages: list[Stage], limit: float) -> list[Stage]:
    """Stages that make `config` fit, without each one the rest fits without (the first ones first)."""
    if model.predict(_apply(config, stages)) > limit:
        return stages
    for stage in list(stages[:-1]):
        fewer = [s for s in stages if s is not stage]
        if model.predict(_apply(config, fewer)) <= limit:
            stages = fewer
    return stages


def _apply(config: ProbeConfig, stages: list[Stage]) -> ProbeConfig:
    for _, fields in stages:
        config = _with(config, **fields)
    return config


def _halve_batches(model: MemoryModel, config: ProbeConfig, limit: float) -> tuple[ProbeConfig, list[Stage]]:
    """The batch knobs (verl: micro, token budgets, forward micro; else micro, rollout) halved in that order
    while the config does not fit, each only while halving it lowers the peak; one stage per knob
    (`micro_batch_size 16→4`)."""
    order = ("micro", "budget", "forward_micro") if model.passes.packed else ("micro", "rollout")
    first: dict[str, ProbeConfig] = {}  # each knob halved: the config before its first halving
    current = config
    while model.predict(current) > limit:
        by_name = {r.name: r for r in remedies(current, None, model.world_size)}
        lower = [
            by_name[n]
            for n in order
            if n in by_name and model.predict(_on_top(current, by_name[n])) < model.predict(current)
        ]
        if not lower:
            break
        first.setdefault(lower[0].name, current)
        current = _on_top(current, lower[0])
    stages = [
        (_change(name, before, current), {f: getattr(current, f) for f in CHANGES[name]})
        for name, before in first.items()
    ]
    return current, stages


def _change(name: str, before: ProbeConfig, after: ProbeConfig) -> str:
    """One knob's whole change, `micro_batch_size 16→4` (the budgets: each that moved)."""
    fields = CHANGES[name]
    moved = [f for f in fields if getattr(before, f) != getattr(after, f)]
    if name == "forward_micro":
        return f"log_prob_micro_batch_size {before.forward_micro_batch_size}→{after.forward_micro_batch_size}"
    if name == "budget":
        old, new = before.token_budgets, after.token_budgets
        return ", ".join(f"{f} {o}→{n}" for f, o, n in zip(BUDGETS, old, new, strict=True) if o != n)
    return ", ".join(f"{f} {getattr(before, f)}→{getattr(after, f)}" for f in moved)


def _next_remedy(
    model: MemoryModel, current: ProbeConfig, name: str, lengths: tuple[int, int] | None
) -> Remedy | None:
    """The remedy `name` for `current`: a switch that lowers the peak most, or the article's remedy."""
    if name == "switch":
        found = switches(current, model.world_size)
        return min(found, key=lambda r: model.predict(r.config)) if found else None
    return next((r for r in remedies(current, lengths, model.world_size) if r.name == name), None)


def trl_first_aid(
    model: MemoryModel, config: ProbeConfig, limit: float, lengths: tuple[int, int] | None = None
) -> str:
    """First aid for a TRL config in TRL's fields, every fix offered fitting, with its predicted peak: the
    largest per_device_train_batch_size under the current one that divides the process's share of the mini
    batch and fits (gradient_accumulation_steps keeps the mini batch: the recipe; GRPO refuses
    auto_find_batch_size, whose halving breaks the prompt groups), then activation checkpointing, a shorter
    max_completion_length, LoRA (use_peft), each only when it lowers the peak and only as far as needed;
    activation checkpointing alone first when it fits alone."""

    def fits(c: ProbeConfig) -> bool:
        return model.predict(c) <= limit

    def lowers(before: ProbeConfig, after: ProbeConfig) -> bool:
        return model.predict(after) < model.predict(before)

    stages = _trl_micro_stage(model, config, limit)
    current = _apply(config, stages)
    _, response = lengths or shorter_lengths(current)
    later: list[Stage] = [
        ("activation_checkpointing: true", {"gradient_checkpointing": True}),
        (
            f"max_completion_length {current.max_response_length}→{response} (a recipe change)",
            {"max_response_length": response},
        ),
        (f"use_peft: true (lora_r {current.lora_r})", {"use_lora": True}),
    ]
    for text, fields in later:
        if fits(current):
            break
        if lowers(current, _with(current, **fields)):
            stages.append((text, fields))
            current = _with(current, **fields)
    stages = _prune(model, config, stages, limit)
    offered = []
    checkpointed = _with(config, gradient_checkpointing=True)
    if not config.gradient_checkpointing and fits(checkpointed):
        offered.append(f"activation_checkpointing: true alone: {gib(model.predict(checkpointed), None)} GiB")
    combined = _apply(config, stages)
    texts = [text for text, _ in stages]
    if stages and fits(combined) and texts != ["activation_checkpointing: true"]:
        offered.append(f"{', '.join(texts)}: {gib(model.predict(combined), None)} GiB")
    note = GRADIENT_ACCUMULATION_NOTE.capitalize()
    if not offered:
        closest = f"{', '.join(texts)}: " if texts else "as it is: "
        return (
            f"in TRL's fields, nothing fits {gib(limit, None)} GiB (closest, {closest}"
            f"{gib(model.predict(combined), None)} GiB): a larger card or a smaller model. {note}"
        )
    numbered = "; ".join(f"{i}) {fix}" for i, fix in enumerate(offered, start=1))
    return f"in TRL's fields, fits with any one of: {numbered}. {note}"


def _trl_micro_stage(model: MemoryModel, config: ProbeConfig, limit: float) -> list[Stage]:
    """The largest smaller per_device_train_batch_size that divides the process's share of the mini batch and
    fits (else the smallest), with the accumulation steps that keep the share; none when it lowers nothing."""
    share = config.micro_batch_size * config.gradient_accumulation_steps  # per process
    smaller = [m for m in range(config.micro_batch_size - 1, 0, -1) if share % m == 0]
    if not smaller:
        return []
    micro = next(
        (m for m in smaller if model.predict(_with(config, micro_batch_size=m)) <= limit), smaller[-1]
    )
    steps = share // micro
    fields = {"micro_batch_size": micro, "gradient_accumulation_steps": steps}
    if model.predict(_with(config, **fields)) >= model.predict(config):
        return []
    text = (
        f"per_device_train_batch_size {config.micro_batch_size}→{micro} with gradient_accumulation_steps "
        f"{config.gradient_accumulation_steps}→{steps} (the mini batch kept)"
    )
    return [(text, fields)]
