"""What happened to one trial, and how it is told to Optuna (docs/design.md, "Statuses").

- ok, oom, timeout, predicted_oom, inferred_oom: COMPLETE with values (samples/sec, peak bytes) and the
  constraints `memory` (peak − budget·(1 − headroom)) and `runs` (1 when it did not run through). An OOM has
  0 samples/sec and a positive violation, so that TPE, NSGA-II and GP all learn where the wall is: a FAIL
  trial is ignored by every sampler. Optuna's `study.best_trials` (and `optuna best-trials`) keeps only
  trials whose constraints are all <= 0: ok probes within the limit. The never-launched statuses stay
  COMPLETE rather than PRUNED (which has no values): the sampler, the pruning and the report read their
  peaks, and their `runs` violation keeps them off the front.
- crashed, interrupted, surplus: FAIL (infrastructure, or a bug: not a property the sampler should learn).
  An interrupted trial is re-queued, to be measured by the next run of the same command; so is one that
  crashed because a Ray node was lost under it (`lost_node`), once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config.knobs import ProbeConfig
from autotune.memory.budget import Budget
from autotune.probe.contract import ProbeResult
from autotune.status import FAILED, Attr, Status
from autotune.study.coordination import retry_once
from autotune.study.optuna_private import storage_of, trial_id

__all__ = ["Outcome", "outcome_from_dict", "outcome_from_result", "outcome_to_dict", "record_outcome"]

DASHBOARD_CONSTRAINTS_KEY = "constraints"  # optuna.study._constrained_optimization._CONSTRAINTS_KEY
RESULT_KEYS = (  # the probe's figures worth keeping with the trial (the stderr tail only when it failed)
    "status",
    "oom_kind",
    "samples_per_sec",
    "tokens_per_sec",
    "iteration_seconds",
    "phase_seconds",
    "peak_memory_bytes",
    "peak_memory_source",
    "rank_peaks",
    "gpu_utilization",
    "wall_seconds",
    "startup_seconds",
    "world_size",
    "device",
    "environment",
    "message",
    "packing",
    "rank_nodes",
    "lost_node",
)


@dataclass
class Outcome:
    """What happened to one trial, before it is told to Optuna."""

    status: str
    config: ProbeConfig
    samples_per_sec: float = 0.0
    peak_bytes: int = 0
    result: ProbeResult | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


def outcome_from_result(config: ProbeConfig, result: ProbeResult, budget: Budget, attrs: dict) -> Outcome:
    """A probe's result as an outcome: an OOM's peak is at least the budget (the wall was there or lower)."""
    attrs = {**attrs, Attr.RESULT: _result_attrs(result)}
    if result.status == Status.OK:
        return Outcome(Status.OK, config, result.samples_per_sec, result.peak_memory_bytes, result, attrs)
    if result.status == Status.OOM:
        attrs[Attr.OOM_KIND] = result.oom_kind
        peak = max(result.peak_memory_bytes, budget.bytes)
        return Outcome(Status.OOM, config, 0.0, peak, result, attrs)
    if result.status == Status.TIMEOUT:
        return Outcome(Status.TIMEOUT, config, 0.0, max(result.peak_memory_bytes, 0), result, attrs)
    status = Status.INTERRUPTED if result.infrastructure else Status.CRASHED
    return Outcome(status, config, 0.0, result.peak_memory_bytes, result, attrs)


def _result_attrs(result: ProbeResult) -> dict[str, Any]:
    data = {key: value for key, value in result.to_dict().items() if key in RESULT_KEYS}
    if result.status != Status.OK:
        data["stderr_tail"] = result.stderr_tail[-2000:]
    return data


def record_outcome(study: optuna.Study, trial: optuna.Trial, outcome: Outcome, budget: Budget) -> FrozenTrial:
    """Tell Optuna: FAIL for infrastructure statuses, else COMPLETE with values and constraints."""
    attrs = {
        Attr.STATUS: outcome.status,
        Attr.CONFIG: outcome.config.to_dict(),
        Attr.PEAK_BYTES: outcome.peak_bytes,
        **outcome.attrs,
    }
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    if outcome.status in FAILED:
        study.tell(trial, state=TrialState.FAIL)
        if _tried_again(outcome) and Attr.RETRY_OF not in trial.user_attrs:
            retry_once(study, trial.params, trial.number, trial.user_attrs)  # measured by a later step
    else:
        _set_constraints(study, trial, outcome, budget)
        study.tell(trial, [outcome.samples_per_sec, float(outcome.peak_bytes)])
    return storage_of(study).get_trial(trial_id(trial))


def _tried_again(outcome: Outcome) -> bool:
    """Interrupted, or crashed because a Ray node was lost under it: no verdict on the configuration, so it
    is probed once more (on a cluster, on the nodes left)."""
    lost = (outcome.attrs.get(Attr.RESULT) or {}).get("lost_node")
    return outcome.status == Status.INTERRUPTED or (outcome.status == Status.CRASHED and bool(lost))


def _set_constraints(study: optuna.Study, trial: optuna.Trial, outcome: Outcome, budget: Budget) -> None:
    """Named constraints, as Optuna 5 stores them (`constraints:<name>`), and the same values as the one list
    Optuna's samplers store for a `constraints_func` (`constraints`): optuna-dashboard reads only that list
    to show a trial infeasible. Optuna reads both; each violates or holds alike, so feasibility is one."""
    constraints = {
        "memory": float(outcome.peak_bytes - budget.limit),
        "runs": 0.0 if outcome.status == Status.OK else 1.0,
    }
    for name, value in constraints.items():
        trial.set_constraint(name, value)
    storage_of(study).set_trial_system_attr(
        trial_id(trial), DASHBOARD_CONSTRAINTS_KEY, list(constraints.values())
    )


def outcome_to_dict(outcome: Outcome) -> dict[str, Any]:
    return {
        "status": outcome.status,
        "config": outcome.config.to_dict(),
        "samples_per_sec": outcome.samples_per_sec,
        "peak_bytes": outcome.peak_bytes,
        "attrs": outcome.attrs,
    }


def outcome_from_dict(data: dict[str, Any]) -> Outcome:
    return Outcome(
        data["status"],
        ProbeConfig(**data["config"]),
        float(data["samples_per_sec"]),
        int(data["peak_bytes"]),
        attrs={**data["attrs"], Attr.RECORDED_LATE: True},
    )
