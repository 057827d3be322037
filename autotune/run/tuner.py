"""The tuner: one trial at a time per probe slot — propose and claim, decide, probe, record.

It composes the parts that each own one concern: `coordination` (claims, quota, twins, dead workers),
`policy` (what to do with a config: pure), the probe launcher, `outcome` (how it is told to Optuna) and
`outage` (retries, pending measurements). Several threads may call `step` at once (one per probe slot).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from autotune.config.knobs import ProbeConfig
from autotune.memory.budget import Budget
from autotune.memory.calibration import MemoryModel
from autotune.probe.conditions import disturbance
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.search import policy
from autotune.space.model import SearchSpace, sample_config
from autotune.status import Attr, Status
from autotune.study import outage
from autotune.study.coordination import Claims, heartbeat, wait_for_twin
from autotune.study.optuna_private import trial_id
from autotune.study.outcome import Outcome, outcome_from_dict, outcome_from_result, record_outcome
from autotune.study.storage import PATIENCE_SECONDS, retrying
from autotune.study.trials import finished_trials
from autotune.trainers.registry import run_probe

__all__ = ["LONGER_TRY", "Tuner"]

LONGER_TRY = 2.0  # a hand-made config that timed out on a busy machine is probed once more with this × limit


def _baseline_timed_out_busy(trial: optuna.Trial, outcome: Outcome) -> str:
    """What other work took, when the hand-made config (the gain's baseline) timed out under it; else ''."""
    if not trial.user_attrs.get(Attr.SEED_CONFIG) or outcome.status != Status.TIMEOUT:
        return ""
    return disturbance((outcome.attrs.get(Attr.RESULT) or {}).get("environment") or {})


@dataclass
class Tuner:
    """Proposes, decides and records trials of one study."""

    study: optuna.Study
    space: SearchSpace
    settings: ProbeSettings
    budget: Budget
    memory_model: MemoryModel  # the priors; each decision calibrates a copy on the study's ok probes
    probe: Callable[..., ProbeResult] = run_probe  # (config, settings, cancel=Event) -> ProbeResult
    prune: bool = True  # False: probe every new proposal (a baseline without the memory model and dominance)
    storage_url: str = ""  # for messages and retries
    patience: float = PATIENCE_SECONDS  # how long a storage outage is ridden out before giving up
    pending_path: Path | None = None  # where a measurement goes when the storage cannot take it
    cancel: threading.Event | None = None  # set by a second Ctrl-C: stop waiting for the storage too
    guard: Callable[[], None] = lambda: None  # raises Unavailable when the study's file is no longer ours
    on_probe_start: Callable[[int, ProbeConfig], None] = lambda number, config: None  # the live view
    # trial number -> (config, monotonic start) of the trials being decided or probed now (the live view)
    active: dict[int, tuple[ProbeConfig, float]] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _claims: Claims = field(init=False, repr=False)
    pending: outage.PendingFile = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._claims = Claims(self.study, lambda trial: sample_config(self.space, trial))
        self.pending = outage.PendingFile(self.pending_path)

    def step(
        self, cancel=None, settings: ProbeSettings | None = None, quota: int | None = None
    ) -> FrozenTrial | None:
        """Propose, decide and record one trial. None: `quota` trials are already complete or running."""
        proposal = self.propose(quota)
        if proposal is None:
            return None
        trial, config = proposal
        self.active[trial.number] = (config, time.monotonic())
        try:
            return self._settle(trial, config, cancel, settings)
        finally:
            self.active.pop(trial.number, None)

    def _settle(
        self, trial: optuna.Trial, config: ProbeConfig, cancel, settings: ProbeSettings | None
    ) -> FrozenTrial:
        with heartbeat(self.study, trial_id(trial)):
            saved = trial.user_attrs.get(
                Attr.SAVED_OUTCOME
            )  # a measurement the storage could not take before
            if saved is not None:
                outcome = outcome_from_dict(saved)
            else:
                wait_for_twin(self.study, trial.number, config, self.retry, cancel)
                outcome = self.decide(config, cancel, settings, number=trial.number)
                if busy := _baseline_timed_out_busy(trial, outcome):
                    outcome = self._longer_try(trial.number, config, cancel, settings, outcome, busy)
            return self.record_or_keep(trial, outcome)

    def _longer_try(
        self,
        number: int,
        config: ProbeConfig,
        cancel,
        settings: ProbeSettings | None,
        first: Outcome,
        busy: str,
    ) -> Outcome:
        """The hand-made config timed out while other work held the machine: the gain rests on it, so it is
        probed once more with LONGER_TRY times the limit; the outcome records the first try."""
        settings = settings or self.settings
        limit = settings.timeout_seconds * LONGER_TRY
        self.on_probe_start(number, config)
        result = self.probe(config, dataclasses.replace(settings, timeout_seconds=limit), cancel=cancel)
        attrs = {k: v for k, v in first.attrs.items() if k != Attr.RESULT}
        attrs[Attr.FIRST_TRY] = {
            "status": first.status,
            "timeout_seconds": settings.timeout_seconds,
            "busy": busy,
            "second_timeout_seconds": limit,
        }
        return outcome_from_result(config, result, self.budget, attrs)

    def propose(self, quota: int | None) -> tuple[optuna.Trial, ProbeConfig] | None:
        """Ask for a trial and claim its config, unless `quota` is reached; one thread at a time."""
        with self._lock:
            self.guard()
            return self.retry(lambda: self._claims.ask_and_claim(quota), "asking for a trial")

    def decide(
        self, config: ProbeConfig, cancel=None, settings: ProbeSettings | None = None, number: int = -1
    ) -> Outcome:
        """The policy's decision on the study's trials so far, with a probe when it asks for one."""
        trials = self.retry(lambda: finished_trials(self.study), "reading the trials")
        decision = policy.decide(config, trials, self.memory_model, self.budget, self.prune)
        if isinstance(decision, Outcome):
            return decision
        self.on_probe_start(number, config)
        result = self.probe(config, settings or self.settings, cancel=cancel)
        if cancel is not None and cancel.is_set() and result.status != Status.OK:  # killed by a second Ctrl-C
            return Outcome(Status.INTERRUPTED, config, 0.0, result.peak_memory_bytes, result, decision.attrs)
        return outcome_from_result(config, result, self.budget, decision.attrs)

    def record(self, trial: optuna.Trial, outcome: Outcome) -> FrozenTrial:
        self.guard()
        return record_outcome(self.study, trial, outcome, self.budget)

    def record_or_keep(self, trial: optuna.Trial, outcome: Outcome) -> FrozenTrial:
        return outage.record_or_keep(self.study, trial, outcome, self.record, self.retry, self.pending)

    def replay_pending(self, path: Path | None = None) -> outage.Replay:
        replayed = path or self.pending.path
        if replayed is None:
            raise ValueError("no pending file to replay: this tuner keeps its measurements in memory")
        return outage.replay_pending(self.study, replayed, self.record)

    def retry(self, operation, what: str):
        url = self.storage_url or "the study's storage"
        return retrying(operation, what, url, self.patience, cancel=self.cancel)
