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

import dataclasses
import datetime as dt
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.config.knobs import ProbeConfig
from autotune.probe.conditions import worst_disturbance
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.report import pick
from autotune.status import Attr, StudyAttr
from autotune.study.plan import study_trainer
from autotune.study.trials import config_key, measured_ok, trial_config, trial_config_of
from autotune.trainers.base import Trainer

__all__ = [
    "ROUNDS",
    "Comparison",
    "Headline",
    "Side",
    "Spread",
    "compare",
    "comparison_for",
    "hand_made_rivals",
    "headline",
    "sides",
    "spread",
    "trainer_side_key",
    "with_trainer_knobs",
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


def trainer_side_key(seed: int) -> str:
    """The measurements' key of a hand-made config run with the pick's trainer knobs (see `sides`); stored
    as `<seed>:verl` whatever the trainer, as studies have always stored it."""
    return f"{seed}:verl"


@dataclass(frozen=True)
class Side:
    """One configuration of a comparison: its key in the measurements, what it runs, and how lines name it."""

    key: str
    config: ProbeConfig
    label: str


def with_trainer_knobs(hand_made: ProbeConfig, winner: ProbeConfig, unread: tuple[str, ...]) -> ProbeConfig:
    """The recommended configuration with the hand-made one's values of the knobs the trainer does not read
    (`unread`; verl's: the rollout batch): in the trainer, the same job as the recommended one; in the
    probe, the hand-made config with only the trainer's knobs changed to the pick's."""
    return dataclasses.replace(winner, **{name: getattr(hand_made, name) for name in unread})


def sides(winner: FrozenTrial, rivals: list[FrozenTrial], trainer: Trainer) -> list[Side]:
    """What one round probes, in turn: each hand-made config, then (when it differs from the pick in a knob
    the trainer does not read) the same with only the trainer's knobs set to the pick's, then the pick. The
    second makes the gain the trainer would see: hand-made -> second is what its knobs give, second -> pick
    what only the probe's own knobs give."""
    unread = trainer.unread_knobs()
    pick_config = trial_config_of(winner)
    order = []
    for trial in rivals:
        label = trial.user_attrs.get(Attr.SEED_CONFIG)
        config = trial_config_of(trial)
        order.append(Side(str(trial.number), config, f"#{trial.number} (hand-made '{label}')"))
        mixed = with_trainer_knobs(config, pick_config, unread)
        if config_key(mixed) != config_key(pick_config):
            mixed_label = f"#{trial.number} with #{winner.number}'s {trainer.label} knobs"
            order.append(Side(trainer_side_key(trial.number), mixed, mixed_label))
    return [*order, Side(str(winner.number), pick_config, f"#{winner.number} (recommended)")]


@dataclass(frozen=True)
class Spread:
    """A ratio of two configurations' mean samples/sec, and the lowest and highest ratio of any pair of their
    measurements: the ratio is beyond the probes' noise when even the lowest exceeds 1."""

    ratio: float
    low: float
    high: float

    @property
    def beyond_noise(self) -> bool:
        return self.low > 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ratio": round(self.ratio, 4),
            "low": round(self.low, 4),
            "high": round(self.high, 4),
            "beyond_noise": self.beyond_noise,
        }


def spread(faster: list[float], slower: list[float]) -> Spread | None:
    """mean(faster) / mean(slower), with the range of the pairwise ratios; None when either side failed."""
    if not faster or not slower or min(faster) <= 0 or min(slower) <= 0:
        return None
    pairs = [a / b for a in faster for b in slower]
    return Spread(statistics.mean(faster) / statistics.mean(slower), min(pairs), max(pairs))


@dataclass(frozen=True)
class Comparison:
    """One back-to-back comparison as stored: every measurement by side (a trial number, or `<seed>:verl`
    for a hand-made config with the pick's verl knobs), in the order taken."""

    winner: int
    iterations: int
    confirmed: bool  # made by `report --confirm` (longer probes)
    measurements: dict[str, list[dict[str, Any]]]
    taken: str

    def speeds(self, key: int | str) -> list[float]:
        return [pick.reprobe_speed(m) for m in self.measurements.get(str(key), [])]

    def peaks(self, number: int | str) -> list[int]:
        return [int(m["peak_memory_bytes"]) for m in self.measurements[str(number)]]

    def ratio(self, seed: int) -> float | None:
        """Mean samples/sec of the winner over the hand-made config's, None when either failed once."""
        found = self.total(seed)
        return None if found is None else found.ratio

    def total(self, seed: int) -> Spread | None:
        """The recommended config over the hand-made one, as the probe measured them."""
        return spread(self.speeds(self.winner), self.speeds(seed))

    def verl(self, seed: int) -> Spread | None:
        """What verl's knobs give: the hand-made config with the pick's verl knobs (the pick itself when they
        share every other knob) over the hand-made one."""
        key = trainer_side_key(seed)
        faster = self.speeds(key) if key in self.measurements else self.speeds(self.winner)
        return spread(faster, self.speeds(seed))

    def probe_only(self, seed: int) -> Spread | None:
        """What the knobs verl does not read give on top (None when the two share them)."""
        key = trainer_side_key(seed)
        return spread(self.speeds(self.winner), self.speeds(key)) if key in self.measurements else None

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
    on_result: Callable[[str, ProbeResult], None] = lambda label, result: None,
    should_stop: Callable[[], bool] = lambda: False,
) -> Comparison | None:
    """Probe each side (`sides`) in turn, `rounds` times; store and return the comparison, or None when it
    was stopped before each side had one measurement (nothing half-made is kept)."""
    order = sides(winner, rivals, study_trainer(study))
    taken: dict[str, list[dict[str, Any]]] = {side.key: [] for side in order}
    for _ in range(rounds):
        for side in order:
            if should_stop() or (cancel is not None and cancel.is_set()):
                return _keep(study, winner, settings, confirmed, taken)
            result = probe(side.config, settings, cancel=cancel)
            if cancel is not None and cancel.is_set():
                return _keep(study, winner, settings, confirmed, taken)
            taken[side.key].append(_measurement(result))
            on_result(side.label, result)
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
