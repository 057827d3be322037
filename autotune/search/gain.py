"""The headline gain, measured so that a shared machine cannot fake it: the recommended configuration and each
hand-made one probed back to back, alternating (hand-made, recommended, hand-made, recommended, ...), in the
same conditions, at the end of a run (resumed or not) and by `autotune report --confirm` (with its longer
probes).

A study's first measurements can be minutes or days apart: a hand-made config probed while the machine was
loaded and a winner probed on an idle one made a "13x" gain out of a 3x one. The comparison is kept in the
study (`StudyAttr.BACK_TO_BACK`, by recommended trial) with every measurement and its conditions; the report's
gain and headline figures come from it (`headline`, `gain_ratio`).
"""

from __future__ import annotations

import datetime as dt
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.probe.conditions import worst_disturbance
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.search import pick
from autotune.search.study import config_key, measured_ok, trial_config
from autotune.status import Attr, StudyAttr

__all__ = [
    "ROUNDS",
    "Comparison",
    "Headline",
    "compare",
    "comparison_for",
    "hand_made_rivals",
    "headline",
]

ROUNDS = 2  # each side probed twice: one slow stretch of the machine cannot fall on one side only


def hand_made_rivals(trials: list[FrozenTrial], winner: FrozenTrial) -> list[FrozenTrial]:
    """The hand-made configs that measured ok, once per configuration, other than the winner's own."""
    winner_config = trial_config(winner)
    found: dict[str, FrozenTrial] = {}
    for trial in trials:
        config = trial_config(trial)
        if not trial.user_attrs.get(Attr.SEED_CONFIG) or not measured_ok(trial) or config is None:
            continue
        if winner_config is not None and config_key(config) == config_key(winner_config):
            continue
        found.setdefault(config_key(config), trial)
    return list(found.values())


@dataclass(frozen=True)
class Comparison:
    """One back-to-back comparison as stored: every measurement by trial number, in the order taken."""

    winner: int
    iterations: int
    confirmed: bool  # made by `report --confirm` (longer probes)
    measurements: dict[str, list[dict[str, Any]]]
    taken: str

    def speeds(self, number: int) -> list[float]:
        return [pick.reprobe_speed(m) for m in self.measurements[str(number)]]

    def peaks(self, number: int) -> list[int]:
        return [int(m["peak_memory_bytes"]) for m in self.measurements[str(number)]]

    def ratio(self, seed: int) -> float | None:
        """Mean samples/sec of the winner over the hand-made config's, None when either failed once."""
        mine, theirs = self.speeds(self.winner), self.speeds(seed) if str(seed) in self.measurements else []
        if not mine or not theirs or min(mine) <= 0 or min(theirs) <= 0:
            return None
        return statistics.mean(mine) / statistics.mean(theirs)

    def disturbed(self) -> list[str]:
        """The most other work took during the comparison's probes; [] when it never mattered."""
        text = worst_disturbance(
            [m.get("environment") or {} for ms in self.measurements.values() for m in ms]
        )
        return [text] if text else []

    def to_dict(self) -> dict[str, Any]:
        return {
            "winner": self.winner,
            "iterations": self.iterations,
            "confirmed": self.confirmed,
            "measurements": self.measurements,
            "taken": self.taken,
        }


def comparison_for(study: optuna.Study, winner: int) -> Comparison | None:
    """The comparison the headline should rest on: a confirmation's, else the run's last."""
    stored = study.user_attrs.get(StudyAttr.BACK_TO_BACK, {})
    found = [stored[key] for key in (f"{winner}:confirmed", str(winner)) if key in stored]
    return Comparison(**found[0]) if found else None


def compare(
    study: optuna.Study,
    winner: FrozenTrial,
    rivals: list[FrozenTrial],
    probe: Callable[..., ProbeResult],
    settings: ProbeSettings,
    *,
    confirmed: bool = False,
    rounds: int = ROUNDS,
    cancel: threading.Event | None = None,
    on_result: Callable[[FrozenTrial, ProbeResult], None] = lambda trial, result: None,
    should_stop: Callable[[], bool] = lambda: False,
) -> Comparison | None:
    """Probe each rival and the winner in turn, `rounds` times; store and return the comparison, or None
    when it was stopped before each side had one measurement (nothing half-made is kept)."""
    order = [*rivals, winner] if rivals else [winner]
    taken: dict[str, list[dict[str, Any]]] = {str(t.number): [] for t in order}
    for _ in range(rounds):
        for trial in order:
            if should_stop() or (cancel is not None and cancel.is_set()):
                return _keep(study, winner, settings, confirmed, taken)
            result = probe(trial_config(trial), settings, cancel=cancel)
            if cancel is not None and cancel.is_set():
                return _keep(study, winner, settings, confirmed, taken)
            taken[str(trial.number)].append(_measurement(result))
            on_result(trial, result)
    return _keep(study, winner, settings, confirmed, taken)


def _measurement(result: ProbeResult) -> dict[str, Any]:
    """The pick's re-probe record, with the conditions the comparison reports."""
    return {**pick.reprobe_record(result), "environment": {"load": result.environment.get("load") or {}}}


def _keep(
    study: optuna.Study,
    winner: FrozenTrial,
    settings: ProbeSettings,
    confirmed: bool,
    taken: dict[str, list[dict[str, Any]]],
) -> Comparison | None:
    if any(not measurements for measurements in taken.values()):
        return None
    comparison = Comparison(
        winner=winner.number,
        iterations=settings.iterations,
        confirmed=confirmed,
        measurements=taken,
        taken=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )
    stored = dict(study.user_attrs.get(StudyAttr.BACK_TO_BACK, {}))
    stored[f"{winner.number}:confirmed" if confirmed else str(winner.number)] = comparison.to_dict()
    study.set_user_attr(StudyAttr.BACK_TO_BACK, stored)
    return comparison


@dataclass(frozen=True)
class Headline:
    """The recommended configuration's figures as every file states them, and what they rest on."""

    samples_per_sec: float
    peak_bytes: int
    measurements: int
    basis: str  # in words: "6-iteration confirmation, 2 probes", "mean of 3 probes", "one probe"
    comparison: Comparison | None


def headline(study: optuna.Study, winner: FrozenTrial) -> Headline:
    """A confirmation's figures when there is one (they replace the others); else the mean of every ok
    measurement of the configuration at the study's iterations: its probe, the re-probes before the pick,
    and the back-to-back comparison; the peak is the highest of them."""
    comparison = comparison_for(study, winner.number)
    if comparison is not None and comparison.confirmed:
        speeds, peaks = comparison.speeds(winner.number), comparison.peaks(winner.number)
        basis = f"confirmed: {comparison.iterations}-iteration probes, {len(speeds)} of them"
        return Headline(statistics.mean(speeds), max(peaks), len(speeds), basis, comparison)
    found = pick.figures(study, winner)
    speeds, peaks = list(found.speeds), list(found.peaks)
    if comparison is not None:
        speeds += comparison.speeds(winner.number)
        peaks += comparison.peaks(winner.number)
    basis = f"mean of {len(speeds)} probes" if len(speeds) > 1 else "one probe"
    return Headline(statistics.mean(speeds), max(peaks), len(speeds), basis, comparison)
