"""`autotune check`: every finding of an existing config at once, each on one line with the rule and the fix.

    result = check(CheckOptions(path=Path("config.yaml"), gpus=4, gpu="a100-40g"))
    print_result(result); sys.exit(result.exit_code)   # 0 clean (warnings allowed), 1 problems, 2 UserError

Input: the seed article's schema (its hand-made configs, and autotune's best_config.yaml) or a verl override
file (`key=value` lines, as verl_overrides.txt), read by `autotune.formats.read` with one layout rule for
both: a file that names no sharding is held as verl holds it by default, FSDP full-shard (the header says so).
Each finding has a severity: a problem (a broken rule, a config that will not fit: exit 1), a warning (the
article's advice: exit 0) or a note (context). The findings:
- the configuration rules (`autotune.config.rules`), the same the study and `autotune probe` enforce; for an
  override file verl 0.9.1's own rules on its keys instead of the divisibility rules, and a warning for each
  key verl accepts but its default trainer (V1, sync) does not read (`autotune.formats.verl_table`);
- num_rollout_workers against the physical cores of *this* machine unless `--cores` gives the training
  machine's: a warning (the article's advice, not an invariant);
- a rollout batch so small that the GPUs may starve: the article flags a rollout batch below 64 in examples
  of 1-2 GPUs, i.e. 32 sequences per GPU; autotune asks R >= 64 and R/W >= 32. A warning, and only a note when
  the file carries the study's measurement of this config (a heuristic never overrules a measurement); not for
  a verl file (verl has no rollout batch: a step's prompts generate together);
- the lengths against a dataset's suggestions (`--data`), and against the model's position embeddings;
- a reward model marked trainable;
- memory, judged as the study judges it: peak <= budget × (1 − headroom) fits, above the card is a problem,
  between them a warning. A best_config.yaml with a `measured:` block is judged by its measured peak against
  the budget and headroom recorded there, the memory model's prediction shown beside it as information. Asked
  about a card (--gpu, --memory) or another GPU count, the study's memory model decides (`MemoryModel`, built
  as `search.prepare` builds it: the device's priors; calibrated on the file's measurement when that was taken
  on CUDA), with the states held as the config holds them (`autotune.memory.sharded`; HF generate, not vLLM;
  for a verl file without the generate phase, since verl's rollout is vLLM's pool),
  the measurement shown for reference; first aid when it does not fit (`autotune.memory.advice`: a switch
  that fits alone, gradient checkpointing or sharding, before the article's steps and shorter lengths).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config.knobs import ProbeConfig
from autotune.config.rules import (
    Finding,
    config_findings,
    model_findings,
    problems,
    value_findings,
    worker_findings,
)
from autotune.formats.read import read_target
from autotune.formats.rollout import pool_findings
from autotune.formats.target import ASSUMED, Measured, Target
from autotune.memory.advice import first_aid, shorter_lengths
from autotune.memory.gpus import gpu_memory_gib, normalise
from autotune.memory.model import Architecture, MemoryModel
from autotune.memory.sharded import MemoryEstimate, describe, estimate_with, gib, model_label
from autotune.models.names import registry_name
from autotune.units import GIB, divisors

if TYPE_CHECKING:
    from autotune.data.lengths import LengthReport

__all__ = ["CheckOptions", "CheckResult", "check", "print_result", "rollout_findings", "run"]

MIN_ROLLOUT, MIN_ROLLOUT_PER_GPU = 64, 32  # see the module docstring
LENGTH_WASTE = 2.0  # a limit above 2x the data's suggestion wastes memory
DEFAULT_HEADROOM = 0.10  # the study's default: feasible means peak <= card × (1 − headroom)
WARNING = "warning"  # advice: shown with its fix, but the exit code stays 0
VERL_NAMES = (
    "below, autotune's knob names stand for verl's keys: train_batch_size = data.train_batch_size × "
    "rollout.n, micro_batch_size = actor.ppo_micro_batch_size_per_gpu, num_rollout_workers = "
    "data.dataloader_num_workers, max_prompt_length/max_response_length = data.max_prompt_length/"
    "max_response_length; verl has no rollout batch (a step's prompts generate together: rollout_batch_size "
    "reads as train_batch_size), and its rollout memory is vLLM's pool, not the probe's generate phase"
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
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

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
            "layout_assumed": self.target.layout_assumed,
            "findings": [f.to_dict() for f in self.findings],  # each with its severity
            "problems": [f.to_dict() for f in self.problems],
            "warnings": [f.to_dict() for f in self.warnings],
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
    # workers vs cores is the article's advice (more workers than cores contend), not a broken invariant
    found = [dataclasses.replace(f, severity=WARNING) if f.check == "workers" else f for f in found]
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


def rollout_findings(c: ProbeConfig, gpus: int, measured: Measured | None = None) -> list[Finding]:
    """A rollout batch so small that the GPUs wait on generation (see the module docstring): a warning, the
    article's heuristic from its GPU examples; a note only when the file carries the study's measurement of
    this very config, which the heuristic does not overrule."""
    need = max(MIN_ROLLOUT, MIN_ROLLOUT_PER_GPU * gpus)
    if c.rollout_batch_size <= 0 or c.rollout_batch_size >= need:
        return []
    rule = (
        f"rollout_batch_size={c.rollout_batch_size} is {c.rollout_batch_size / gpus:g} per GPU on {gpus} "
        f"GPU(s): below the article's {MIN_ROLLOUT} in all and {MIN_ROLLOUT_PER_GPU} per GPU"
    )
    if measured is not None:
        speed = f" at {measured.samples_per_sec:g} samples/s" if measured.samples_per_sec else ""
        note = f"{rule}; the study measured this config{speed} on {measured.where}: the measurement stands"
        return [Finding("rollout", note, severity="note")]
    group = gpus * c.rollout_n
    fit = next((d for d in divisors(c.train_batch_size) if d >= need and d % group == 0), None)
    fix = (
        f"rollout_batch_size: {fit}"
        if fit
        else f"rollout_batch_size >= {need} (and train_batch_size a multiple)"
    )
    problem = f"{rule}: the GPUs may starve waiting on generation (a heuristic: a probe measures it)"
    return [Finding("rollout", problem, fix, severity=WARNING)]


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
    """verl's rules the file breaks (problems), and the keys verl accepts but its default trainer does not
    read (warnings: the file says more than verl does)."""
    from autotune.formats.verl import verl_rule_violations
    from autotune.formats.verl_table import ignored_keys

    fix = "change the values so the rule holds: verl rejects the config at start-up"
    found = [Finding("verl", v, fix) for v in verl_rule_violations(overrides, gpus)]
    for key, why in ignored_keys(overrides).items():
        problem = f"{key}={overrides[key]}: set but ignored by V1 (verl 0.9.1's default trainer): {why}"
        fix = f"remove {key}, or set what V1 reads"
        found.append(Finding("verl", problem, fix, key=key, severity=WARNING))
    return found


# --- memory ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    """What a peak is judged against: a card (or budget) per GPU and the headroom the study keeps below it."""

    name: str  # "a100-40g", "--memory", "the study's budget"
    bytes: float
    headroom: float = DEFAULT_HEADROOM

    @property
    def limit(self) -> float:
        """The study's feasibility limit on this card: the budget less its headroom."""
        return self.bytes * (1.0 - self.headroom)

    @property
    def label(self) -> str:
        return f"{self.bytes / GIB:g} GiB ({self.name})"


def study_model(arch: Architecture, gpus: int, device: str, vllm_rollout: bool = False) -> MemoryModel:
    """The memory model as the study builds it (`search.prepare`) before any probe: the device's priors.
    `vllm_rollout`: a verl file's rollout runs in vLLM's pool (the engine findings judge it), not in the
    probe's generate phase."""
    return MemoryModel(arch, gpus, device, vllm_rollout=vllm_rollout)


def _calibrated(
    arch: Architecture, config: ProbeConfig, gpus: int, measured: Measured | None, vllm_rollout: bool = False
) -> MemoryModel:
    """The CUDA model for another card or GPU count, calibrated on the file's measurement when that was taken
    on CUDA (one point: the constant fitted, the prior factor kept, as after the study's first probe)."""
    model = study_model(arch, gpus, "cuda", vllm_rollout)
    if measured is None or measured.device != "cuda":
        return model
    fitted = study_model(arch, measured.gpus, "cuda").calibrate([(config, measured.peak_bytes)])
    model = MemoryModel(arch, gpus, "cuda", fitted.constant, fitted.factor, vllm_rollout=vllm_rollout)
    model.points = fitted.points
    return model


def memory_findings(
    arch: Architecture,
    target: Target,
    config: ProbeConfig,
    gpus: int,
    card: Card | None,
    report: LengthReport | None,
) -> tuple[list[Finding], dict[str, Any]]:
    """The memory verdict: by the file's measurement on its device when it has one and the question is that
    device, else by the study's memory model on the card (the measurement then shown for reference)."""
    measured = target.measured
    if measured is not None and card is None and gpus == measured.gpus:
        return _measured_verdict(arch, target, config, measured, report)
    model = _calibrated(arch, config, gpus, measured, target.kind == "verl overrides")
    return _predicted_verdict(model, target, config, card, report)


def _estimate_info(
    model: MemoryModel, target: Target, config: ProbeConfig
) -> tuple[MemoryEstimate, str, dict]:
    """The model's peak, its one-sentence make-up, and the JSON terms."""
    estimate = estimate_with(model, config)
    text = describe(
        estimate,
        target.sharding,
        target.sharding_label,
        target.offload,
        config,
        model.world_size,
        model.arch.reward_parameters > 0,
        model_label(model),
    )
    info = {
        "predicted_peak_gib": round(estimate.peak / GIB, 2),
        "predicted_peak_bytes": estimate.peak,
        "model": model_label(model),
        "device": model.device,
        "raw_gib": round(estimate.raw / GIB, 2),
        "states_gib": {k: round(v / GIB, 3) for k, v in estimate.states.items()},
        "phases_gib": {k: round(v / GIB, 3) for k, v in estimate.phases.items()},
        "sharding": target.sharding,
        "layout": target.sharding_label,
        "layout_assumed": target.layout_assumed,
        "offload": target.offload,
    }
    return estimate, text, info


def _measured_verdict(
    arch: Architecture, target: Target, config: ProbeConfig, measured: Measured, report: LengthReport | None
) -> tuple[list[Finding], dict[str, Any]]:
    """The measured peak against the budget and headroom the study recorded; the model (the device's priors,
    uncalibrated) beside it as information."""
    model = study_model(arch, measured.gpus, measured.device)
    estimate, text, info = _estimate_info(model, target, config)
    peak = measured.peak_bytes
    error = (estimate.peak - peak) / peak
    said = (
        f"measured peak {gib(peak)} GiB per rank on {measured.where} ({measured.gpus} rank(s), the study's "
        f"measurement)"
    )
    beside = f"the memory model predicts {gib(estimate.peak)} GiB ({error:+.0%}; information only): {text}"
    info.update(decided_by="measurement", measured_peak_gib=round(peak / GIB, 3), fits=None, verdict=None)
    if measured.budget_bytes is None:
        note = f"{said}, no budget recorded: pass --gpu NAME or --memory GiB to judge a card; {beside}"
        return [Finding("memory", note, severity="note")], info
    card = Card("the study's budget", measured.budget_bytes, measured.headroom)
    verdict = _verdict(peak, card)
    info.update(card_gib=round(card.bytes / GIB, 3), limit_gib=round(card.limit / GIB, 3), verdict=verdict)
    info["fits"] = verdict == "fits"
    fix = ""
    if verdict != "fits":
        lengths = _lengths(config, report)
        fix = first_aid(_calibrated_on(model, config, peak), config, card.limit, lengths)
    line = f"{said} {VERDICT_WORDS[verdict]} {card.label}{_headroom(card, verdict)}; {beside}"
    found = [Finding("memory", line, fix, severity=SEVERITY[verdict])]
    return found + engine_findings(target, card.bytes, peak), info


def _calibrated_on(model: MemoryModel, config: ProbeConfig, peak: int) -> MemoryModel:
    """A copy of `model` calibrated on one measured point (first aid on the measured device)."""
    return MemoryModel(model.arch, model.world_size, model.device).calibrate([(config, peak)])


def _predicted_verdict(
    model: MemoryModel, target: Target, config: ProbeConfig, card: Card | None, report: LengthReport | None
) -> tuple[list[Finding], dict[str, Any]]:
    """The study's memory model on the card asked about: what the study's sampler would predict."""
    estimate, text, info = _estimate_info(model, target, config)
    info.update(decided_by="model", fits=None, verdict=None)
    said = f"predicted peak {gib(estimate.peak)} GiB per GPU"
    measured = target.measured
    if measured is not None:
        info["measured_peak_gib"] = round(measured.peak_bytes / GIB, 3)
        said += (
            f" (for reference, the study measured {gib(measured.peak_bytes)} GiB per rank on "
            f"{measured.where}, {measured.gpus} rank(s))"
        )
    if card is None:
        note = f"{said}: {text}; pass --gpu NAME or --memory GiB to compare it with the card"
        return [Finding("memory", note, severity="note")], info
    verdict = _verdict(estimate.peak, card)
    info.update(card_gib=card.bytes / GIB, limit_gib=round(card.limit / GIB, 3), verdict=verdict)
    info["fits"] = verdict == "fits"
    fix = ""
    if verdict != "fits":
        fix = first_aid(model, config, card.limit, _lengths(config, report))
    line = f"{said} {VERDICT_WORDS[verdict]} {card.label}{_headroom(card, verdict)}; {text}"
    found = [Finding("memory", line, fix, severity=SEVERITY[verdict])]
    if verdict == "over":
        return found, info
    return found + engine_findings(target, card.bytes, estimate.peak), info


VERDICT_WORDS = {"fits": "fits", "tight": "fits, but within the headroom of", "over": ">"}
SEVERITY = {"fits": "note", "tight": "warning", "over": "problem"}


def _verdict(peak: float, card: Card) -> str:
    """fits (at or below the study's limit), tight (between the limit and the card) or over the card."""
    if peak <= card.limit:
        return "fits"
    return "tight" if peak <= card.bytes else "over"


def _headroom(card: Card, verdict: str) -> str:
    if verdict == "over":
        return ": out of memory expected"
    if verdict == "tight":
        return f" (the study keeps {card.headroom:.0%} free: fragmentation may still OOM)"
    return f" (limit {gib(card.limit)} GiB with {card.headroom:.0%} headroom)"


def _lengths(config: ProbeConfig, report: LengthReport | None) -> tuple[int, int] | None:
    if report is None:
        return None
    return shorter_lengths(config, report.suggested_prompt_length, report.suggested_response_length)


def engine_findings(target: Target, card_bytes: float, resident_bytes: float) -> list[Finding]:
    """The rollout engine's share of the card must fit beside the training states (vLLM refuses to start
    otherwise); judged against the training peak (measured when the verdict is the measurement's)."""
    utilization = getattr(target.engine, "gpu_memory_utilization", None)
    if not isinstance(utilization, (int, float)) or isinstance(utilization, bool):
        return []
    fix = "a lower gpu_memory_utilization, or fewer training states on the GPU (LoRA, sharding, offload)"
    return [Finding("memory", line, fix) for line in pool_findings(utilization, card_bytes, resident_bytes)]


# --- the command -----------------------------------------------------------------------------------------


def _card(options: CheckOptions, target: Target) -> Card | None:
    """The card asked about (--gpu, --memory), else the study's budget when the file has no usable
    measurement (with one, the measurement's own budget judges it: `memory_findings`)."""
    if options.gpu:
        return Card(normalise(options.gpu), gpu_memory_gib(options.gpu) * GIB)
    if options.memory_gib:
        return Card("--memory", options.memory_gib * GIB)
    if target.memory_gib and target.measured is None:
        return Card("the study's budget", float(target.memory_gib) * GIB)
    return None


def check(options: CheckOptions) -> CheckResult:
    """Read the config and run every check; UserError for input that cannot be read."""
    target = read_target(options.path, options.gpus)
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
        if target.overrides is None:  # verl has no rollout batch: the heuristic is about the article's
            findings += rollout_findings(config, gpus, target.measured)
        findings += reward_findings(target)
        model_findings, memory = _model_checks(options, target, config, gpus, card)
        findings += model_findings
    else:
        findings.append(
            Finding(
                "memory", "the override file lacks the batch sizes the memory model needs", severity="note"
            )
        )
    label = card.label if card else None
    return CheckResult(str(options.path), target, gpus, label, findings, memory)


def _model_checks(
    options: CheckOptions, target: Target, config: ProbeConfig, gpus: int, card: Card | None
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
    findings += model_findings(config, spec, getattr(target.engine, "tensor_model_parallel_size", None))
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
    layout = t.sharding_label + (f" ({ASSUMED})" if t.layout_assumed else "")
    print(
        f"autotune check {result.path}: {t.kind}; model {model}; {result.gpus} GPU(s)"
        f"{'; ' + result.card if result.card else ''}; {layout}"
    )
    for f in result.findings:
        print(f"{MARKS.get(f.severity, '·')} {f.check}: {f.problem}")
        if f.fix:
            print(f"    fix: {f.fix}")
    print(_summary(len(result.problems), len(result.warnings)))


MARKS = {"problem": "✗", WARNING: "!", "note": "·"}


def _summary(problems: int, warnings: int) -> str:
    said = f"{problems} problem{'s' if problems != 1 else ''} found" if problems else "no problems found"
    return said + (f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings else "")


def run(options: CheckOptions, as_json: bool = False) -> int:
    result = check(options)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_result(result)
    return result.exit_code
