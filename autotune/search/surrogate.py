"""How long an iteration of a configuration will take, phase by phase, from the study's own probes.

A PPO iteration is the sum of its phases, and each phase depends on few knobs: the rollout on the rollout
batch and the workers, the scoring (old, reference and value passes) on the forward micro batch, the update
on the micro batch and checkpointing; how the states are held (sharding, offload) and any searched recipe
knob touch every phase. Every probe times every phase, so one probe teaches all three models at once and
a configuration never probed is predicted from the phases it shares with those that were.

Each phase's log-seconds is a Bayesian linear model of its knobs (a batch knob as log2 and its square, a
choice as indicators), with priors that say what is known before any probe: a larger batch is faster per
sample, checkpointing recomputes, sharding and offload communicate. The posterior gives a mean and a
spread per configuration; `optimistic_speed` ranks by samples/sec at the optimistic end of the spread,
so an untried knob value that might win is tried once and a settled one is not (an upper confidence bound).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.config.knobs import BUDGET_KNOBS, ProbeConfig

__all__ = ["PHASE_KNOBS", "Observation", "SpeedModel", "knob_values"]

# the knobs each phase's time depends on, beyond the holding and the recipe (which touch every phase)
PHASE_KNOBS = {  # with verl's own knobs (--engine verl): vLLM's in the rollout, dynamic batches in the others
    "rollout": (
        "rollout_batch_size",
        "num_rollout_workers",
        "gpu_memory_utilization",
        "tensor_model_parallel_size",
        "max_num_seqs",
    ),
    "scoring": (
        "log_prob_micro_batch_size",
        "use_dynamic_bsz",
        "log_prob_max_token_len_per_gpu",
        "critic_max_token_len_per_gpu",
    ),
    "update": (
        "micro_batch_size",
        "gradient_checkpointing",
        "use_dynamic_bsz",
        "ppo_max_token_len_per_gpu",
        "critic_max_token_len_per_gpu",
    ),
}
EVERY_PHASE = (
    "sharding",
    "param_offload",
    "optimizer_offload",
    "offload_policy",
    "train_batch_size",
    "mini_batch_size",
    "max_prompt_length",
    "max_response_length",
)
BATCHES = ("rollout_batch_size", "log_prob_micro_batch_size", "micro_batch_size")
# prior means of the coefficients (log-seconds per unit of feature): per doubling of the phase's own batch
# the phase gets faster (fewer, fuller calls); checkpointing, sharding and offload cost time; a recipe knob
# that grows the work grows the time
PRIOR_SLOPE = {name: -0.3 for name in (*BATCHES, *BUDGET_KNOBS)} | {
    "train_batch_size": 0.7,
    "mini_batch_size": 0.0,
    "max_prompt_length": 0.3,
    "max_response_length": 0.5,
}
PRIOR_FLAG = {
    "gradient_checkpointing": 0.15,
    "param_offload": 0.3,
    "optimizer_offload": 0.3,
    "offload_policy": 0.5,
}
PRIOR_SHARDED = 0.2  # a sharded holding (either kind) against replicate
PRIOR_SD = {"slope": 0.5, "square": 0.15, "flag": 0.4, "intercept": 3.0}
NOISE_SD = 0.08  # a phase's log-seconds from probe to probe, at least (CPU probes: about 5%)


def knob_values(config: ProbeConfig, gpus: int) -> dict[str, Any]:
    """The values the phases depend on: the forward micro batch as used, the mini batch as m·g·W."""
    values = {name: getattr(config, name) for name in (*BATCHES, *EVERY_PHASE) if hasattr(config, name)}
    values["log_prob_micro_batch_size"] = config.forward_micro_batch_size
    values["mini_batch_size"] = config.micro_batch_size * config.gradient_accumulation_steps * gpus
    values["num_rollout_workers"] = config.num_rollout_workers
    values["gradient_checkpointing"] = config.gradient_checkpointing
    # verl's knobs: a feature only where the candidates differ (a rule's None never varies with a value);
    # each budget as the tokens its pass's micro-batch may hold (an unset one follows the actor's)
    for name in ("gpu_memory_utilization", "tensor_model_parallel_size", "max_num_seqs", "use_dynamic_bsz"):
        values[name] = getattr(config, name)
    for name, budget in zip(BUDGET_KNOBS, _pass_budgets(config), strict=True):
        values[name] = budget
    return values


def _pass_budgets(config: ProbeConfig) -> tuple[int, int, int]:
    """The tokens a micro-batch of each pass (update, forward, critic) may hold: the budgets under dynamic
    batch size, else the micro batches at full length; one scale for both modes."""
    if config.use_dynamic_bsz:
        return config.token_budgets
    length = config.sequence_length
    update = config.micro_batch_size * length
    return update, config.forward_micro_batch_size * length, update


@dataclass(frozen=True)
class Observation:
    """One ok probe: its configuration, seconds per phase and seconds per iteration."""

    config: ProbeConfig
    phase_seconds: dict[str, float]
    iteration_seconds: float

    @classmethod
    def of(cls, config: ProbeConfig, result: dict[str, Any]) -> Observation:
        """From a trial's stored result; a result without phases is one phase, the iteration."""
        iteration = float(result.get("iteration_seconds") or 0.0)
        phases = {k: float(v) for k, v in (result.get("phase_seconds") or {}).items()}
        return cls(config, {**phases, "iteration": iteration}, iteration)


@dataclass(frozen=True)
class _Feature:
    knob: str
    kind: str  # "slope" (centred log2), "square" (its square, centred), "flag" (bool), "level" (a choice)
    centre: float = 0.0
    level: Any = None

    def value(self, values: dict[str, Any]) -> float:
        raw = values[self.knob]
        if self.kind == "flag":
            return float(bool(raw))
        if self.kind == "level":
            return float(raw == self.level)
        x = float(np.log2(raw))
        return x - self.centre if self.kind == "slope" else x * x - self.centre

    def prior(self) -> tuple[float, float]:
        """(mean, sd) of the coefficient before any probe."""
        if self.kind == "slope":
            return PRIOR_SLOPE.get(self.knob, 0.0), PRIOR_SD["slope"]
        if self.kind == "square":
            return 0.0, PRIOR_SD["square"]
        if self.kind == "flag":
            return PRIOR_FLAG.get(self.knob, 0.0), PRIOR_SD["flag"]
        return (PRIOR_SHARDED if self.knob == "sharding" else 0.0), PRIOR_SD["flag"]


def _features(knobs: Sequence[str], candidates: Sequence[dict[str, Any]]) -> list[_Feature]:
    """The features of the knobs that vary among the candidates (a constant knob is in the intercept)."""
    features: list[_Feature] = []
    for knob in knobs:
        levels = sorted({c[knob] for c in candidates}, key=repr)
        if len(levels) < 2:
            continue
        if isinstance(levels[0], bool):
            features.append(_Feature(knob, "flag"))
        elif isinstance(levels[0], str):
            features += [_Feature(knob, "level", level=level) for level in levels if level != "replicate"][
                : len(levels) - 1
            ]
        else:
            logs = np.log2(np.array([c[knob] for c in candidates], dtype=float))
            features.append(_Feature(knob, "slope", centre=float(logs.mean())))
            if len(levels) >= 3:
                features.append(_Feature(knob, "square", centre=float((logs**2).mean())))
    return features


@dataclass
class _PhaseModel:
    """Bayesian linear regression of one phase's log-seconds on its features."""

    features: list[_Feature]
    mean: np.ndarray
    cov: np.ndarray

    @classmethod
    def fit(cls, features: list[_Feature], rows: list[dict[str, Any]], seconds: list[float]) -> _PhaseModel:
        # floored like y below: a result without timings (0 s) would make the intercept -inf, the model NaN
        priors = [
            (float(np.log(max(float(np.mean(seconds)), 1e-6))) if seconds else 0.0, PRIOR_SD["intercept"])
        ]
        priors += [f.prior() for f in features]
        prior_mean = np.array([m for m, _ in priors])
        prior_precision = np.diag([1.0 / sd**2 for _, sd in priors])
        if not rows:
            return cls(features, prior_mean, np.linalg.inv(prior_precision))
        design = cls._design(features, rows)
        y = np.log(np.maximum(np.array(seconds), 1e-6))
        noise = max(NOISE_SD**2, _residual_variance(design, y, prior_mean, prior_precision))
        precision = prior_precision + design.T @ design / noise
        cov = np.linalg.inv(precision)
        mean = cov @ (prior_precision @ prior_mean + design.T @ y / noise)
        return cls(features, mean, cov)

    @staticmethod
    def _design(features: list[_Feature], rows: list[dict[str, Any]]) -> np.ndarray:
        return np.array([[1.0] + [f.value(r) for f in features] for r in rows])

    def predict(self, rows: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and sd of log-seconds for each row."""
        design = self._design(self.features, rows)
        mean = design @ self.mean
        sd = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", design, self.cov, design), 0.0))
        return mean, sd


def _residual_variance(design: np.ndarray, y: np.ndarray, mean: np.ndarray, precision: np.ndarray) -> float:
    """The noise the data show around a first, noise-floor fit (0 while too few points to tell)."""
    if len(y) <= design.shape[1]:
        return 0.0
    cov = np.linalg.inv(precision + design.T @ design / NOISE_SD**2)
    fitted = design @ (cov @ (precision @ mean + design.T @ y / NOISE_SD**2))
    return float(np.sum((y - fitted) ** 2) / (len(y) - design.shape[1]))


class SpeedModel:
    """Predicted samples/sec of configurations from a study's ok probes (none: the priors alone)."""

    def __init__(self, candidates: Sequence[ProbeConfig], gpus: int, observations: Sequence[Observation]):
        self.gpus = gpus
        rows = [knob_values(c, gpus) for c in candidates]
        seen = [knob_values(o.config, gpus) for o in observations]
        phases = _phases(observations)
        self.phases: dict[str, _PhaseModel] = {}
        for phase in phases:
            own = PHASE_KNOBS.get(phase, tuple(k for ks in PHASE_KNOBS.values() for k in ks))
            knobs = [k for k in (*own, *EVERY_PHASE) if rows and k in rows[0]]
            seconds = [o.phase_seconds[phase] for o in observations]
            self.phases[phase] = _PhaseModel.fit(_features(knobs, rows + seen), seen, seconds)
        other = [o.iteration_seconds - sum(o.phase_seconds.get(p, 0.0) for p in phases) for o in observations]
        self.other_seconds = max(0.0, float(np.mean(other))) if other else 0.0

    def optimistic_speed(self, configs: Sequence[ProbeConfig], boldness: float) -> np.ndarray:
        """samples/sec with each phase at `boldness` standard deviations below its mean log-seconds
        (0: the expected speed)."""
        rows = [knob_values(c, self.gpus) for c in configs]
        seconds = np.full(len(rows), self.other_seconds)
        for model in self.phases.values():
            mean, sd = model.predict(rows)
            seconds = seconds + np.exp(mean - boldness * sd)
        samples = np.array([c.train_batch_size for c in configs], dtype=float)
        return samples / np.maximum(seconds, 1e-9)


def _phases(observations: Sequence[Observation]) -> list[str]:
    """The phases every observation timed: the probe's rollout, scoring and update (all three before any
    probe), else the iteration as one phase (`Observation.of` puts it there)."""
    if not observations:
        return list(PHASE_KNOBS)
    common = set.intersection(*(set(o.phase_seconds) for o in observations))
    return [p for p in PHASE_KNOBS if p in common] if all(p in common for p in PHASE_KNOBS) else ["iteration"]
