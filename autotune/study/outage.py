"""Riding out a storage outage without losing a measurement.

Every storage call on the trial path retries with doubling waits for a while (`autotune.study.storage`).
When recording a measurement outlasts that patience, the measurement goes to `<out>/<study>/pending.jsonl`,
one JSON line appended whole or not at all. If even that file cannot take it (a full disk), the line is
printed to stderr after `PENDING_PREFIX` (append it to pending.jsonl to keep it) and kept in memory, and
writing it is tried again while the tuner lives. The next run of the same command records every pending line
without probing again: into its own trial while that is still running, or as a new trial when another worker
failed it meanwhile (or the study was replaced). A damaged line never stops a run: the valid lines are
replayed, the rest kept aside in `pending.jsonl.damaged-<time>` with a message.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import Unavailable
from autotune.status import Attr
from autotune.study.optuna_private import storage_of, trial_id, trial_id_of
from autotune.study.outcome import Outcome, outcome_from_dict, outcome_to_dict

__all__ = [
    "PENDING_FILE",
    "PENDING_PREFIX",
    "PendingFile",
    "Replay",
    "append_line",
    "record_or_keep",
    "replay_pending",
    "requeue_with_outcome",
]

PENDING_FILE = "pending.jsonl"  # in <out>/<study>/
PENDING_PREFIX = "autotune unrecorded measurement: "  # then the pending.jsonl line, on stderr

Record = Callable[[optuna.Trial, Outcome], FrozenTrial]


def record_or_keep(
    study: optuna.Study,
    trial: optuna.Trial,
    outcome: Outcome,
    record: Record,
    retry: Callable[[Callable[[], Any], str], Any],
    pending: PendingFile,
) -> FrozenTrial:
    """Record, riding out a storage outage through `retry`; if it outlasts the patience, keep the
    measurement in the pending file (replayed by the next run) and stop with Unavailable."""
    try:
        return retry(lambda: record(trial, outcome), f"recording trial #{trial.number}")
    except optuna.exceptions.UpdateFinishedTrialError:
        # A sweep failed it meanwhile (its heartbeat went quiet), or our own tell went through but its
        # answer was lost: keep what was recorded, else bring the measurement back as a new trial.
        frozen = storage_of(study).get_trial(trial_id(trial))
        if frozen.state != TrialState.COMPLETE:
            requeue_with_outcome(study, trial.params, trial.number, outcome)
        return frozen
    except Unavailable as exc:
        kept = pending.keep(trial.number, trial.params, outcome)
        raise Unavailable(f"{exc}; this trial's measurement is kept in {kept}") from None


def requeue_with_outcome(study: optuna.Study, params: dict[str, Any], number: int, outcome: Outcome) -> None:
    """A measurement whose trial another worker failed meanwhile (or that a replaced study never had): back
    into the study as a new trial, recorded by a later step without a probe."""
    saved = outcome_to_dict(outcome)  # a new dict: replacing its attrs leaves the outcome's alone
    saved["attrs"] = {k: v for k, v in saved["attrs"].items() if k != Attr.RECORDED_LATE}
    study.enqueue_trial(
        params, user_attrs={Attr.SAVED_OUTCOME: saved, Attr.REPLAY_OF: number}, skip_if_exists=False
    )


def append_line(path: Path, line: str) -> None:
    """Append one line whole or not at all: a write that fails (a full disk) is truncated away."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as handle:
        start = os.fstat(handle.fileno()).st_size
        try:
            handle.write(line.encode("utf-8") + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        except OSError:
            handle.truncate(start)
            raise


@dataclass
class PendingFile:
    """Where a measurement goes when the storage cannot take it; lines no file could take wait in memory."""

    path: Path | None
    unwritten: list[str] = field(default_factory=list)

    def keep(self, number: int, params: dict[str, Any], outcome: Outcome) -> str:
        """Keep one measurement; returns where it is (the file, or stderr until the file takes it)."""
        line = json.dumps({"trial_number": number, "params": params, "outcome": outcome_to_dict(outcome)})
        self.unwritten.append(line)
        if self.flush():
            return str(self.path)
        print(f"{PENDING_PREFIX}{line}", file=sys.stderr)
        return (
            f"memory, retried while this run lives, and the '{PENDING_PREFIX.strip()}' line above: append "
            f"the JSON after it to {self.path or PENDING_FILE} to keep it for good"
        )

    def flush(self) -> bool:
        """Write every waiting line; True when none is left waiting."""
        while self.unwritten and self.path is not None:
            try:
                append_line(self.path, self.unwritten[0])
            except OSError:
                return False
            self.unwritten.pop(0)
        return not self.unwritten


@dataclass
class Replay:
    trials: list[int]  # the trial numbers whose measurements were recorded (or re-queued with them)
    damaged: Path | None = None  # where the lines that could not be read were put aside
    damaged_lines: int = 0


def replay_pending(study: optuna.Study, path: Path, record: Record) -> Replay:
    """Record the measurements kept while the storage was away.

    A trial still RUNNING takes its saved outcome now; one that another worker has failed meanwhile, or that
    the study does not have (it was replaced), is enqueued with it (recorded by a later step without a
    probe); one already complete is left alone. The file is claimed first (renamed), so two tuners never
    replay it twice. Lines that cannot be read are kept aside, never replayed, never fatal.
    """
    claimed = path.with_name(f"{path.name}.replaying-{os.getpid()}")
    try:
        path.rename(claimed)
    except FileNotFoundError:
        return Replay([])
    replayed, damaged = [], []
    for line in claimed.read_bytes().decode("utf-8", errors="replace").splitlines():
        entry = _entry(line)
        if entry is None:
            if line.strip():
                damaged.append(line)
            continue
        number, params, outcome = entry
        _replay_one(study, number, params, outcome, record)
        replayed.append(number)
    kept = None
    if damaged:
        kept = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        kept.write_text("".join(line + "\n" for line in damaged), encoding="utf-8")
    claimed.rename(path.with_name(f"{path.name}.replayed"))
    return Replay(replayed, kept, len(damaged))


def _entry(line: str) -> tuple[int, dict[str, Any], Outcome] | None:
    """A pending line's trial number, params and outcome; None when it cannot be read as one."""
    try:
        entry = json.loads(line)
        return int(entry["trial_number"]), dict(entry["params"]), outcome_from_dict(entry["outcome"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _replay_one(
    study: optuna.Study, number: int, params: dict[str, Any], outcome: Outcome, record: Record
) -> None:
    storage = storage_of(study)
    try:
        stored_id = trial_id_of(study, number)
    except KeyError:  # the study was replaced (its file deleted): the measurement becomes a new trial
        requeue_with_outcome(study, params, number, outcome)
        return
    state = storage.get_trial(stored_id).state
    if state == TrialState.RUNNING:
        record(optuna.Trial(study, stored_id), outcome)
    elif state != TrialState.COMPLETE:
        requeue_with_outcome(study, params, number, outcome)
