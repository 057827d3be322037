"""The one place autotune uses Optuna's private storage API, and why.

    record_heartbeat(study, trial_id(trial))     # a heartbeat at a moment of our choosing
    fail_by_number(...)                          # uses trial_id_of(study, number)

A study shared by several tuners needs what Optuna 4 has no public call for: a trial's id (to write to it
after its `Trial` object is gone: fail an abandoned or orphaned trial, read a finished one back), the id of a
trial number, a trial system attribute (optuna-dashboard's constraints list), and a heartbeat recorded now
rather than by `study.optimize`, which autotune does not use. Optuna's own `RetryFailedTrialCallback` and
`fail_stale_trials` use the same private attributes. Everything else goes through the public API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

__all__ = ["heartbeat_interval", "record_heartbeat", "storage_of", "trial_id", "trial_id_of"]


class _HeartbeatStorage(Protocol):
    """A storage that keeps heartbeats (Optuna's private BaseHeartbeat: the storages with an interval)."""

    def record_heartbeat(self, trial_id: int) -> None: ...


def storage_of(study: optuna.Study) -> BaseStorage:
    """The study's storage, for writes by trial id."""
    return study._storage


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The trial's id in its storage (its number counts within the study only)."""
    return trial._trial_id


def trial_id_of(study: optuna.Study, number: int) -> int:
    """The id of the study's trial `number`; KeyError when the storage has none (the study was replaced)."""
    return study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)


def heartbeat_interval(study: optuna.Study) -> int | None:
    """Seconds between heartbeats; None for storages without them (only database storages have them)."""
    interval_of: Any = getattr(study._storage, "get_heartbeat_interval", None)
    return interval_of() if interval_of else None


def record_heartbeat(study: optuna.Study, trial_id: int) -> None:
    """One heartbeat for the trial, now (a storage with an interval keeps them)."""
    cast(_HeartbeatStorage, study._storage).record_heartbeat(trial_id)
