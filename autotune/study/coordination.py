"""Several tuners on one study: claims, the trial quota, twins, dead workers and heartbeats.

- A trial claims its configuration (writes it, with the claimer's host, pid and clock) before it is probed,
  so that others can see what is being measured.
- The quota counts complete and running trials; two workers that asked in the same instant past it are
  ordered by claim time, and the later one stands down as `surplus`.
- A trial whose configuration an earlier running trial is probing waits for it (then records a duplicate).
- A dead tuner's running trial is failed and re-queued once: at once on the same host (its pid is gone),
  through Optuna's heartbeats on a database storage (any host), or, never claimed, after a grace period.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config.knobs import ProbeConfig, job_of, same_job
from autotune.status import Attr, Status
from autotune.study.optuna_private import (
    heartbeat_interval,
    record_heartbeat,
    storage_of,
    trial_id,
    trial_id_of,
)
from autotune.study.storage import GRACE_SECONDS

__all__ = [
    "SWEEP_SECONDS",
    "Claims",
    "beat_now",
    "claim_attrs",
    "fail_trial",
    "heartbeat",
    "heartbeat_interval",
    "recover_stale_trials",
    "retry_once",
    "retry_stale_trial",
]

TWIN_POLL_SECONDS = 1.0
UNCLAIMED_WAIT_SECONDS = 30.0  # an earlier trial still sampling its config claims it within this
SWEEP_SECONDS = 30.0  # while waiting on other workers' trials, look for dead ones this often


# --- claims and the quota ----------------------------------------------------------------------------------


def claim_attrs() -> dict[str, Any]:
    """Set one by one, in this order: another worker that reads the trial between two of them must not see a
    host without the pid that says whether its tuner lives (`recover_stale_trials`)."""
    import psutil

    return {
        Attr.TUNER_PID: os.getpid(),
        Attr.TUNER_STARTED: psutil.Process().create_time(),
        Attr.CLAIMED_AT: time.time(),
        Attr.HOST: socket.gethostname(),
    }


def _start_order(trial: FrozenTrial) -> tuple[float, int]:
    """By claim time (epoch seconds, one clock per host, no time zones); unclaimed trials come last."""
    return (float(trial.user_attrs.get(Attr.CLAIMED_AT, math.inf)), trial.number)


@dataclass
class Claims:
    """Asks for trials and claims their configurations; one thread at a time (the caller holds a lock)."""

    study: optuna.Study
    sample: Callable[[optuna.Trial], ProbeConfig]  # the trial's configuration (enqueued params give it back)
    abandoned: set[int] = field(default_factory=set)  # asked but not yet claimed: failed if left so

    def ask_and_claim(self, quota: int | None) -> tuple[optuna.Trial, ProbeConfig] | None:
        """A new trial with its claimed config; None when `quota` trials are complete or running."""
        self.fail_abandoned()
        if quota is not None and len(self.live_trials()) >= quota:
            return None
        trial = self.study.ask()
        self.abandoned.add(trial.number)  # until claimed: a storage error below leaves it to be failed
        beat_now(self.study, trial_id(trial))  # a heartbeat row from the start, so Optuna's sweep sees it
        for key, value in claim_attrs().items():
            trial.set_user_attr(key, value)
        config = self.sample(trial)
        trial.set_user_attr(Attr.CONFIG, config.to_dict())  # other workers see what is being probed
        surplus = quota is not None and self.is_surplus(trial.number, quota)
        if surplus:
            trial.set_user_attr(Attr.STATUS, Status.SURPLUS)
            self.study.tell(trial, state=TrialState.FAIL)
        self.abandoned.discard(trial.number)
        return None if surplus else (trial, config)

    def fail_abandoned(self) -> None:
        for number in sorted(self.abandoned):
            fail_trial(self.study, trial_id_of(self.study, number), Status.ABANDONED)
            self.abandoned.discard(number)

    def live_trials(self) -> list[FrozenTrial]:
        """Complete trials and running ones (any worker's), which count towards the trial quota."""
        states = (TrialState.COMPLETE, TrialState.RUNNING)
        trials = self.study.get_trials(deepcopy=False, states=states)
        return [t for t in trials if t.number not in self.abandoned]

    def is_surplus(self, number: int, quota: int) -> bool:
        """Two workers may both see quota-1 live trials and both ask: the later-started one stands down."""
        numbers = [t.number for t in sorted(self.live_trials(), key=_start_order)]
        return number in numbers and numbers.index(number) >= quota


def wait_for_twin(
    study: optuna.Study,
    number: int,
    config: ProbeConfig,
    retry: Callable[[Callable[[], Any], str], Any],
    cancel: threading.Event | None = None,
) -> None:
    """If an earlier running trial (this or another worker's) probes the same config, wait for it, so that
    no config is measured twice; the caller then records a duplicate of its result. Earlier trials not yet
    claimed are waited for briefly (they may be about to claim this config); dead workers' trials are swept
    meanwhile, so the wait always ends. `retry` runs each storage read through the outage policy."""
    wanted, started, last_sweep = job_of(config.to_dict()), time.monotonic(), time.monotonic()
    while cancel is None or not cancel.is_set():
        running = retry(
            lambda: study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)), "reading the trials"
        )
        unclaimed_wait = time.monotonic() - started < UNCLAIMED_WAIT_SECONDS
        if not any(
            t.number < number
            and (
                same_job(t.user_attrs.get(Attr.CONFIG), wanted)
                or (Attr.CONFIG not in t.user_attrs and unclaimed_wait)
            )
            for t in running
        ):
            return
        time.sleep(TWIN_POLL_SECONDS)
        if time.monotonic() - last_sweep > SWEEP_SECONDS:
            retry(lambda: recover_stale_trials(study), "sweeping dead workers' trials")
            last_sweep = time.monotonic()


# --- dead workers ------------------------------------------------------------------------------------------


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
    pid = int(attrs.get(Attr.TUNER_PID, 0))
    if pid <= 0:
        return False
    started = _process_started(pid)
    if started is None:
        return False
    claimed_start = attrs.get(Attr.TUNER_STARTED)
    return started < 0 or claimed_start is None or abs(started - float(claimed_start)) < 2.0


def _requeue_once(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue a dead tuner's trial once more, unless it was itself a retry (a config that kills the tuner
    twice is recorded as failed, not re-run forever). A tuner that died between `ask` and sampling left no
    params: an enqueued trial (a hand-made config) is queued again from its fixed params; a sampler's trial
    had chosen nothing yet, so nothing is lost."""
    params = trial.params or trial.system_attrs.get("fixed_params") or {}
    if Attr.RETRY_OF not in trial.user_attrs and params:
        retry_once(study, params, trial.number, trial.user_attrs)


def retry_once(study: optuna.Study, params: dict[str, Any], number: int, attrs: dict[str, Any]) -> None:
    """Queue an interrupted trial's configuration again, with its hand-made label if it had one (the report's
    gain over the hand-made config needs the label); a retry is not retried again."""
    label = {Attr.SEED_CONFIG: attrs[Attr.SEED_CONFIG]} if attrs.get(Attr.SEED_CONFIG) else {}
    study.enqueue_trial(params, user_attrs={Attr.RETRY_OF: number, **label})


def retry_stale_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    """Optuna's heartbeat callback: it has already failed `trial`, whose heartbeat went quiet (a finished
    trial takes no new attributes, so its status reads as interrupted through `trial_status`)."""
    _requeue_once(study, trial)


def _orphaned(trial: FrozenTrial, now: float, grace: float) -> bool:
    """Asked but never claimed (its tuner died, or the storage failed, before the config was set) long ago."""
    started = trial.datetime_start.timestamp() if trial.datetime_start else now
    return Attr.CONFIG not in trial.user_attrs and now - started > grace


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
        # Half-claimed (no pid yet) is not dead: its tuner is setting the claim; the grace period covers it.
        claimed_here = attrs.get(Attr.HOST) == host and Attr.TUNER_PID in attrs
        dead_here = claimed_here and not _tuner_alive(attrs)
        if (dead_here or _orphaned(trial, now, grace_seconds)) and fail_trial(
            study, trial_id(trial), Status.INTERRUPTED
        ):
            _requeue_once(study, trial)
            recovered.append(trial.number)
    with warnings.catch_warnings():  # "experimental" since Optuna 2.9, and the way heartbeats are swept
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # calls retry_stale_trial for each trial it fails
    were_running = {t.number for t in running}
    recovered += [
        t.number
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        if t.number in were_running and Attr.STATUS not in t.user_attrs
    ]
    return sorted(recovered)


def fail_trial(study: optuna.Study, trial_id: int, status: str) -> bool:
    """Mark a running trial FAIL with `status`; False when another worker finished it first."""
    try:
        storage_of(study).set_trial_user_attr(trial_id, Attr.STATUS, status)
        storage_of(study).set_trial_state_values(trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    return True


# --- heartbeats --------------------------------------------------------------------------------------------


def beat_now(study: optuna.Study, trial_id: int) -> None:
    if heartbeat_interval(study):
        record_heartbeat(study, trial_id)


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial_id: int) -> Iterator[None]:
    """Record Optuna heartbeats for a running trial (database storages), so a dead worker is noticed."""
    interval = heartbeat_interval(study)
    if not interval:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # an outage: the record path reports it, not this thread
                record_heartbeat(study, trial_id)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
