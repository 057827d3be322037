"""Hand-made studies for the report tests: trials recorded as `Tuner.record` records them, no probes."""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna

from autotune.config.knobs import ProbeConfig
from autotune.memory.budget import Budget
from autotune.probe.contract import ProbeResult
from autotune.study.outcome import Outcome, record_outcome
from autotune.units import GIB

BUDGET = Budget(int(1.0 * GIB), 0.10)  # feasible: peak <= 0.9 GiB
BASE = ProbeConfig(
    rollout_batch_size=8,
    train_batch_size=32,
    micro_batch_size=2,
    gradient_accumulation_steps=4,
    num_rollout_workers=1,
    max_prompt_length=32,
    max_response_length=16,
)


def new_study(name: str = "report-test", storage: str | None = None) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        directions=["maximize", "minimize"],
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    return study


def result_attrs(
    config: ProbeConfig, speed: float, peak: int, status: str = "ok", gpus: int = 1, gpu: str | None = None
) -> dict[str, Any]:
    """What `study._result_attrs` keeps of a probe result."""
    seconds = config.train_batch_size / speed if speed else 0.0
    phases = {
        "rollout": 0.5 * seconds,
        "scoring": 0.2 * seconds,
        "advantages": 0.01 * seconds,
        "update": 0.29 * seconds,
    }
    return {
        "status": status,
        "samples_per_sec": speed,
        "tokens_per_sec": speed * config.sequence_length,
        "iteration_seconds": seconds,
        "phase_seconds": phases if speed else {},
        "peak_memory_bytes": peak,
        "peak_memory_source": "rss",
        "wall_seconds": 20.0 + 2 * seconds,
        "world_size": gpus,
        "device": "cuda" if gpu else "cpu",
        "environment": {"gpu": gpu, "torch": "2.13.0"},
    }


def record(
    study: optuna.Study,
    status: str,
    config: ProbeConfig,
    speed: float = 0.0,
    peak_gib: float = 0.0,
    budget: Budget = BUDGET,
    measured: bool | None = None,
    **attrs: Any,
) -> optuna.trial.FrozenTrial:
    """One trial through `record_outcome`; measured probes get a `result` like the launcher's."""
    peak = int(peak_gib * GIB)
    if measured if measured is not None else status in ("ok", "oom", "timeout", "crashed"):
        attrs.setdefault("result", result_attrs(config, speed, peak, status))
    trial = study.ask()
    trial.suggest_int("log2_micro_batch_size", 0, 6)  # a parameter, as sample_config would set
    return record_outcome(study, trial, Outcome(status, config, speed, peak, attrs=attrs), budget)


def knobs(**changes: Any) -> ProbeConfig:
    return dataclasses.replace(BASE, **changes)


def standard_study(name: str = "report-test", storage: str | None = None) -> optuna.Study:
    """A small sweep: a hand-made seed, a front, an OOM wall, pruned trials, a fast one over the limit."""
    study = new_study(name, storage)
    record(
        study,
        "ok",
        knobs(),
        10.0,
        0.5,
        seed_config="hand-made (the article's small-GPU config, scaled)",
        predicted_peak_bytes=int(0.55 * GIB),
        calibration_points=0,
    )  # 0
    record(
        study,
        "ok",
        knobs(micro_batch_size=4, gradient_accumulation_steps=2),
        14.0,
        0.6,
        predicted_peak_bytes=int(0.62 * GIB),
        calibration_points=1,
    )  # 1
    record(
        study,
        "ok",
        knobs(micro_batch_size=8, gradient_accumulation_steps=1),
        18.0,
        0.8,
        predicted_peak_bytes=int(0.78 * GIB),
        calibration_points=2,
    )  # 2 chosen
    record(
        study, "oom", knobs(micro_batch_size=16, gradient_accumulation_steps=1), 0.0, 1.0, oom_kind="emulated"
    )  # 3
    record(
        study,
        "inferred_oom",
        knobs(micro_batch_size=16, gradient_accumulation_steps=2, max_response_length=32),
        0.0,
        1.0,
        dominates_oom_trial=3,
    )  # 4
    record(
        study,
        "predicted_oom",
        knobs(micro_batch_size=32, gradient_accumulation_steps=1, max_response_length=64),
        0.0,
        3.0,
        predicted_peak_bytes=int(3.0 * GIB),
        calibration_points=3,
    )  # 5
    record(study, "ok", knobs(gradient_accumulation_steps=1, train_batch_size=16), 9.0, 0.45)  # 6
    record(
        study,
        "ok",
        knobs(micro_batch_size=8, gradient_accumulation_steps=1),
        18.0,
        0.8,
        measured=False,
        duplicate_of=2,
    )  # 7
    record(
        study,
        "ok",
        knobs(micro_batch_size=4, gradient_accumulation_steps=1, max_response_length=8),
        12.0,
        0.7,
    )  # 8 dominated
    record(study, "timeout", knobs(num_rollout_workers=2), 0.0, 0.3)  # 9
    record(
        study,
        "ok",
        knobs(micro_batch_size=8, gradient_accumulation_steps=2, rollout_batch_size=16),
        25.0,
        0.95,
    )  # 10 over limit
    record(study, "crashed", knobs(max_prompt_length=16), 0.0, 0.2)  # 11 FAIL
    return study


def infeasible_study(name: str = "report-none") -> optuna.Study:
    """Nothing fits: an OOM, an ok probe over the limit, a predicted OOM far above the budget."""
    study = new_study(name)
    record(study, "oom", knobs(micro_batch_size=8, gradient_accumulation_steps=1), 0.0, 1.0, oom_kind="cuda")
    record(study, "ok", knobs(micro_batch_size=4, gradient_accumulation_steps=2), 11.0, 0.97)
    record(
        study,
        "predicted_oom",
        knobs(micro_batch_size=16, gradient_accumulation_steps=1),
        0.0,
        2.5,
        predicted_peak_bytes=int(2.5 * GIB),
        calibration_points=1,
    )
    return study


class FakeProbe:
    """A stand-in probe: peak grows with micro batch × response length, speed with the micro batch."""

    def __call__(self, config: ProbeConfig, settings: Any, cancel: Any = None) -> ProbeResult:
        peak = int((0.45 + 0.0002 * config.micro_batch_size * config.max_response_length) * GIB)
        if peak > 0.70 * GIB:
            return ProbeResult(status="oom", oom_kind="emulated", peak_memory_bytes=peak, wall_seconds=5.0)
        speed = 4.0 + config.micro_batch_size - 0.01 * config.max_response_length
        seconds = config.train_batch_size / speed
        return ProbeResult(
            status="ok",
            samples_per_sec=speed,
            tokens_per_sec=speed * config.sequence_length,
            iteration_seconds=seconds,
            phase_seconds={"rollout": 0.6 * seconds, "update": 0.4 * seconds},
            peak_memory_bytes=peak,
            peak_memory_source="rss",
            wall_seconds=10.0 + seconds,
            environment={"gpu": None},
        )
