"""The study's sampler: it proposes the configuration its own measurements say is fastest among those the
memory model says fit.

Every space is a finite set of valid configurations (`SearchSpace.grid`), so rather than drawing knob by knob
the sampler looks at all of them: it drops what is decided (measured, or at least as large as a probe that ran
out of memory or passed the limit), keeps what the memory model, calibrated on the study's ok probes and
shifted by the error it made on configurations held alike, puts within the budget less its headroom, and
takes the one with the best optimistic samples/sec from the phase-by-phase speed model
(autotune.search.surrogate). Before any probe that is the largest batches that fit; each probe then sharpens
both models. The objective is one: samples/sec under the memory constraint — the lower-memory
end of the Pareto front, which a two-objective sampler spends probes on, is not what the report hands over.

It is an Optuna sampler, so storage, resume, workers, the Optuna CLI and the dashboard work as with any:
the chosen configuration is handed to `sample_config` parameter by parameter (`config_to_params`: the knobs
by name and real value). Enqueued trials (the hand-made configs, retries) keep their own parameters.
Configurations being probed by running trials (other threads or workers) are not proposed
again.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence, Set
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.config.knobs import ProbeConfig
from autotune.memory.budget import Budget
from autotune.memory.calibration import MemoryModel
from autotune.search.policy import calibrated
from autotune.search.surrogate import Observation, SpeedModel
from autotune.space.model import (
    SearchSpace,
    at_least_as_large,
    config_to_params,
)
from autotune.space.specs import MEMORY_EQUAL_FIELDS
from autotune.status import Attr, Status
from autotune.study.trials import config_key, measured_ok, oom_phase, trial_config

__all__ = ["BOLDNESS", "MAX_CANDIDATES", "SystemSampler", "choose_next"]

BOLDNESS = 1.0  # standard deviations of optimism in the speed model's ranking
MAX_CANDIDATES = 20_000  # a larger space is searched through a random subset of this size


class SystemSampler(optuna.samplers.BaseSampler):
    """Proposes whole configurations of `space` (see the module's docstring)."""

    def __init__(
        self,
        space: SearchSpace,
        prior: MemoryModel,
        budget: Budget,
        seed: int | None = None,
        boldness: float = BOLDNESS,
    ) -> None:
        self.space, self.prior, self.budget, self.boldness = space, prior, budget, boldness
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._rng = random.Random(seed)
        self._candidates: list[ProbeConfig] | None = None
        # trial number (unique within the study, which is this sampler's only one) -> the configuration chosen
        # for it and its Optuna parameters (None: nothing left to choose)
        self._targets: dict[int, tuple[ProbeConfig, dict[str, Any]] | None] = {}
        self._lock = threading.Lock()

    def reseed_rng(self) -> None:
        self._random.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict) -> dict[str, Any]:
        return {}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        with self._lock:
            if trial.number not in self._targets:
                self._targets[trial.number] = self._target(study)
            target = self._targets[trial.number]
        value = target[1].get(param_name) if target is not None else None
        if value is not None and _fits(param_distribution, value):
            return value
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def _target(self, study: optuna.Study) -> tuple[ProbeConfig, dict[str, Any]] | None:
        chosen = self._choose(study)
        if chosen is None:
            return None
        params = config_to_params(self.space, chosen)
        return (chosen, params) if params is not None else None

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Any) -> None:
        with self._lock:
            self._targets.pop(trial.number, None)

    def candidates(self) -> list[ProbeConfig]:
        if self._candidates is None:
            if self.space.size() <= MAX_CANDIDATES:
                self._candidates = self.space.grid()
            else:
                self._candidates = self._rng.sample(self.space.grid(), MAX_CANDIDATES)
        return self._candidates

    def _choose(self, study: optuna.Study) -> ProbeConfig | None:
        trials = study.get_trials(deepcopy=False)
        busy = {config_key(target[0]) for target in self._targets.values() if target is not None}
        busy |= {
            config_key(config)
            for t in trials
            if t.state == TrialState.RUNNING and (config := trial_config(t)) is not None
        }
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        return choose_next(self.candidates(), complete, self.prior, self.budget, busy, self.boldness)


def choose_next(
    candidates: Sequence[ProbeConfig],
    trials: Sequence[FrozenTrial],
    prior: MemoryModel,
    budget: Budget,
    busy: Set[str] = frozenset(),
    boldness: float = BOLDNESS,
) -> ProbeConfig | None:
    """The next configuration to probe given the study's complete `trials`; None when every candidate is
    decided or busy."""
    decided = {config_key(c) for t in trials if (c := trial_config(t)) is not None}
    walls = [  # (config, the verl training phase it ran out of memory in)
        (c, oom_phase(t)) for t in trials if _over_the_limit(t, budget) and (c := trial_config(t)) is not None
    ]
    pool = [
        c
        for c in candidates
        if (key := config_key(c)) not in decided
        and key not in busy
        and not any(at_least_as_large(c, wall, phase) for wall, phase in walls)
    ]
    if not pool:
        return None
    peaks = np.array(predicted_peaks(pool, trials, prior), dtype=float)
    fits = [c for c, peak in zip(pool, peaks, strict=True) if peak <= budget.limit]
    if not fits:  # nothing is predicted to fit: the smallest is the best hope (and teaches the model most)
        return pool[int(np.argmin(peaks))]
    speed = SpeedModel(candidates, prior.world_size, observations(trials))
    return fits[int(np.argmax(speed.optimistic_speed(fits, boldness)))]


def _over_the_limit(trial: FrozenTrial, budget: Budget) -> bool:
    """An OOM, or an ok probe whose peak passed the limit: anything at least as large is no better."""
    if trial.user_attrs.get(Attr.STATUS) == Status.OOM:
        return True
    return measured_ok(trial) and trial.values[1] > budget.limit


def predicted_peaks(
    configs: Sequence[ProbeConfig], trials: Sequence[FrozenTrial], prior: MemoryModel
) -> list[float]:
    """The calibrated memory model's peaks, each shifted by the mean error the study measured on
    configurations held alike (same holding, algorithm, LoRA and KL: `MEMORY_EQUAL_FIELDS`). The calibration
    fits one constant and one factor over every probe; a holding whose states the model gets slightly wrong
    keeps its own offset, and near the limit that offset decides what fits."""
    model, _ = calibrated(prior, trials)
    errors: dict[tuple, list[float]] = {}
    for t in trials:
        config = trial_config(t)
        if measured_ok(t) and config:
            errors.setdefault(_held_alike(config), []).append(t.values[1] - model.predict(config))
    shifts = {kind: float(np.mean(found)) for kind, found in errors.items()}
    return [model.predict(c) + shifts.get(_held_alike(c), 0.0) for c in configs]


def _held_alike(config: ProbeConfig) -> tuple:
    return tuple(getattr(config, name) for name in MEMORY_EQUAL_FIELDS)


def observations(trials: Sequence[FrozenTrial]) -> list[Observation]:
    """The study's ok probes with their phase times (a duplicate is its original's measurement again)."""
    found = []
    for t in trials:
        attrs = t.user_attrs
        config = trial_config(t)
        if measured_ok(t) and config and Attr.RESULT in attrs:
            found.append(Observation.of(config, attrs[Attr.RESULT]))
    return found


def _fits(distribution: BaseDistribution, value: Any) -> bool:
    """Whether Optuna's `distribution` holds `value`, read from its public fields (Optuna's own test is
    private): a chosen parameter the distribution cannot hold is drawn at random, not refused by Optuna."""
    try:  # refuses another kind of value, or a choice not listed
        internal = distribution.to_internal_repr(value)
    except (ValueError, TypeError):
        return False
    if isinstance(distribution, CategoricalDistribution):
        return True  # to_internal_repr found it among the choices
    if isinstance(distribution, IntDistribution):
        low, high, step = distribution.low, distribution.high, distribution.step
        return low <= internal <= high and (internal - low) % step == 0
    if isinstance(distribution, FloatDistribution):
        low_f, high_f, step_f = distribution.low, distribution.high, distribution.step
        if not low_f <= internal <= high_f:
            return False
        steps = (internal - low_f) / step_f if step_f is not None else 0.0
        return abs(steps - round(steps)) < 1e-8  # Optuna's own tolerance for a stepped float
    return False  # no other kind is asked for by `sample_config`
