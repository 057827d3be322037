"""Everything `autotune run` settles before its first probe: the space (with the command line's model, GPUs
and data), the device, the models, the memory budget, the probe settings, and what the study will measure.

A study measures one job: the study's identity (the model's and reward model's fingerprints, the device,
the GPUs, the budget, the probe's iterations, the data's prompts) is stored with it; resuming it with another
is refused, and default study names carry the identity's fingerprint, so another job gets another study.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from autotune.config.knobs import ProbeConfig
from autotune.config.numbers import MAX_SECONDS, parse_float
from autotune.errors import UserError
from autotune.memory.model import MemoryModel
from autotune.probe.contract import ProbeSettings
from autotune.search.space import SearchSpace
from autotune.search.study import Budget
from autotune.units import GIB

__all__ = [
    "Prepared",
    "RunOptions",
    "data_prompts_file",
    "default_study_name",
    "fit_space_to_data",
    "length_knob_at_least",
    "machine_identity",
    "parse_duration",
    "prepare",
    "probe_settings",
    "resolve_budget_gib",
]

PROMPTS_LIMIT = 10_000  # prompt texts of --data the probes draw from
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'8h', '90m', '1h30m', '45s' or plain seconds; positive, finite, at most a month."""
    stripped = text.strip().lower()
    if re.fullmatch(r"[\d.e+-]+|nan|inf|infinity", stripped):
        return parse_float(stripped, "--time-budget", maximum=MAX_SECONDS)
    parts = _DURATION.findall(stripped)
    if not parts or _DURATION.sub("", stripped).strip():
        raise UserError(f"--time-budget {text!r}: expected a duration such as 8h, 90m, 1h30m or 45s")
    seconds = sum(float(value) * _UNIT_SECONDS[unit] for value, unit in parts)
    if not 0 < seconds <= MAX_SECONDS:
        raise UserError(f"--time-budget {text!r}: must be more than 0 s and at most 30 days")
    return seconds


@dataclass
class RunOptions:
    space: str = "default"
    model: str | None = None
    reward_model: str | None = None
    weights: str = "random"
    gpus: int | None = None
    device: str = "auto"
    trials: int = 20
    timeout_per_probe: float | None = None
    memory_budget_gib: float | None = None
    time_budget_seconds: float | None = None
    storage: str | None = None
    study: str | None = None
    out: Path = Path("reports")
    seed: int = 0
    trust_remote_code: bool = False
    parallel: int = 1
    data: Path | None = None
    prompt_key: str | None = None
    response_key: str | None = None
    rollout_engine: str = "vllm"


def default_study_name(space_name: str, model: str, gpus: int, fingerprint: str) -> str:
    """<space>-<model>-<W>gpu-<fingerprint of the study's identity>: another job gets another study."""
    raw = f"{space_name}-{Path(model).name or model}-{gpus}gpu"
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', raw).strip('-.')[:80]}-{fingerprint}"


def probe_settings(space, options: RunOptions, device: str) -> ProbeSettings:
    return ProbeSettings(
        model=space.model,
        reward_model=space.reward_model,
        weights=options.weights,
        device=device,
        world_size=space.gpus,
        warmup_iterations=space.probe.warmup,
        iterations=space.probe.iterations,
        timeout_seconds=options.timeout_per_probe or space.probe.timeout_seconds,
        memory_budget_gib=None,
        seed=options.seed,
        trust_remote_code=options.trust_remote_code,
    )


def resolve_budget_gib(space, options: RunOptions, device: str) -> float:
    """--memory-budget, else the space's, else the device's memory per rank."""
    if options.memory_budget_gib:
        return options.memory_budget_gib
    if space.memory_budget_gib:
        return space.memory_budget_gib
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory / GIB
    import psutil

    return psutil.virtual_memory().total / GIB / space.gpus


@dataclass
class Prepared:
    """What `autotune run` probes with: checked before the first probe."""

    space: SearchSpace
    settings: ProbeSettings
    budget: Budget
    memory_model: MemoryModel
    lengths: Any  # the data's LengthReport (`--data`), or None
    identity: dict[str, Any]  # what the study measures (see the module docstring)

    @property
    def fingerprint(self) -> str:
        return identity_fingerprint(self.identity)


def prepare(options: RunOptions, console: Console) -> Prepared:
    """Everything checked before the first probe: space, device, models, budget, settings, identity."""
    from autotune.config.rules import position_findings, raise_for
    from autotune.memory.model import Architecture
    from autotune.models.registry import resolve_model, resolve_reward_model
    from autotune.probe.devices import device_label, resolve_device

    space, lengths = resolve_space(options, console)
    device = resolve_device(options.device, space.gpus)
    actor = resolve_model(space.model, options.weights, options.trust_remote_code)
    reward = resolve_reward_model(space.reward_model)
    budget_gib = resolve_budget_gib(space, options, device)
    budget = Budget(int(budget_gib * GIB), space.headroom)
    model = MemoryModel(Architecture.from_specs(actor, reward), space.gpus, device)
    longest = ProbeConfig(
        **space.fixed_fields,
        max_prompt_length=max(space.knob("max_prompt_length").values()),
        max_response_length=max(space.knob("max_response_length").values()),
    )
    raise_for(position_findings(longest, actor))
    check_floor(space, model, budget, budget_gib)
    settings = dataclasses.replace(probe_settings(space, options, device), memory_budget_gib=budget_gib)
    identity = study_identity(actor, reward, settings, device_label(device), budget, lengths)
    return Prepared(space, settings, budget, model, lengths, identity)


def resolve_space(options: RunOptions, console: Console) -> tuple[SearchSpace, Any]:
    """The space with the command line's model, GPUs and reward model, fitted to `--data` when given."""
    from autotune.search.space import load_space

    space = load_space(options.space)
    changes = {
        key: value
        for key, value in (
            ("model", options.model),
            ("gpus", options.gpus),
            ("reward_model", options.reward_model),
        )
        if value is not None
    }
    if changes:
        space = space.with_settings(**changes)
    if options.data is None:
        return space, None
    from autotune.data.lengths import measure_lengths

    lengths = measure_lengths(options.data, space.model, options.prompt_key, options.response_key)
    space, notes = fit_space_to_data(space, lengths)
    for note in notes:
        console.print(f"--data {options.data}: {note}")
    return space, lengths


def check_floor(space: SearchSpace, model: MemoryModel, budget: Budget, budget_gib: float) -> None:
    """Refuse a budget below the model's states alone: no batch setting could fit."""
    floor = model.minimum_bytes(ProbeConfig(**space.fixed_fields))
    if floor > budget.limit:
        raise UserError(
            f"--memory-budget {budget_gib:g} GiB: {space.model}'s weights, gradients and optimizer "
            f"state alone need about {floor / GIB:.1f} GiB per rank (budget less "
            f"{space.headroom:.0%} headroom is {budget.limit / GIB:.1f} GiB); use LoRA, more memory "
            f"or a smaller model"
        )


def study_identity(
    actor: Any, reward: Any, settings: ProbeSettings, device: str, budget: Budget, lengths: Any
) -> dict[str, Any]:
    """What a study's measurements depend on, beyond the configurations themselves."""
    prompts = None
    if lengths is not None and lengths.prompt_texts:
        prompts = _digest(json.dumps(lengths.prompt_texts[:PROMPTS_LIMIT]))
    return {
        **machine_identity(actor, reward, device, settings.world_size),
        "budget_bytes": budget.bytes,
        "iterations": f"{settings.warmup_iterations} warm-up + {settings.iterations} measured",
        "prompts": prompts or "synthetic",
    }


def machine_identity(actor: Any, reward: Any, device: str, gpus: int) -> dict[str, Any]:
    """The part of a study's identity each worker brings: its models (by fingerprint: the architecture and
    weights, not the folder's name), its device and its ranks per probe."""
    from autotune.models.registry import fingerprint

    return {
        "model": fingerprint(actor),
        "reward_model": fingerprint(reward) if reward is not None else "function",
        "device": device,
        "gpus": gpus,
    }


def identity_fingerprint(identity: dict[str, Any]) -> str:
    return _digest(json.dumps(identity, sort_keys=True))[:8]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def length_knob_at_least(space, name: str, minimum: int) -> Any:
    """The knob's YAML value with every length below `minimum` dropped and `minimum` itself offered.

    A fixed length becomes the data's suggestion; a range keeps its values at or above it, plus it.
    """
    spec = space.knob(name)
    if spec.kind == "fixed":
        return minimum
    kept = sorted({value for value in spec.values() if value > minimum} | {minimum})
    return kept[0] if len(kept) == 1 else {"choices": kept}


def fit_space_to_data(space, report) -> tuple[Any, list[str]]:
    """Bound the length knobs below by the data's suggestions (p95 prompts, p90 responses)."""
    from autotune.search.space import space_from_dict

    limits = {
        "max_prompt_length": report.suggested_prompt_length,
        "max_response_length": report.suggested_response_length,
    }
    data = copy.deepcopy(dict(space.raw))
    notes = []
    for name, minimum in limits.items():
        if minimum is None:
            notes.append(f"{name}: the data has no responses; the space's values are kept")
            continue
        data["knobs"][name] = length_knob_at_least(space, name, minimum)
        notes.append(f"{name} >= {minimum} (the data's suggestion): {data['knobs'][name]}")
    return space_from_dict(data, source=space.source, cores=space.cores, name=space.name), notes


def data_prompts_file(report, out_dir: Path, limit: int = PROMPTS_LIMIT) -> Path:
    """The data's prompt texts (templated when chat), for the probe's DataLoader to tokenize."""
    path = out_dir / "data_prompts.json"
    path.write_text(json.dumps(report.prompt_texts[:limit]))
    return path
