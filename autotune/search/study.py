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

import contextlib
import json
import math
import os
import socket
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config.knobs import ProbeConfig
from autotune.errors import Unavailable, UserError
from autotune.memory.model import MemoryModel
from autotune.probe.contract import GIB, ProbeResult
from autotune.probe.launcher import ProbeSettings, run_probe
from autotune.search.space import SearchSpace, at_least_as_large, config_to_params, sample_config
from autotune.search.storage import GRACE_SECONDS, PATIENCE_SECONDS, make_storage, redact, retrying, scrub

DIRECTIONS = [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
METRIC_NAMES = ["samples_per_sec", "peak_memory_bytes"]
MEASURED = ("ok", "oom", "timeout")
NOT_LAUNCHED = ("predicted_oom", "inferred_oom")
# A configuration is skipped as predicted_oom only when the prediction exceeds the budget by this margin;
# the margin narrows as the model is calibrated on more of this study's own measurements.
PREDICTION_MARGINS = ((3, 0.10), (1, 0.25), (0, 0.60))
# We record heartbeats ourselves around each probe (see `heartbeat`), with ask/tell rather than optimize.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


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


def open_study(storage: str, name: str, seed: int | None, create: bool = True) -> optuna.Study:
    """Create or resume a study (create=False: only load one); a study with other objectives is an error
    (Optuna would silently ignore the mismatch)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our progress bar says what each trial did
    try:
        backend = make_storage(storage, on_stale=_retry_stale_trial)
        if create:
            study = optuna.create_study(
                storage=backend,
                study_name=name,
                directions=["maximize", "minimize"],
                sampler=make_sampler(seed),
                load_if_exists=True,
            )
        else:
            study = optuna.load_study(study_name=name, storage=backend, sampler=make_sampler(seed))
    except KeyError:
        raise UserError(
            f"--study {name}: no such study in {redact(storage)}; check the name or --storage"
        ) from None
    except UserError:
        raise
    except Exception as exc:  # sqlalchemy/driver errors vary by backend: all mean "cannot open it"
        raise UserError(
            f"--storage {redact(storage)}: cannot open it ({type(exc).__name__}: "
            f"{scrub(str(exc).splitlines()[0] if str(exc) else '', storage)}); use sqlite:///PATH, "
            f"journal:PATH or a reachable database URL"
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


# --- recovery and bookkeeping -------------------------------------------------------------------------


def _process_started(pid: int) -> float | None:
    """When process `pid` started (epoch seconds), or None if there is no such process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:  # exists, but not ours to inspect
        return -1.0


def _tuner_alive(attrs: dict[str, Any]) -> bool:
    """The tuner that claimed a trial on this host still runs: same pid *and* same start time (a restarted
    container reuses pids)."""
    pid = int(attrs.get("tuner_pid", 0))
    if pid <= 0:
        return False
    started = _process_started(pid)
    if started is None:
        return False
    claimed_start = attrs.get("tuner_started")
    return started < 0 or claimed_start is None or abs(started - float(claimed_start)) < 2.0


def _requeue_once(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue a dead tuner's trial once more, unless it was itself a retry (a config that kills the tuner
    twice is recorded as failed, not re-run forever)."""
    if not trial.user_attrs.get("retry_of") and trial.params:
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})


def _retry_stale_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    """Optuna's heartbeat callback: it has already failed `trial`, whose heartbeat went quiet (a finished
    trial takes no new attributes, so its status reads as interrupted through `trial_status`)."""
    _requeue_once(study, trial)


def trial_status(trial: FrozenTrial) -> str:
    """The `status` attribute; a FAIL without one was failed by Optuna's heartbeat: interrupted."""
    if "status" in trial.user_attrs:
        return trial.user_attrs["status"]
    return "interrupted" if trial.state == TrialState.FAIL else trial.state.name.lower()


def _orphaned(trial: FrozenTrial, now: float, grace: float) -> bool:
    """Asked but never claimed (its tuner died, or the storage failed, before the config was set) long ago."""
    started = trial.datetime_start.timestamp() if trial.datetime_start else now
    return "config" not in trial.user_attrs and now - started > grace


def recover_stale_trials(study: optuna.Study, grace_seconds: float = GRACE_SECONDS) -> list[int]:
    """Fail and re-queue RUNNING trials whose tuner is gone; returns their numbers.

    Three ways to know: the tuner ran on this host and its pid is dead (at once); a database storage's
    heartbeat went quiet (Optuna's, after its grace period; any host); or the trial was asked but never
    claimed, over `grace_seconds` ago.
    """
    host, now = socket.gethostname(), time.time()
    running, recovered = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)), []
    for trial in running:
        attrs = trial.user_attrs
        dead_here = attrs.get("host") == host and not _tuner_alive(attrs)
        if (dead_here or _orphaned(trial, now, grace_seconds)) and _fail_trial(
            study, trial._trial_id, "interrupted"
        ):
            _requeue_once(study, trial)
            recovered.append(trial.number)
    with warnings.catch_warnings():  # "experimental" since Optuna 2.9, and the way heartbeats are swept
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # calls _retry_stale_trial for each trial it fails
    were_running = {t.number for t in running}
    recovered += [
        t.number
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        if t.number in were_running and "status" not in t.user_attrs
    ]
    return sorted(recovered)


def _fail_trial(study: optuna.Study, trial_id: int, status: str) -> bool:
    """Mark a running trial FAIL with `status`; False when another worker finished it first."""
    try:
        study._storage.set_trial_user_attr(trial_id, "status", status)
        study._storage.set_trial_state_values(trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    return True


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

TWIN_POLL_SECONDS = 1.0
UNCLAIMED_WAIT_SECONDS = 30.0  # an earlier trial still sampling its config claims it within this
SWEEP_SECONDS = 30.0  # while waiting on other workers' trials, look for dead ones this often


@dataclass
class Tuner:
    """Proposes, decides and records trials; several threads may call `step` at once (one per probe slot)."""

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
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _abandoned: set[int] = field(default_factory=set, init=False, repr=False)

    def calibrated(self, trials: list[FrozenTrial]) -> tuple[MemoryModel, int]:
        """The memory model refitted from the priors on every ok probe among `trials` (the study's so far)."""
        points = [
            (trial_config(t), t.user_attrs["peak_bytes"])
            for t in trials
            if t.user_attrs.get("status") == "ok" and not t.user_attrs.get("duplicate_of")
        ]
        prior = self.memory_model
        return MemoryModel(prior.arch, prior.world_size, prior.device).calibrate(points), len(points)

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

    def decide(self, config: ProbeConfig, cancel=None, settings: ProbeSettings | None = None) -> Outcome:
        """Skip what is already known (measured, dominated, predicted); otherwise launch a probe."""
        settings = settings or self.settings
        # read once: every check below looks at the same trials
        trials = self._retry(lambda: finished_trials(self.study), "reading the trials")
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
            return outcome_from_result(config, self.probe(config, settings, cancel=cancel), self.budget, {})
        for number, oom_config, oom_peak in self.measured_ooms(trials):
            if at_least_as_large(config, oom_config):
                return Outcome(
                    "inferred_oom",
                    config,
                    0.0,
                    max(int(oom_peak), self.budget.bytes),
                    attrs={"dominates_oom_trial": number},
                )
        model, points = self.calibrated(trials)
        predicted = model.predict(config)
        attrs = {"predicted_peak_bytes": predicted, "calibration_points": points}
        if predicted > self.budget.bytes * (1 + prediction_margin(points)):
            return Outcome("predicted_oom", config, 0.0, predicted, attrs=attrs)
        result = self.probe(config, settings, cancel=cancel)
        if cancel is not None and cancel.is_set() and result.status != "ok":  # killed by a second Ctrl-C
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
        if outcome.status in ("crashed", "interrupted", "surplus"):
            self.study.tell(trial, state=TrialState.FAIL)
            if outcome.status == "interrupted":  # measured on the next run of the same command
                self.study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        else:
            failed = 0.0 if outcome.status == "ok" else 1.0
            trial.set_constraint("memory", outcome.peak_bytes - self.budget.limit)
            trial.set_constraint("runs", failed)
            self.study.tell(trial, [outcome.samples_per_sec, float(outcome.peak_bytes)])
        return self.study._storage.get_trial(trial._trial_id)

    # --- one trial, safe to run from several threads and processes at once ---------------------------

    def step(
        self, cancel=None, settings: ProbeSettings | None = None, quota: int | None = None
    ) -> FrozenTrial | None:
        """Propose, decide and record one trial. None: `quota` trials are already complete or running."""
        proposal = self.propose(quota)
        if proposal is None:
            return None
        trial, config = proposal
        with heartbeat(self.study, trial._trial_id):
            saved = trial.user_attrs.get("saved_outcome")  # a measurement the storage could not take before
            if saved is not None:
                outcome = outcome_from_dict(saved)
            else:
                self.wait_for_twin(trial.number, config, cancel)
                outcome = self.decide(config, cancel, settings)
            return self.record_or_keep(trial, outcome)

    def requeue_with_outcome(self, params: dict[str, Any], number: int, outcome: Outcome) -> None:
        """A measurement whose trial another worker failed meanwhile: back into the study as a new trial,
        recorded by a later step without a probe."""
        saved = outcome_to_dict(outcome)  # a new dict: replacing its attrs leaves the outcome's alone
        saved["attrs"] = {k: v for k, v in saved["attrs"].items() if k != "recorded_late"}
        self.study.enqueue_trial(
            params, user_attrs={"saved_outcome": saved, "replay_of": number}, skip_if_exists=False
        )

    def propose(self, quota: int | None) -> tuple[optuna.Trial, ProbeConfig] | None:
        """Ask for a trial and claim its config, unless `quota` is reached; one thread at a time."""
        with self._lock:
            return self._retry(lambda: self._ask_and_claim(quota), "asking for a trial")

    def _ask_and_claim(self, quota: int | None) -> tuple[optuna.Trial, ProbeConfig] | None:
        self._fail_abandoned()
        if quota is not None and len(self.live_trials()) >= quota:
            return None
        trial = self.study.ask()
        self._abandoned.add(trial.number)  # until claimed: a storage error below leaves it to be failed
        beat_now(self.study, trial._trial_id)  # a heartbeat row from the start, so Optuna's sweep sees it
        for key, value in claim_attrs().items():
            trial.set_user_attr(key, value)
        config = sample_config(self.space, trial)  # an enqueued trial's fixed params give its config back
        trial.set_user_attr("config", config.to_dict())  # other workers see what is being probed
        if quota is not None and self.is_surplus(trial.number, quota):
            self.record(trial, Outcome("surplus", config))
            self._abandoned.discard(trial.number)
            return None
        self._abandoned.discard(trial.number)
        return trial, config

    def _fail_abandoned(self) -> None:
        for number in sorted(self._abandoned):
            trial_id = self.study._storage.get_trial_id_from_study_id_trial_number(
                self.study._study_id, number
            )
            _fail_trial(self.study, trial_id, "abandoned")
            self._abandoned.discard(number)

    def live_trials(self) -> list[FrozenTrial]:
        """Complete trials and running ones (any worker's), which count towards the trial quota."""
        states = (TrialState.COMPLETE, TrialState.RUNNING)
        return [
            t for t in self.study.get_trials(deepcopy=False, states=states) if t.number not in self._abandoned
        ]

    def is_surplus(self, number: int, quota: int) -> bool:
        """Two workers may both see quota-1 live trials and both ask: the later-started one stands down."""
        order = sorted(self.live_trials(), key=_start_order)
        numbers = [t.number for t in order]
        return number in numbers and numbers.index(number) >= quota

    def wait_for_twin(self, number: int, config: ProbeConfig, cancel=None) -> None:
        """If an earlier running trial (this or another worker's) probes the same config, wait for it, so
        that no config is measured twice; this trial then records a duplicate of its result. Earlier trials
        not yet claimed are waited for briefly (they may be about to claim this config); dead workers' trials
        are swept meanwhile, so the wait always ends."""
        wanted, started, last_sweep = config.to_dict(), time.monotonic(), time.monotonic()
        while cancel is None or not cancel.is_set():
            running = self._retry(
                lambda: self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)),
                "reading the trials",
            )
            unclaimed_wait = time.monotonic() - started < UNCLAIMED_WAIT_SECONDS
            if not any(
                t.number < number
                and (
                    t.user_attrs.get("config") == wanted or ("config" not in t.user_attrs and unclaimed_wait)
                )
                for t in running
            ):
                return
            time.sleep(TWIN_POLL_SECONDS)
            if time.monotonic() - last_sweep > SWEEP_SECONDS:
                self._retry(lambda: recover_stale_trials(self.study), "sweeping dead workers' trials")
                last_sweep = time.monotonic()

    def record_or_keep(self, trial: optuna.Trial, outcome: Outcome) -> FrozenTrial:
        """Record, riding out a storage outage; if it outlasts our patience, keep the measurement in the
        pending file (replayed by the next run) and stop."""
        try:
            return self._retry(lambda: self.record(trial, outcome), f"recording trial #{trial.number}")
        except optuna.exceptions.UpdateFinishedTrialError:
            # A sweep failed it meanwhile (its heartbeat went quiet), or our own tell went through but its
            # answer was lost: keep what was recorded, else bring the measurement back as a new trial.
            frozen = self.study._storage.get_trial(trial._trial_id)
            if frozen.state != TrialState.COMPLETE:
                self.requeue_with_outcome(trial.params, trial.number, outcome)
            return frozen
        except Unavailable as exc:
            kept = keep_pending(self.pending_path, trial, outcome)
            raise Unavailable(f"{exc}; this trial's measurement is kept in {kept}") from None

    def replay_pending(self, path: Path) -> list[int]:
        """Record the measurements kept while the storage was away (see `record_or_keep`); returns their
        trial numbers. A trial still RUNNING takes its saved outcome now; one that another worker has
        failed meanwhile is enqueued with it (recorded by a later step without a probe); one already
        complete is left alone. The file is claimed first (renamed), so two tuners never replay it twice."""
        claimed = path.with_name(f"{path.name}.replaying-{os.getpid()}")
        try:
            path.rename(claimed)
        except FileNotFoundError:
            return []
        storage, replayed = self.study._storage, []
        for line in claimed.read_text().splitlines():
            entry = json.loads(line)
            number, outcome = entry["trial_number"], outcome_from_dict(entry["outcome"])
            trial_id = storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number)
            state = storage.get_trial(trial_id).state
            if state == TrialState.RUNNING:
                self.record(optuna.Trial(self.study, trial_id), outcome)
            elif state != TrialState.COMPLETE:
                self.requeue_with_outcome(entry["params"], number, outcome)
            replayed.append(number)
        claimed.rename(path.with_name(f"{path.name}.replayed"))
        return replayed

    def _retry(self, operation, what: str):
        url = self.storage_url or "the study's storage"
        return retrying(operation, what, url, self.patience, cancel=self.cancel)


def _start_order(trial: FrozenTrial) -> tuple[float, int]:
    """By claim time (epoch seconds, one clock per host, no time zones); unclaimed trials come last."""
    return (float(trial.user_attrs.get("claimed_at", math.inf)), trial.number)


def claim_attrs() -> dict[str, Any]:
    import psutil

    return {
        "host": socket.gethostname(),
        "tuner_pid": os.getpid(),
        "tuner_started": psutil.Process().create_time(),
        "claimed_at": time.time(),
    }


def heartbeat_interval(study: optuna.Study) -> int | None:
    """Seconds between heartbeats; None for storages without them (only database storages have them)."""
    interval_of = getattr(study._storage, "get_heartbeat_interval", None)
    return interval_of() if interval_of else None


def beat_now(study: optuna.Study, trial_id: int) -> None:
    if heartbeat_interval(study):
        study._storage.record_heartbeat(trial_id)


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial_id: int) -> Iterator[None]:
    """Record Optuna heartbeats for a running trial (database storages), so a dead worker is noticed."""
    storage, interval = study._storage, heartbeat_interval(study)
    if not interval:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # an outage: the record path reports it, not this thread
                storage.record_heartbeat(trial_id)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


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
        attrs={**data["attrs"], "recorded_late": True},
    )


def keep_pending(path: Path | None, trial: optuna.Trial, outcome: Outcome) -> str:
    """Append the unrecorded measurement to the pending file; if even that fails, print it to stderr."""
    line = json.dumps(
        {"trial_number": trial.number, "params": trial.params, "outcome": outcome_to_dict(outcome)}
    )
    try:
        if path is None:
            raise OSError("no pending file")
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            handle.write(line + "\n")
        return str(path)
    except OSError:
        import sys

        print(f"unrecorded measurement: {line}", file=sys.stderr)
        return "the line 'unrecorded measurement: ...' above"


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
        status = trial_status(trial)
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
