"""The Optuna study: propose a configuration, decide whether it needs a probe, probe it, record it.

Every trial gets a `status` user attribute. Statuses and how they are recorded (DESIGN §5):

- ok, oom: COMPLETE with values (samples/sec, peak bytes) and the `memory` constraint
  peak − budget·(1 − headroom); an OOM has 0 samples/sec and a positive violation, so that TPE, NSGA-II
  and GP all learn where the wall is (a FAIL trial would be ignored by every sampler).
- predicted_oom (memory model), inferred_oom (dominates a measured OOM): COMPLETE like an OOM, no probe.
- timeout: COMPLETE, 0 samples/sec, infeasible through the `runs` constraint (too slow or hung).
- crashed, interrupted: FAIL (infrastructure, or a bug: not a property the sampler should learn).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import UserError
from autotune.knobs import ProbeConfig
from autotune.launcher import ProbeSettings, run_probe
from autotune.memory_model import MemoryModel
from autotune.result import GIB, ProbeResult
from autotune.space import SearchSpace, at_least_as_large, config_to_params, sample_config

DIRECTIONS = [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
METRIC_NAMES = ["samples_per_sec", "peak_memory_bytes"]
MEASURED = ("ok", "oom", "timeout")
NOT_LAUNCHED = ("predicted_oom", "inferred_oom")
# A configuration is skipped as predicted_oom only when the prediction exceeds the budget by this margin;
# the margin narrows as the model is calibrated on more of this study's own measurements.
PREDICTION_MARGINS = ((3, 0.10), (1, 0.25), (0, 0.60))


def prediction_margin(calibration_points: int) -> float:
    return next(margin for points, margin in PREDICTION_MARGINS if calibration_points >= points)


@dataclass
class Budget:
    bytes: int
    headroom: float

    @property
    def limit(self) -> float:
        """Feasible peaks stay at or below this: the budget less its headroom."""
        return self.bytes * (1.0 - self.headroom)


@dataclass
class Outcome:
    """What happened to one trial, before it is told to Optuna."""

    status: str
    config: ProbeConfig
    samples_per_sec: float = 0.0
    peak_bytes: int = 0
    result: ProbeResult | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


def make_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    """Samplers are not stored with a study: always pass one (Optuna 5 changed the default)."""
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5, constant_liar=True)


def open_study(storage: str, name: str, seed: int | None) -> optuna.Study:
    """Create or resume; a study with other objectives is an error (Optuna would silently ignore it)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our progress bar says what each trial did
    try:
        study = optuna.create_study(
            storage=storage,
            study_name=name,
            directions=["maximize", "minimize"],
            sampler=make_sampler(seed),
            load_if_exists=True,
        )
    except Exception as exc:  # sqlalchemy/driver errors vary by backend: all mean "cannot open it"
        raise UserError(
            f"--storage {redact(storage)}: cannot open it ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); use sqlite:///PATH or a reachable "
            f"database URL"
        ) from None
    if list(study.directions) != DIRECTIONS:
        raise UserError(
            f"study {name!r} in {redact(storage)} has directions "
            f"{[d.name.lower() for d in study.directions]}, not [maximize, minimize]: "
            f"it was made by something else; choose another --study name"
        )
    if study.metric_names is None:
        with warnings.catch_warnings():  # set_metric_names is "experimental" in Optuna; its result is not
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(METRIC_NAMES)
    elif list(study.metric_names) != METRIC_NAMES:
        raise UserError(
            f"study {name!r} measures {study.metric_names}, not {METRIC_NAMES}: choose another --study name"
        )
    return study


def redact(url: str) -> str:
    """A storage URL without its password, for every message a user or a log may see."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


# --- recovery and bookkeeping -------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_stale_trials(study: optuna.Study) -> list[int]:
    """RUNNING trials whose tuner on this host is dead: mark them FAIL and enqueue them once more.

    A trial that was itself such a retry is not retried again (a config that kills the tuner twice is
    recorded as failed, not re-run forever).
    """
    host = socket.gethostname()
    recovered = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        attrs = trial.user_attrs
        if attrs.get("host") != host or _pid_alive(int(attrs.get("tuner_pid", -1))):
            continue
        study._storage.set_trial_user_attr(trial._trial_id, "status", "interrupted")
        study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        if not attrs.get("retry_of") and trial.params:
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        recovered.append(trial.number)
    return recovered


def finished_trials(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def trial_config(trial: FrozenTrial) -> ProbeConfig | None:
    raw = trial.user_attrs.get("config")
    return ProbeConfig(**raw) if raw else None


def config_key(config: ProbeConfig) -> str:
    return json.dumps(config.to_dict(), sort_keys=True)


def enqueue_seed_configs(study: optuna.Study, space: SearchSpace) -> list[str]:
    """The seed's hand-made configs go first (once per study), so the report can show the gain over them."""
    if study.user_attrs.get("seeded"):
        return []
    enqueued = []
    for seed in space.seed_configs:
        params = config_to_params(space, seed.config)
        if params is not None:
            study.enqueue_trial(params, user_attrs={"seed_config": seed.name})
            enqueued.append(seed.name)
    study.set_user_attr("seeded", True)
    return enqueued


# --- the tuner loop --------------------------------------------------------------------------------------


@dataclass
class Tuner:
    study: optuna.Study
    space: SearchSpace
    settings: ProbeSettings
    budget: Budget
    memory_model: MemoryModel
    probe: Callable[..., ProbeResult] = run_probe  # (config, settings, cancel=Event) -> ProbeResult
    prune: bool = True  # False: probe every new proposal (a baseline without the memory model and dominance)

    def calibrate(self, trials: list[FrozenTrial]) -> int:
        """Refit the memory model from the priors on every ok probe among `trials` (the study's so far)."""
        points = [
            (trial_config(t), t.user_attrs["peak_bytes"])
            for t in trials
            if t.user_attrs.get("status") == "ok" and not t.user_attrs.get("duplicate_of")
        ]
        prior = self.memory_model
        self.memory_model = MemoryModel(prior.arch, prior.world_size, prior.device).calibrate(points)
        return len(points)

    def measured_ooms(self, trials: list[FrozenTrial]) -> list[tuple[int, ProbeConfig, int]]:
        return [
            (t.number, trial_config(t), t.user_attrs.get("peak_bytes", self.budget.bytes))
            for t in trials
            if t.user_attrs.get("status") == "oom"
        ]

    @staticmethod
    def previous_measurement(config: ProbeConfig, trials: list[FrozenTrial]) -> FrozenTrial | None:
        """The probe that already measured this exact config (compared as the stored config dicts)."""
        wanted = config.to_dict()
        for trial in trials:
            attrs = trial.user_attrs
            if (
                attrs.get("status") in MEASURED
                and not attrs.get("duplicate_of")
                and attrs.get("config") == wanted
            ):
                return trial
        return None

    def decide(self, config: ProbeConfig, cancel=None) -> Outcome:
        """Skip what is already known (measured, dominated, predicted); otherwise launch a probe."""
        trials = finished_trials(self.study)  # read once: every check below looks at the same trials
        previous = self.previous_measurement(config, trials)
        if previous is not None:
            return Outcome(
                previous.user_attrs["status"],
                config,
                previous.values[0],
                int(previous.values[1]),
                attrs={"duplicate_of": previous.number},
            )
        if not self.prune:
            return outcome_from_result(
                config, self.probe(config, self.settings, cancel=cancel), self.budget, {}
            )
        for number, oom_config, oom_peak in self.measured_ooms(trials):
            if at_least_as_large(config, oom_config):
                return Outcome(
                    "inferred_oom",
                    config,
                    0.0,
                    max(int(oom_peak), self.budget.bytes),
                    attrs={"dominates_oom_trial": number},
                )
        points = self.calibrate(trials)
        predicted = self.memory_model.predict(config)
        attrs = {"predicted_peak_bytes": predicted, "calibration_points": points}
        if predicted > self.budget.bytes * (1 + prediction_margin(points)):
            return Outcome("predicted_oom", config, 0.0, predicted, attrs=attrs)
        result = self.probe(config, self.settings, cancel=cancel)
        if cancel is not None and cancel.is_set():
            return Outcome("interrupted", config, 0.0, result.peak_memory_bytes, result, attrs)
        return outcome_from_result(config, result, self.budget, attrs)

    def record(self, trial: optuna.Trial, outcome: Outcome) -> FrozenTrial:
        attrs = {
            "status": outcome.status,
            "config": outcome.config.to_dict(),
            "peak_bytes": outcome.peak_bytes,
            **outcome.attrs,
        }
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        if outcome.status in ("crashed", "interrupted"):
            self.study.tell(trial, state=TrialState.FAIL)
            if outcome.status == "interrupted":  # measured on the next run of the same command
                self.study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        else:
            failed = 0.0 if outcome.status == "ok" else 1.0
            trial.set_constraint("memory", outcome.peak_bytes - self.budget.limit)
            trial.set_constraint("runs", failed)
            self.study.tell(trial, [outcome.samples_per_sec, float(outcome.peak_bytes)])
        return self.study.trials[trial.number]

    def step(self, cancel=None) -> FrozenTrial:
        trial = self.study.ask()
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("tuner_pid", os.getpid())
        config = sample_config(self.space, trial)
        return self.record(trial, self.decide(config, cancel))


def outcome_from_result(config: ProbeConfig, result: ProbeResult, budget: Budget, attrs: dict) -> Outcome:
    attrs = {**attrs, "result": _result_attrs(result)}
    if result.status == "ok":
        return Outcome("ok", config, result.samples_per_sec, result.peak_memory_bytes, result, attrs)
    if result.status == "oom":
        attrs["oom_kind"] = result.oom_kind
        return Outcome("oom", config, 0.0, max(result.peak_memory_bytes, budget.bytes), result, attrs)
    if result.status == "timeout":
        return Outcome("timeout", config, 0.0, max(result.peak_memory_bytes, 0), result, attrs)
    return Outcome("crashed", config, 0.0, result.peak_memory_bytes, result, attrs)


def _result_attrs(result: ProbeResult) -> dict[str, Any]:
    """The figures worth keeping with the trial (the stderr tail only when something went wrong)."""
    keep = (
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
    )
    data = {key: value for key, value in result.to_dict().items() if key in keep}
    if result.status != "ok":
        data["stderr_tail"] = result.stderr_tail[-2000:]
    return data


# --- summaries ---------------------------------------------------------------------------------------------


def status_counts(study: optuna.Study) -> dict[str, int]:
    counts: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        status = trial.user_attrs.get("status", trial.state.name.lower())
        counts[status] = counts.get(status, 0) + 1
    return counts


def ok_front(study: optuna.Study) -> list[FrozenTrial]:
    """Optuna's feasible Pareto front, ok trials only: fastest first, ties to less memory, originals first."""
    front = [t for t in study.best_trials if t.user_attrs.get("status") == "ok"]
    return sorted(front, key=lambda t: (-t.values[0], t.values[1], "duplicate_of" in t.user_attrs, t.number))


def pareto_best(
    front: list[FrozenTrial], budget: Budget, exclude: set[int] = frozenset()
) -> FrozenTrial | None:
    """The first trial of a sorted front within budget·(1 − headroom), skipping excluded trials and their
    duplicates (a confirmation probe rejected them)."""
    for trial in front:
        if (
            trial.values[1] <= budget.limit
            and trial.number not in exclude
            and trial.user_attrs.get("duplicate_of") not in exclude
        ):
            return trial
    return None


def best_feasible(study: optuna.Study, budget: Budget) -> FrozenTrial | None:
    """The Pareto-best trial: the one the report recommends."""
    return pareto_best(ok_front(study), budget)


def memory_model_error(study: optuna.Study, min_points: int = 1) -> tuple[float | None, int]:
    """Median relative error of predictions made *before* each probe, once calibrated on ≥ min_points."""
    errors = []
    for trial in finished_trials(study):
        attrs = trial.user_attrs
        if (
            attrs.get("status") == "ok"
            and attrs.get("calibration_points", 0) >= min_points
            and attrs.get("predicted_peak_bytes")
            and not attrs.get("duplicate_of")
        ):
            errors.append(abs(attrs["predicted_peak_bytes"] - attrs["peak_bytes"]) / attrs["peak_bytes"])
    return (statistics.median(errors) if errors else None), len(errors)


def describe_budget(budget: Budget) -> str:
    limit, headroom = budget.limit / GIB, budget.headroom
    return f"{budget.bytes / GIB:.2f} GiB (feasible ≤ {limit:.2f} GiB with {headroom:.0%} headroom)"
