"""`autotune check`: every problem of an existing config at once, each with the rule and the fix.

    result = check(CheckOptions(path=Path("config.yaml"), gpus=4, gpu="a100-40g"))
    print_result(result); sys.exit(result.exit_code)     # 0 clean, 1 problems found (2: a UserError)

Input: the seed article's schema (its hand-made configs, and autotune's best_config.yaml) or a verl override
file (`key=value` lines, as verl_overrides.txt), read by `autotune.formats.read`. The findings:
- the configuration rules (`autotune.config.rules`), the same the study and `autotune probe` enforce; for an
  override file verl 0.9.1's own rules on its keys instead of the divisibility rules;
- num_rollout_workers against the physical cores of *this* machine unless `--cores` gives the training
  machine's (a note says which);
- a rollout batch so small that the GPUs starve: the article flags a rollout batch below 64 in examples of 1-2
  GPUs, i.e. 32 sequences per GPU; each GPU generates its own share, so autotune asks R >= 64 and R/W >= 32;
- the lengths against a dataset's suggestions (`--data`), and against the model's position embeddings;
- a reward model marked trainable;
- memory: the analytic model of autotune's probe with its CUDA priors (not calibrated on the user's run; HF
  generate, not vLLM), with the states sharded as the file says (`autotune.memory.sharded`), and first aid
  when it does not fit (`autotune.memory.advice`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config.knobs import ProbeConfig
from autotune.config.rules import (
    Finding,
    config_findings,
    position_findings,
    problems,
    value_findings,
    worker_findings,
)
from autotune.formats.read import read_target
from autotune.formats.rollout import pool_findings
from autotune.formats.target import Target
from autotune.memory.advice import first_aid, shorter_lengths
from autotune.memory.gpus import gpu_memory_gib, normalise
from autotune.memory.model import Architecture
from autotune.memory.sharded import describe, estimate_memory, gib
from autotune.models.names import registry_name
from autotune.units import GIB, divisors

if TYPE_CHECKING:
    from autotune.data.lengths import LengthReport

__all__ = ["CheckOptions", "CheckResult", "check", "print_result", "rollout_findings", "run"]

MIN_ROLLOUT, MIN_ROLLOUT_PER_GPU = 64, 32  # see the module docstring
LENGTH_WASTE = 2.0  # a limit above 2x the data's suggestion wastes memory
TIGHT = 0.90  # a peak above 90% of the card leaves less than autotune's default 10% headroom
VERL_NAMES = (
    "below, autotune's knob names stand for verl's keys: train_batch_size = data.train_batch_size × "
    "rollout.n, rollout_batch_size = data.gen_batch_size × rollout.n, micro_batch_size = "
    "actor.ppo_micro_batch_size_per_gpu, num_rollout_workers = data.dataloader_num_workers, "
    "max_prompt_length/max_response_length = data.max_prompt_length/max_response_length"
)


@dataclass
class CheckOptions:
    path: Path
    gpus: int | None = None
    gpu: str | None = None
    memory_gib: float | None = None
    data: Path | None = None
    model: str | None = None
    cores: int | None = None
    prompt_key: str | None = None
    response_key: str | None = None


@dataclass
class CheckResult:
    path: str
    target: Target
    gpus: int
    card: str | None  # "a100-40g (40.0 GiB)"
    findings: list[Finding]
    memory: dict[str, Any] | None = None

    @property
    def problems(self) -> list[Finding]:
        return problems(self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.target.kind,
            "model": self.target.model,
            "gpus": self.gpus,
            "card": self.card,
            "config": self.target.config.to_dict() if self.target.config else None,
            "sharding": self.target.sharding,
            "memory": self.memory,
            "problems": [f.to_dict() for f in self.problems],
            "notes": [f.to_dict() for f in self.findings if f.severity == "note"],
            "exit_code": self.exit_code,
        }


# --- rules -----------------------------------------------------------------------------------------------


def _rule_findings(config: ProbeConfig, gpus: int, cores: int | None, verl: bool) -> list[Finding]:
    """The configuration rules; an override file is judged by verl's own rules instead of the divisibility
    rules (the same rules in verl's terms), and the cores by a note when they are this machine's."""
    if verl:  # the sizes' bounds hold for any config; the divisibility rules are verl's own, checked apart
        found = value_findings(config) + worker_findings(config, cores)
    else:
        found = config_findings(config, gpus, cores)
    if cores is None and not any(f.check == "workers" for f in found):
        found.append(
            Finding(
                "workers",
                f"num_rollout_workers={config.num_rollout_workers} checked against the physical cores of "
                f"this machine; pass --cores N for the training machine",
                severity="note",
            )
        )
    return found


def rollout_findings(c: ProbeConfig, gpus: int) -> list[Finding]:
    """A rollout batch so small that the GPUs wait on generation (see the module docstring)."""
    need = max(MIN_ROLLOUT, MIN_ROLLOUT_PER_GPU * gpus)
    if c.rollout_batch_size <= 0 or c.rollout_batch_size >= need:
        return []
    group = gpus * c.rollout_n
    fit = next((d for d in divisors(c.train_batch_size) if d >= need and d % group == 0), None)
    fix = (
        f"rollout_batch_size: {fit}"
        if fit
        else f"rollout_batch_size >= {need} (and train_batch_size a multiple)"
    )
    return [
        Finding(
            "rollout",
            f"rollout_batch_size={c.rollout_batch_size} is {c.rollout_batch_size / gpus:g} per GPU on {gpus} "
            f"GPU(s): below {MIN_ROLLOUT} in all and {MIN_ROLLOUT_PER_GPU} per GPU, the GPUs starve waiting "
            f"on generation",
            fix,
        )
    ]


def reward_findings(target: Target) -> list[Finding]:
    if not target.reward_trainable:
        return []
    return [
        Finding(
            "reward",
            "reward_model_config.trainable: true: the reward model would be updated during PPO, the reward "
            "drifts with the policy and the KL explodes (verl freezes it by default)",
            "reward_model_config.trainable: false",
        )
    ]


def length_findings(c: ProbeConfig, report: LengthReport) -> list[Finding]:
    """Limits below the data's suggestion truncate; above 2× it they reserve memory nothing uses."""
    from autotune.data.lengths import truncated_share

    pairs = [
        ("max_prompt_length", c.max_prompt_length, report.suggested_prompt_length, report.prompts, "p95")
    ]
    if report.suggested_response_length is not None:
        pairs.append(
            (
                "max_response_length",
                c.max_response_length,
                report.suggested_response_length,
                report.responses,
                "p90",
            )
        )
    found = []
    for key, value, suggested, counts, rule in pairs:
        if value < suggested:
            share = truncated_share(counts, value)
            found.append(
                Finding(
                    "lengths",
                    f"{key}={value} is below the data's {rule} suggestion {suggested}: it truncates "
                    f"{share:.1%} of the samples",
                    f"{key}: {suggested}",
                )
            )
        elif value > LENGTH_WASTE * suggested:
            found.append(
                Finding(
                    "lengths",
                    f"{key}={value} is more than {LENGTH_WASTE:g}× the data's {rule} suggestion {suggested}: "
                    f"activations, logits and KV cache are sized for tokens the data never has "
                    f"(memory wasted)",
                    f"{key}: {suggested}",
                )
            )
    return found


def verl_findings(overrides: dict[str, Any], gpus: int) -> list[Finding]:
    from autotune.formats.verl import verl_rule_violations

    fix = "change the values so the rule holds: verl rejects the config at start-up"
    return [Finding("verl", v, fix) for v in verl_rule_violations(overrides, gpus)]


# --- memory ----------------------------------------------------------------------------------------------


def memory_findings(
    arch: Architecture,
    target: Target,
    config: ProbeConfig,
    gpus: int,
    card: tuple[str, float] | None,
    report: LengthReport | None,
) -> tuple[list[Finding], dict[str, Any]]:
    estimate = estimate_memory(arch, config, gpus)
    text = describe(
        estimate,
        target.sharding,
        target.sharding_label,
        target.offload,
        config,
        gpus,
        arch.reward_parameters > 0,
    )
    info = {
        "predicted_peak_gib": round(estimate.peak / GIB, 2),
        "raw_gib": round(estimate.raw / GIB, 2),
        "states_gib": {k: round(v / GIB, 3) for k, v in estimate.states.items()},
        "phases_gib": {k: round(v / GIB, 3) for k, v in estimate.phases.items()},
        "sharding": target.sharding,
        "offload": target.offload,
    }
    peak = f"predicted peak {gib(estimate.peak)} GiB per GPU"
    if card is None:
        note = f"{peak}: {text}; pass --gpu NAME or --memory GiB to compare it with the card"
        return [Finding("memory", note, severity="note")], info
    name, card_gib = card
    info["card_gib"] = card_gib
    info["fits"] = estimate.peak <= card_gib * GIB
    if estimate.peak > card_gib * GIB:
        problem = f"{peak} > {card_gib:g} GiB ({name}): out of memory expected; {text}"
        lengths = None
        if report is not None:
            lengths = shorter_lengths(
                config, report.suggested_prompt_length, report.suggested_response_length
            )
        aid = first_aid(arch, config, gpus, card_gib * GIB, lengths)
        return [Finding("memory", problem, aid)], info
    tight = estimate.peak > TIGHT * card_gib * GIB
    margin = " — within 10% of the card: fragmentation may still OOM" if tight else ""
    fits = Finding("memory", f"{peak} fits {card_gib:g} GiB ({name}){margin}; {text}", severity="note")
    return [fits, *engine_findings(target, card_gib * GIB, estimate.peak)], info


def engine_findings(target: Target, card_bytes: float, resident_bytes: float) -> list[Finding]:
    """The rollout engine's share of the card must fit beside the training states (vLLM refuses to start
    otherwise); judged against the predicted training peak."""
    utilization = getattr(target.engine, "gpu_memory_utilization", None)
    if not isinstance(utilization, (int, float)) or isinstance(utilization, bool):
        return []
    fix = "a lower gpu_memory_utilization, or fewer training states on the GPU (LoRA, sharding, offload)"
    return [Finding("memory", line, fix) for line in pool_findings(utilization, card_bytes, resident_bytes)]


# --- the command -----------------------------------------------------------------------------------------


def _card(options: CheckOptions, target: Target) -> tuple[str, float] | None:

    if options.gpu:
        return normalise(options.gpu), gpu_memory_gib(options.gpu)
    if options.memory_gib:
        return "--memory", options.memory_gib
    if target.memory_gib:
        return "the study's budget", float(target.memory_gib)
    return None


def check(options: CheckOptions) -> CheckResult:
    """Read the config and run every check; UserError for input that cannot be read."""
    target = read_target(options.path)
    card = _card(options, target)  # an unknown --gpu is a usage error: before any work
    gpus = options.gpus or target.gpus or 1
    findings = list(target.findings)
    if options.gpus is None and target.gpus is None:
        findings.append(
            Finding("gpus", "assuming 1 GPU: the config does not say; pass --gpus W", severity="note")
        )
    if target.overrides is not None:
        findings += verl_findings(target.overrides, gpus)
        findings.append(Finding("verl", VERL_NAMES, severity="note"))
    config = target.config
    memory = None
    if config is not None:
        findings += _rule_findings(config, gpus, options.cores, verl=target.overrides is not None)
        findings += rollout_findings(config, gpus)
        findings += reward_findings(target)
        model_findings, memory = _model_checks(options, target, config, gpus, card)
        findings += model_findings
    else:
        findings.append(
            Finding(
                "memory", "the override file lacks the batch sizes the memory model needs", severity="note"
            )
        )
    return CheckResult(str(options.path), target, gpus, _card_label(card), findings, memory)


def _card_label(card: tuple[str, float] | None) -> str | None:
    return f"{card[0]} ({card[1]:g} GiB)" if card else None


def _model_checks(
    options: CheckOptions, target: Target, config: ProbeConfig, gpus: int, card: tuple[str, float] | None
) -> tuple[list[Finding], dict[str, Any] | None]:
    """Lengths against the data, positions and memory: the checks that need the model."""
    from autotune.models.registry import resolve_model

    name = options.model or registry_name(target.model)
    findings: list[Finding] = []
    report = None
    if options.data is not None:
        from autotune.data.lengths import measure_lengths

        report = measure_lengths(options.data, name or "tiny-llama", options.prompt_key, options.response_key)
        findings += length_findings(config, report)
    if name is None:
        shown = target.model or "(none)"
        note = (
            f"memory not checked: model {shown!r} is not one autotune knows; pass --model NAME or a "
            f"local directory"
        )
        return [*findings, Finding("memory", note, severity="note")], None
    spec = resolve_model(name)
    findings += position_findings(config, spec)
    reward = registry_name(target.reward_model)
    if target.reward_model and reward is None:
        note = f"reward model {target.reward_model!r} is not one autotune knows: its memory is not counted"
        findings.append(Finding("memory", note, severity="note"))
    arch = Architecture.from_specs(spec, resolve_model(reward) if reward else None)
    memory_found, memory = memory_findings(arch, target, config, gpus, card, report)
    return findings + memory_found, memory


def print_result(result: CheckResult) -> None:
    t = result.target
    model = f"{t.model}" + (f" (reward {t.reward_model})" if t.reward_model else "")
    print(
        f"autotune check {result.path}: {t.kind}; model {model}; {result.gpus} GPU(s)"
        f"{'; ' + result.card if result.card else ''}; {t.sharding_label}"
    )
    for f in result.findings:
        mark = "✗" if f.severity == "problem" else "·"
        print(f"{mark} {f.check}: {f.problem}")
        if f.fix:
            print(f"    fix: {f.fix}")
    count = len(result.problems)
    print(f"{count} problem{'s' if count != 1 else ''} found" if count else "no problems found")


def run(options: CheckOptions, as_json: bool = False) -> int:
    result = check(options)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_result(result)
    return result.exit_code
