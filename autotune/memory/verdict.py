"""The memory verdict on a config file: its peak, measured or predicted, against a budget or a card, as the
study judges it (peak <= budget × (1 − headroom) fits, above the card is a problem, between them a warning),
with first aid when it does not fit (`autotune.memory.advice`). `autotune check` reports it.

    findings, info = memory_findings(arch, target, config, gpus, Budget(int(40 * GIB), name="a100-40g"), None)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.config.knobs import ProbeConfig
from autotune.config.rules import (
    Finding,
)
from autotune.formats.rollout import pool_findings
from autotune.formats.target import Measured, Target
from autotune.memory.advice import first_aid, shorter_lengths
from autotune.memory.budget import Budget
from autotune.memory.model import Architecture, MemoryModel
from autotune.memory.sharded import MemoryEstimate, describe, estimate_with, model_label
from autotune.units import GIB, gib

if TYPE_CHECKING:
    from autotune.data.lengths import LengthReport

__all__ = ["SEVERITY", "VERDICT_WORDS", "memory_findings", "rollout_pool_findings", "study_model"]


def study_model(arch: Architecture, gpus: int, device: str, vllm_rollout: bool = False) -> MemoryModel:
    """The memory model as the study builds it (`run.prepare`) before any probe: the device's priors.
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
    card: Budget | None,
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
        f"measured peak {gib(peak, None)} GiB per rank on {measured.where} ({measured.gpus} rank(s), the "
        f"study's measurement)"
    )
    beside = (
        f"the memory model predicts {gib(estimate.peak, None)} GiB ({error:+.0%}; information only): {text}"
    )
    info.update(decided_by="measurement", measured_peak_gib=round(peak / GIB, 3), fits=None, verdict=None)
    if measured.budget_bytes is None:
        note = f"{said}, no budget recorded: pass --gpu NAME or --memory GiB to judge a card; {beside}"
        return [Finding("memory", note, severity="note")], info
    card = Budget(int(measured.budget_bytes), measured.headroom)
    verdict = _verdict(peak, card)
    info.update(card_gib=round(card.bytes / GIB, 3), limit_gib=round(card.limit / GIB, 3), verdict=verdict)
    info["fits"] = verdict == "fits"
    fix = ""
    if verdict != "fits":
        lengths = _lengths(config, report)
        fix = first_aid(_calibrated_on(model, config, peak), config, card.limit, lengths)
    line = f"{said} {VERDICT_WORDS[verdict]} {card.label}{_headroom(card, verdict)}; {beside}"
    found = [Finding("memory", line, fix, severity=SEVERITY[verdict])]
    return found + rollout_pool_findings(target, card.bytes, peak), info


def _calibrated_on(model: MemoryModel, config: ProbeConfig, peak: int) -> MemoryModel:
    """A copy of `model` calibrated on one measured point (first aid on the measured device)."""
    return MemoryModel(model.arch, model.world_size, model.device).calibrate([(config, peak)])


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
    return found + rollout_pool_findings(target, card.bytes, estimate.peak), info


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
    otherwise); judged against the training peak (measured when the verdict is the measurement's)."""
    utilization = getattr(target.engine, "gpu_memory_utilization", None)
    if not isinstance(utilization, (int, float)) or isinstance(utilization, bool):
        return []
    fix = "a lower gpu_memory_utilization, or fewer training states on the GPU (LoRA, sharding, offload)"
    return [Finding("memory", line, fix) for line in pool_findings(utilization, card_bytes, resident_bytes)]
