"""Riding out a storage outage without losing a measurement.

Every storage call on the trial path retries with doubling waits for a while (`autotune.search.storage`).
When recording a measurement outlasts that patience, the measurement goes to `<out>/<study>/pending.jsonl`
(or, if even that cannot be written, to stderr as one line), and the next run of the same command records it
without probing again: into its own trial while that is still running, or as a new trial when another worker
failed it meanwhile.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import Unavailable
from autotune.search.outcome import Outcome, outcome_from_dict, outcome_to_dict
from autotune.status import Attr

__all__ = ["PENDING_FILE", "keep_pending", "record_or_keep", "replay_pending", "requeue_with_outcome"]

PENDING_FILE = "pending.jsonl"  # in <out>/<study>/

Record = Callable[[optuna.Trial, Outcome], FrozenTrial]


def record_or_keep(
    study: optuna.Study,
    trial: optuna.Trial,
    outcome: Outcome,
    record: Record,
    retry: Callable[[Callable[[], Any], str], Any],
    pending_path: Path | None,
) -> FrozenTrial:
    """Record, riding out a storage outage through `retry`; if it outlasts the patience, keep the
    measurement in the pending file (replayed by the next run) and stop with Unavailable."""
    try:
        return retry(lambda: record(trial, outcome), f"recording trial #{trial.number}")
    except optuna.exceptions.UpdateFinishedTrialError:
        # A sweep failed it meanwhile (its heartbeat went quiet), or our own tell went through but its
        # answer was lost: keep what was recorded, else bring the measurement back as a new trial.
        frozen = study._storage.get_trial(trial._trial_id)
        if frozen.state != TrialState.COMPLETE:
            requeue_with_outcome(study, trial.params, trial.number, outcome)
        return frozen
    except Unavailable as exc:
        kept = keep_pending(pending_path, trial, outcome)
        raise Unavailable(f"{exc}; this trial's measurement is kept in {kept}") from None


def requeue_with_outcome(study: optuna.Study, params: dict[str, Any], number: int, outcome: Outcome) -> None:
    """A measurement whose trial another worker failed meanwhile: back into the study as a new trial,
    recorded by a later step without a probe."""
    saved = outcome_to_dict(outcome)  # a new dict: replacing its attrs leaves the outcome's alone
    saved["attrs"] = {k: v for k, v in saved["attrs"].items() if k != Attr.RECORDED_LATE}
    study.enqueue_trial(
        params, user_attrs={Attr.SAVED_OUTCOME: saved, Attr.REPLAY_OF: number}, skip_if_exists=False
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
        print(f"unrecorded measurement: {line}", file=sys.stderr)
        return "the line 'unrecorded measurement: ...' above"


def replay_pending(study: optuna.Study, path: Path, record: Record) -> list[int]:
    """Record the measurements kept while the storage was away; returns their trial numbers.

    A trial still RUNNING takes its saved outcome now; one that another worker has failed meanwhile is
    enqueued with it (recorded by a later step without a probe); one already complete is left alone. The file
    is claimed first (renamed), so two tuners never replay it twice.
    """
    claimed = path.with_name(f"{path.name}.replaying-{os.getpid()}")
    try:
        path.rename(claimed)
    except FileNotFoundError:
        return []
    storage, replayed = study._storage, []
    for line in claimed.read_text().splitlines():
        entry = json.loads(line)
        number, outcome = entry["trial_number"], outcome_from_dict(entry["outcome"])
        trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
        state = storage.get_trial(trial_id).state
        if state == TrialState.RUNNING:
            record(optuna.Trial(study, trial_id), outcome)
        elif state != TrialState.COMPLETE:
            requeue_with_outcome(study, entry["params"], number, outcome)
        replayed.append(number)
    claimed.rename(path.with_name(f"{path.name}.replayed"))
    return replayed
