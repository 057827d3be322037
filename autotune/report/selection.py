"""Which trial the report recommends: the contender with the best mean when the leaders were re-measured
(autotune.report.pick), else the fastest on Optuna's feasible Pareto front (`pareto_best`).

`study.best_trials` keeps only feasible trials (every constraint <= 0). Among its ok trials within
budget·(1 − headroom), the fastest wins; ties go to less memory, then to the original measurement over a
duplicate. When nothing is feasible, the closest trials (smallest violation) are shown with what to change.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass, field

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.memory.budget import Budget
from autotune.report import pick
from autotune.status import Attr, Status
from autotune.study.plan import study_trainer
from autotune.study.trials import trial_status

__all__ = ["Selection", "best_feasible", "closest_trials", "ok_front", "pareto_best", "recommended", "select"]

CLOSEST = 3


@dataclass
class Selection:
    front: list[FrozenTrial]  # Optuna's feasible Pareto front, fastest first
    chosen: FrozenTrial | None  # the recommended config, None when nothing is feasible
    closest: list[FrozenTrial] = field(default_factory=list)  # only when nothing is feasible


def ok_front(study: optuna.Study) -> list[FrozenTrial]:
    """Optuna's feasible Pareto front, ok trials only: fastest first, ties to less memory, originals first."""
    front = [t for t in study.best_trials if t.user_attrs.get(Attr.STATUS) == Status.OK]
    return sorted(
        front, key=lambda t: (-t.values[0], t.values[1], Attr.DUPLICATE_OF in t.user_attrs, t.number)
    )


def pareto_best(
    front: list[FrozenTrial], budget: Budget, exclude: Set[int] = frozenset()
) -> FrozenTrial | None:
    """The first trial of a sorted front within budget·(1 − headroom), skipping excluded trials and their
    duplicates (a confirmation probe rejected them)."""
    for trial in front:
        if (
            trial.values[1] <= budget.limit
            and trial.number not in exclude
            and trial.user_attrs.get(Attr.DUPLICATE_OF) not in exclude
        ):
            return trial
    return None


def best_feasible(study: optuna.Study, budget: Budget) -> FrozenTrial | None:
    """The trial the report recommends."""
    return recommended(study, ok_front(study), budget)


def recommended(
    study: optuna.Study, front: list[FrozenTrial], budget: Budget, exclude: Set[int] = frozenset()
) -> FrozenTrial | None:
    """The re-measured contender with the best mean, unless a confirmation rejected it; else the fastest
    feasible trial on the front (`pareto_best`)."""
    settled = pick.choose(study, budget, study_trainer(study).defaults())
    if settled is not None and settled.number not in exclude:
        return settled
    return pareto_best(front, budget, exclude)


def select(study: optuna.Study, budget: Budget, exclude: Iterable[int] = ()) -> Selection:
    """The feasible Pareto front and the recommended trial.

    `exclude`: trial numbers a confirmation probe rejected; their duplicates (same config) go with them.
    """
    front = ok_front(study)
    chosen = recommended(study, front, budget, set(exclude))
    closest = [] if chosen else closest_trials(study, budget)
    return Selection(front, chosen, closest)


def closest_trials(study: optuna.Study, budget: Budget, count: int = CLOSEST) -> list[FrozenTrial]:
    """Complete trials with the smallest violation: memory over the limit first, then a failed run."""
    complete = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.values is not None and Attr.DUPLICATE_OF not in t.user_attrs
    ]

    def violation(t: FrozenTrial) -> tuple[float, int, float]:
        return max(0.0, t.values[1] - budget.limit), int(trial_status(t) != Status.OK), -t.values[0]

    return sorted(complete, key=violation)[:count]
