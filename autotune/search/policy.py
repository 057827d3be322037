"""What to do with a proposed configuration: a pure function of the trials seen, the memory model, the budget.

    decision = decide(config, trials, memory_model, budget)
    if isinstance(decision, Outcome): record it (no probe: already measured, or sure to run out of memory)
    else: probe it, and record the result with `decision.attrs` (the prediction made before the probe)

In order: a configuration measured before is a duplicate of that measurement; one at least as large as a
measured OOM on every memory knob is an `inferred_oom`; one the memory model (calibrated on this study's own
ok probes) puts over the budget by more than a margin is a `predicted_oom`. The margin narrows as the model
sees more of the study's measurements. Everything else is probed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial

from autotune.config.job_lengths import PassTokens
from autotune.config.knobs import ProbeConfig, job_of, same_job
from autotune.memory.budget import Budget
from autotune.memory.calibration import MemoryModel, priors
from autotune.space.model import at_least_as_large
from autotune.status import MEASURED, Attr, Status
from autotune.study.outcome import Outcome
from autotune.study.trials import measured_ok, oom_phase, trial_config_of

__all__ = [
    "PREDICTION_MARGINS",
    "ProbeIt",
    "calibrated",
    "decide",
    "prediction_margin",
    "previous_measurement",
]

# (calibration points at least, margin): a config is skipped as predicted_oom only when the prediction
# exceeds the budget by the margin.
PREDICTION_MARGINS = ((3, 0.10), (1, 0.25), (0, 0.60))


@dataclass(frozen=True)
class ProbeIt:
    """The configuration needs a probe; `attrs` go with its result."""

    attrs: dict[str, Any] = field(default_factory=dict)


def prediction_margin(calibration_points: int) -> float:
    return next(margin for points, margin in PREDICTION_MARGINS if calibration_points >= points)


def decide(
    config: ProbeConfig, trials: list[FrozenTrial], prior: MemoryModel, budget: Budget, prune: bool = True
) -> Outcome | ProbeIt:
    """Skip what is already known (measured, dominated, predicted); otherwise probe. `trials` are the
    study's complete trials; `prune=False` probes every new configuration (a baseline without the model)."""
    previous = previous_measurement(config, trials)
    if previous is not None:
        return Outcome(
            previous.user_attrs[Attr.STATUS],
            config,
            previous.values[0],
            int(previous.values[1]),
            attrs={Attr.DUPLICATE_OF: previous.number},
        )
    if not prune:
        return ProbeIt()
    for number, oom_config, oom_peak, phase in _measured_ooms(trials, budget):
        if at_least_as_large(config, oom_config, phase):
            peak = max(int(oom_peak), budget.bytes)
            return Outcome(Status.INFERRED_OOM, config, 0.0, peak, attrs={Attr.DOMINATES_OOM_TRIAL: number})
    model, points = calibrated(prior, trials)
    predicted = model.predict(config)
    attrs = {Attr.PREDICTED_PEAK_BYTES: predicted, Attr.CALIBRATION_POINTS: points}
    if predicted > budget.bytes * (1 + prediction_margin(points)):
        return Outcome(Status.PREDICTED_OOM, config, 0.0, predicted, attrs=attrs)
    return ProbeIt(attrs)


def previous_measurement(config: ProbeConfig, trials: list[FrozenTrial]) -> FrozenTrial | None:
    """The probe that already measured this config's job (the stored config dicts compared as the jobs they
    run: knobs.job_of)."""
    wanted = job_of(config.to_dict())
    for trial in trials:
        attrs = trial.user_attrs
        if (
            attrs.get(Attr.STATUS) in MEASURED
            and Attr.DUPLICATE_OF not in attrs
            and same_job(attrs.get(Attr.CONFIG), wanted)
        ):
            return trial
    return None


def calibrated(prior: MemoryModel, trials: Sequence[FrozenTrial]) -> tuple[MemoryModel, int]:
    """The memory model refitted from the priors on every ok probe among `trials`, and how many there were.
    Under --engine verl it stays at its priors: a verl probe's peak is the GPUs' (NVML), vLLM's pool and
    processes included, not the training side the model predicts."""
    fresh = prior.with_calibration(*priors(prior.device, prior.passes))
    if prior.rollout_card_bytes is not None and prior.passes.packed:
        return fresh, 0
    points = [_point(t) for t in trials if measured_ok(t)]
    return fresh.calibrate(points), len(points)


def _point(trial: FrozenTrial) -> tuple[Any, ...]:
    """(config, peak, the tokens its probe packed): a probe is priced on what it held (verl's passes)."""
    result = trial.user_attrs.get(Attr.RESULT) or {}
    return (
        trial_config_of(trial),
        trial.user_attrs[Attr.PEAK_BYTES],
        PassTokens.from_packing(result.get("packing")),
    )


def _measured_ooms(
    trials: list[FrozenTrial], budget: Budget
) -> list[tuple[int, ProbeConfig, int, str | None]]:
    """(number, config, peak, the verl training phase it ran out of memory in) of each measured OOM."""
    return [
        (
            t.number,
            trial_config_of(t),
            t.user_attrs.get(Attr.PEAK_BYTES, budget.bytes),
            oom_phase(t),
        )
        for t in trials
        if t.user_attrs.get(Attr.STATUS) == Status.OOM
    ]
