"""The memory verdict on a config file: its peak, measured or predicted, against a budget or a card, as the
study judges it (peak <= budget × (1 − headroom) fits, above the card is a problem, between them a warning),
with first aid when it does not fit (`autotune.memory.advice`). `autotune check` reports it.

    findings, info = memory_findings(arch, target, config, gpus, Budget(int(40 * GIB), name="a100-40g"), None)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from autotune.config.job_lengths import JobLengths
from autotune.config.knobs import ProbeConfig
from autotune.config.passes import Passes
from autotune.config.rules import (
    Finding,
)
from autotune.formats.rollout import largest_share, pool_findings
from autotune.formats.target import Measured, Target
from autotune.memory.advice import first_aid, shorter_lengths, trl_first_aid
from autotune.memory.architecture import Architecture
from autotune.memory.budget import Budget
from autotune.memory.calibration import MemoryModel
from autotune.memory.rollout_phase import rollout_fix, rollout_phase
from autotune.memory.room import room_changes
from autotune.memory.sharded import MemoryEstimate, describe, estimate_with, model_label
from autotune.units import GIB, gib

if TYPE_CHECKING:
    from autotune.data.lengths import LengthReport

__all__ = ["SEVERITY", "VERDICT_WORDS", "memory_findings", "rollout_pool_findings", "study_model"]


def study_model(arch: Architecture, gpus: int, device: str, passes: Passes = Passes.VERL) -> MemoryModel:
    """The memory model as the study builds it (`run.prepare`) before any probe: the device's priors, and the
    trainer's passes (verl's packed ones: its rollout is vLLM's pool, which the engine findings judge)."""
    return MemoryModel(arch, gpus, device, passes=passes)


def _calibrated(
    arch: Architecture,
    config: ProbeConfig,
    gpus: int,
    measured: Measured | None,
    passes: Passes = Passes.VERL,
    device: str = "cuda",
) -> MemoryModel:
    """The model of `device` (a GPU unless the file runs on the CPU) for another card or GPU count, calibrated
    on the file's measurement when that was taken on the same device (one point: the constant fitted, the
    prior factor kept, as after the study's first probe)."""
    model = study_model(arch, gpus, device, passes)
    if measured is None or measured.device != device:
        return model
    fitted = study_model(arch, measured.gpus, device, passes).calibrate([(config, measured.peak_bytes)])
    model = MemoryModel(arch, gpus, device, fitted.constant, fitted.factor, passes=passes)
    model.points = fitted.points
    return model


def memory_findings(
    arch: Architecture,
    target: Target,
    config: ProbeConfig,
    gpus: int,
    card: Budget | None,
    report: LengthReport | None,
    lengths: JobLengths | None = None,
    passes: Passes = Passes.VERL,
) -> tuple[list[Finding], dict[str, Any]]:
    """The memory verdict: by the file's measurement on its device when it has one and the question is that
    device, else by the study's memory model on the card (the measurement then shown for reference), on the
    job's `lengths` (the data's, a verl log's; None: at the limits) and at the limits beside them."""
    measured = target.measured
    if measured is not None and card is None and gpus == measured.gpus:
        return _measured_verdict(arch, target, config, measured, report, passes)
    device = target.device or "cuda"
    model = _calibrated(arch, config, gpus, measured, passes, device).with_lengths(lengths or JobLengths())
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
        "lengths": model.lengths.label,
        "lengths_used": model.lengths.describe(config.max_prompt_length, config.max_response_length),
        "tokens": estimate.tokens,
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
    arch: Architecture,
    target: Target,
    config: ProbeConfig,
    measured: Measured,
    report: LengthReport | None,
    passes: Passes = Passes.VERL,
) -> tuple[list[Finding], dict[str, Any]]:
    """The measured peak against the budget and headroom the study recorded; the model (the device's priors,
    uncalibrated) beside it as information."""
    model = study_model(arch, measured.gpus, measured.device, passes)
    estimate, text, info = _estimate_info(model, target, config)
    peak = measured.peak_bytes
    error = (estimate.peak - peak) / peak
    said = (
        f"measured peak {gib(peak, None)} GiB per rank on {measured.where} ({measured.gpus} rank(s), the "
        f"study's measurement)"
    )
    beside = (
        f"the memory model predicts {gib(estimate.peak, None)} GiB ({error:+.0%}; information only): {text}"
    )
    info.update(decided_by="measurement", measured_peak_gib=round(peak / GIB, 3), fits=None, verdict=None)
    if measured.budget_bytes is None:
        note = f"{said}, no budget recorded: pass --gpu NAME or --memory-budget GiB to judge a card; {beside}"
        return [Finding("memory", note, severity="note")], info
    card = Budget(int(measured.budget_bytes), measured.headroom)
    verdict = _verdict(peak, card)
    info.update(card_gib=round(card.bytes / GIB, 3), limit_gib=round(card.limit / GIB, 3), verdict=verdict)
    info["fits"] = verdict == "fits"
    fix = ""
    if verdict != "fits":
        lengths = _lengths(config, report)
        fix = _first_aid(_calibrated_on(model, config, peak), config, card.limit, lengths)
    line = f"{said} {VERDICT_WORDS[verdict]} {card.label}{_headroom(card, verdict)}; {beside}"
    found = [Finding("memory", line, fix, severity=SEVERITY[verdict])]
    resident = min(peak, _resident(estimate))  # the states never exceed the measured peak
    return found + rollout_pool_findings(target, card.bytes, resident), info


def _first_aid(model: MemoryModel, config: ProbeConfig, limit: float, lengths: tuple[int, int] | None) -> str:
    """The first aid in the trainer's terms: TRL's fields for a TRL file, else the seed article's knobs."""
    if model.passes.padded:
        return trl_first_aid(model, config, limit, lengths)
    return first_aid(model, config, limit, lengths)


def _resident(estimate: MemoryEstimate) -> int:
    """The training states that stay on the GPU while vLLM generates (formats/rollout.py: weights and Adam's
    states; verl frees the gradients after a step), plus the runtime: what the rollout share meets."""
    return int(estimate.constant + estimate.states["weights"] + estimate.states["optimizer"])


def _calibrated_on(model: MemoryModel, config: ProbeConfig, peak: int) -> MemoryModel:
    """A copy of `model` calibrated on one measured point (first aid on the measured device)."""
    fresh = MemoryModel(model.arch, model.world_size, model.device, passes=model.passes)
    return fresh.calibrate([(config, peak)])


def _predicted_verdict(
    model: MemoryModel, target: Target, config: ProbeConfig, card: Budget | None, report: LengthReport | None
) -> tuple[list[Finding], dict[str, Any]]:
    """The study's memory model on the card asked about: what the study's sampler would predict."""
    estimate, text, info = _estimate_info(model, target, config)
    info.update(decided_by="model", fits=None, verdict=None)
    said = f"predicted peak {gib(estimate.peak, None)} GiB per GPU"
    measured = target.measured
    if measured is not None:
        info["measured_peak_gib"] = round(measured.peak_bytes / GIB, 3)
        said += (
            f" (for reference, the study measured {gib(measured.peak_bytes, None)} GiB per rank on "
            f"{measured.where}, {measured.gpus} rank(s))"
        )
    on = f" on {info['lengths_used']}" if model.lengths.on_data else " at the limits"
    if card is None:
        note = f"{said}{on}: {text}; pass --gpu NAME or --memory-budget GiB to compare it with the card"
        return [Finding("memory", note, severity="note")], info
    rollout = rollout_phase(target, card.bytes, _resident(estimate))
    step_peak = max(estimate.peak, rollout.peak if rollout else 0)
    training = _verdict(estimate.peak, card)
    rollout_verdict = rollout.verdict(card) if rollout else "fits"
    worse = RANK[rollout_verdict] > RANK[training]
    decides = (
        "rollout"
        if worse or (rollout_verdict == training and step_peak > estimate.peak)
        else estimate.peak_phase
    )
    verdict = max(training, rollout_verdict, key=RANK.__getitem__)
    info.update(card_gib=card.bytes / GIB, limit_gib=round(card.limit / GIB, 3), verdict=verdict)
    info.update(fits=verdict == "fits", step_peak_gib=round(step_peak / GIB, 2), decided_by_phase=decides)
    if (
        rollout is not None
    ):  # the phase's own figure (vLLM's pool), as the others are theirs beside the states
        info["phases_gib"]["rollout"] = round(rollout.pool / GIB, 3)
        info["rollout_peak_gib"] = round(rollout.peak / GIB, 2)
    fix = ""
    if training != "fits":
        fix = _first_aid(model, config, card.limit, _lengths(config, report))
    if rollout is not None and rollout_verdict != "fits":
        offloaded = _offloaded_peaks(model, target, config, card)
        weights = 2 * model.arch.actor_parameters / _rollout_tp(target) / card.bytes
        rollout_said = rollout_fix(rollout, card, estimate.peak, offloaded, weights)
        fix = f"{fix}; the rollout phase too: {rollout_said}" if fix else rollout_said
    if decides == "rollout":
        assert rollout is not None
        said = (
            f"predicted peak {gib(step_peak, None)} GiB per GPU in the rollout phase ({rollout.describe()})"
        )
        text = f"the training phases{on}: {gib(estimate.peak, None)} GiB, {text}"
        on = ""
    line = f"{said}{on} {VERDICT_WORDS[verdict]} {card.label}{_headroom(card, verdict)}; {text}"
    found = [Finding("memory", line, fix, severity=SEVERITY[verdict])]
    if verdict == "fits":
        found += _room(model, target, config, card, info)
    return found + _at_the_limits(model, config, card, training, info), info


RANK = {"fits": 0, "tight": 1, "over": 2}


def _rollout_tp(target: Target) -> int:
    tp = getattr(target.engine, "tensor_model_parallel_size", None)
    return tp if isinstance(tp, int) and not isinstance(tp, bool) and tp > 0 else 1


def _offloaded_peaks(
    model: MemoryModel, target: Target, config: ProbeConfig, card: Budget
) -> tuple[float, float] | None:
    """The training and rollout peaks with the states offloaded (param_offload, optimizer_offload: sharded
    states only), or None where that is not a change."""
    if not config.sharded or (config.param_offload and config.optimizer_offload):
        return None
    offloaded = dataclasses.replace(config, param_offload=True, optimizer_offload=True)
    estimate = estimate_with(model, offloaded)
    rollout = rollout_phase(target, card.bytes, _resident(estimate))
    return float(estimate.peak), float(rollout.peak if rollout else 0)


def _step_peak(model: MemoryModel, target: Target, config: ProbeConfig, card: Budget) -> float:
    """The peak over the whole step: the training phases, and the rollout phase beside the resident states."""
    estimate = estimate_with(model, config)
    rollout = rollout_phase(target, card.bytes, _resident(estimate))
    return max(estimate.peak, rollout.peak if rollout else 0)


def _room(
    model: MemoryModel, target: Target, config: ProbeConfig, card: Budget, info: dict[str, Any]
) -> list[Finding]:
    """A quarter of the card or more left free over the whole step: the system knobs that room allows
    (`info["room"]`)."""

    def peak_of(c: ProbeConfig) -> float:
        return _step_peak(model, target, c, card)

    changes = room_changes(model, config, card, peak_of) + _larger_share(model, target, config, card)
    info["room"] = [
        {"change": change, "predicted_peak_gib": round(peak / GIB, 2)} for change, peak in changes
    ]
    if not changes:
        return []
    free = card.bytes - peak_of(config)
    listed = "; ".join(f"{change}: {gib(peak, None)} GiB" for change, peak in changes)
    note = (
        f"room: {gib(free, None)} GiB of {card.label} is free at the peak; each of these fits alone: "
        f"{listed}. A study measures what they buy: `autotune run --from` your verl or TRL file"
    )
    return [Finding("memory", note, severity="note", key="room")]


ROOM_SHARE_STEP = 0.10  # a larger rollout share worth saying: a tenth of the card more for the KV cache


def _larger_share(
    model: MemoryModel, target: Target, config: ProbeConfig, card: Budget
) -> list[tuple[str, int]]:
    """The largest rollout share that still fits beside the resident states (the export's rule), when it is
    a tenth of the card or more above the file's: a larger KV cache lets vLLM generate more at once."""
    estimate = estimate_with(model, config)
    rollout = rollout_phase(target, card.bytes, _resident(estimate))
    if rollout is None:
        return []
    share = largest_share(card.bytes, rollout.resident, card.headroom)
    if share < rollout.share + ROOM_SHARE_STEP - 1e-9:
        return []
    peak = int(max(estimate.peak, rollout.resident + share * card.bytes))
    change = f"rollout.gpu_memory_utilization {rollout.share:g}→{share:.2f} (a larger KV cache)"
    return [(change, peak)]


def _at_the_limits(
    model: MemoryModel, config: ProbeConfig, card: Budget, verdict: str, info: dict[str, Any]
) -> list[Finding]:
    """The worst case the lengths allow, beside a verdict on the data (`info["at_max_lengths"]`), and what
    happens when responses grow: a fixed micro batch that fits on the data and not at the limits runs out
    of memory hours into a run; a token budget bounds it whatever the lengths."""
    worst_model = model.with_lengths(JobLengths())
    worst = worst_model.predict(config)
    worst_verdict = _verdict(worst, card)
    info["at_max_lengths"] = {
        "predicted_peak_gib": round(worst / GIB, 2),
        "verdict": worst_verdict,
        "tokens": worst_model.breakdown(config).tokens,
    }
    if not model.lengths.on_data or worst_verdict == verdict:  # TRL models price the limits: never on data
        return []
    at_max = f"{gib(worst, None)} GiB {VERDICT_WORDS[worst_verdict]} {card.label}"
    if config.use_dynamic_bsz:
        note = f"at the limits {config.max_prompt_length}+{config.max_response_length} tokens: {at_max}"
        return [Finding("memory", note, severity="note")]
    tokens = config.micro_batch_size * config.sequence_length
    problem = (
        f"when responses grow toward max_response_length={config.max_response_length} (RL responses do), a "
        f"micro batch of {config.micro_batch_size} holds up to {tokens:,} tokens: {at_max}"
        f"{_headroom(card, worst_verdict)}: the run fits today's lengths and not the limits"
    )
    budget = _bounding_budget(worst_model, config, card.limit)
    fix = (
        f"use_dynamic_bsz: true with ppo_max_token_len_per_gpu: {budget} (the largest budget that fits at "
        f"any length: verl cuts every micro batch to it)"
        if budget
        else "a smaller micro batch, shorter limits, or the holdings of the first aid"
    )
    return [Finding("memory", problem, fix, severity="warning")]


def _bounding_budget(model: MemoryModel, config: ProbeConfig, limit: float) -> int | None:
    """The largest token budget (whole sequences at the limits, at most the micro batch's) under which the
    config fits at any length, every pass at that budget; None when one sequence does not."""
    sequence = config.sequence_length
    best = None
    for sequences in range(1, config.micro_batch_size * config.gradient_accumulation_steps + 1):
        budget = sequences * sequence
        dynamic = dataclasses.replace(
            config,
            use_dynamic_bsz=True,
            ppo_max_token_len_per_gpu=budget,
            log_prob_max_token_len_per_gpu=None,
            critic_max_token_len_per_gpu=None,
        )
        if model.predict(dynamic) > limit:
            break
        best = budget
    if best is None:
        return None
    round_budget = best // ROUND_BUDGET * ROUND_BUDGET  # a budget a person writes: 57344, not 58368
    return round_budget if round_budget >= sequence else best


ROUND_BUDGET = 1024


VERDICT_WORDS = {"fits": "fits", "tight": "fits, but within the headroom of", "over": ">"}
SEVERITY = {"fits": "note", "tight": "warning", "over": "problem"}


def _verdict(peak: float, card: Budget) -> str:
    """fits (at or below the study's limit), tight (between the limit and the card) or over the card."""
    if peak <= card.limit:
        return "fits"
    return "tight" if peak <= card.bytes else "over"


def _headroom(card: Budget, verdict: str) -> str:
    if verdict == "over":
        return ": out of memory expected"
    if verdict == "tight":
        return f" (the study keeps {card.headroom:.0%} free: fragmentation may still OOM)"
    return f" (limit {gib(card.limit, None)} GiB with {card.headroom:.0%} headroom)"


def _lengths(config: ProbeConfig, report: LengthReport | None) -> tuple[int, int] | None:
    if report is None:
        return None
    return shorter_lengths(config, report.suggested_prompt_length, report.suggested_response_length)


def rollout_pool_findings(target: Target, card_bytes: float, resident_bytes: float) -> list[Finding]:
    """The rollout engine's share of the card must fit beside the training states (vLLM refuses to start
    otherwise); judged against the training states resident while it generates (`_resident`)."""
    utilization = getattr(target.engine, "gpu_memory_utilization", None)
    if not isinstance(utilization, (int, float)) or isinstance(utilization, bool):
        return []
    fix = "a lower gpu_memory_utilization, or fewer training states on the GPU (LoRA, sharding, offload)"
    return [Finding("memory", line, fix) for line in pool_findings(utilization, card_bytes, resident_bytes)]
