"""A pick that noise cannot fool: the leaders are measured again before the report, and the pick goes by the
mean.

A probe's samples/sec varies by a few percent from run to run (BENCHMARKS.md, "Search": the tables carry two
measurements of every configuration), while the fastest configurations of a space often lie within a few
percent of each other; the best single measurement is then partly a lucky draw. So, once the trials are
done, the feasible configurations within `NOISE` of the leader (at most `MAX_CONTENDERS`, the leader
included) are probed again, one after the other and round after round (so a slow stretch of the machine
falls on all of them), while the re-probes cost at most `TIME_SHARE` of the time the study's probes took —
but the leader and its closest rival are re-probed once in any case, since a comparison needs both.
Each measurement is kept in the study (`StudyAttr.REMEASURED`, by trial number); `choose` then takes the
re-probed contender with the best mean samples/sec whose every peak stayed within the budget less the
headroom (a contender left with its first probe is not compared: that probe is the lucky draw that made it a
contender); but where another contender within the noise of it keeps more of the trainer's own defaults
(autotune.formats.defaults), that one: a value off the trainer's default needs a measured reason.
`autotune report --confirm` remains the longer check of the one winner.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.config.knobs import ProbeConfig
from autotune.memory.budget import Budget
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.status import Attr, Status, StudyAttr
from autotune.study.trials import finished_trials, measured_ok, trial_config, trial_config_of

__all__ = [
    "MAX_CONTENDERS",
    "NOISE",
    "ROUNDS",
    "TIME_SHARE",
    "Figures",
    "choose",
    "contenders",
    "departures",
    "figures",
    "remeasure",
    "reprobe_record",
    "reprobe_speed",
]

NOISE = 0.06  # samples/sec of two probes of one configuration differ by up to this (BENCHMARKS.md, "Search")
MAX_CONTENDERS = 3
ROUNDS = 2  # re-probes per contender, at most
TIME_SHARE = 0.25  # of the study's probing time, at most


def _ok_originals(study: optuna.Study, budget: Budget) -> list[FrozenTrial]:
    """Measured ok within the limit, not a duplicate: fastest first."""
    trials = [t for t in finished_trials(study) if measured_ok(t) and t.values[1] <= budget.limit]
    return sorted(trials, key=lambda t: (-t.values[0], t.number))


def contenders(study: optuna.Study, budget: Budget) -> list[FrozenTrial]:
    """The leader and the feasible trials within NOISE of it (at most MAX_CONTENDERS); [] when the leader
    has no rival."""
    ranked = _ok_originals(study, budget)
    if not ranked:
        return []
    floor = ranked[0].values[0] * (1 - NOISE)
    close = [t for t in ranked if t.values[0] >= floor][:MAX_CONTENDERS]
    return close if len(close) > 1 else []


def remeasure(
    study: optuna.Study,
    rivals: list[FrozenTrial],
    probe: Callable[..., ProbeResult],
    settings: ProbeSettings | None,
    seconds: float,
    cancel: threading.Event | None = None,
    on_result: Callable[[FrozenTrial, ProbeResult], None] = lambda trial, result: None,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Probe each contender again, round after round, within `seconds` (each re-probe's cost is taken as its
    first probe's wall time), the leader and its closest rival once whatever it costs (a comparison needs
    both); returns how many re-probes ran. `should_stop`: stop before the next re-probe;
    `cancel` set: the running one was killed, and is not kept."""
    kept: dict[str, list[dict[str, Any]]] = dict(study.user_attrs.get(StudyAttr.REMEASURED, {}))
    for trial in rivals:  # every contender is compared by its mean, re-probed or not
        kept.setdefault(str(trial.number), [])
    study.set_user_attr(StudyAttr.REMEASURED, kept)
    spent, count = 0.0, 0
    for round_number in range(ROUNDS):
        for index, trial in enumerate(rivals):
            cost = float((trial.user_attrs.get(Attr.RESULT) or {}).get("wall_seconds") or 0.0)
            leaders = round_number == 0 and index < 2  # the leader and its closest rival: always once
            if (
                (spent + cost > seconds and not leaders)
                or should_stop()
                or (cancel is not None and cancel.is_set())
            ):
                return count
            result = probe(trial_config(trial), settings, cancel=cancel)
            if cancel is not None and cancel.is_set():
                return count
            spent += result.wall_seconds or cost
            count += 1
            kept.setdefault(str(trial.number), []).append(reprobe_record(result))
            study.set_user_attr(StudyAttr.REMEASURED, kept)
            on_result(trial, result)
    return count


def reprobe_record(result: ProbeResult) -> dict[str, Any]:
    """What the study keeps of a re-probe (here and in the back-to-back gain, autotune.report.gain)."""
    return {
        "status": result.status,
        "samples_per_sec": result.samples_per_sec,
        "peak_memory_bytes": result.peak_memory_bytes,
        "wall_seconds": result.wall_seconds,
    }


@dataclass(frozen=True)
class Figures:
    """A trial's samples/sec and peak over its first probe and its re-probes."""

    speeds: list[float]
    peaks: list[int]

    @property
    def mean(self) -> float:
        return statistics.mean(self.speeds)

    @property
    def spread(self) -> float:
        """Highest less lowest samples/sec, as a share of the mean (0 for one measurement)."""
        return (max(self.speeds) - min(self.speeds)) / self.mean if self.mean else 0.0

    @property
    def count(self) -> int:
        return len(self.speeds)


def figures(study: optuna.Study, trial: FrozenTrial) -> Figures:
    """The trial's first measurement and its re-measurements (an OOM or failed re-probe counts 0 samples/sec
    at the budget)."""
    speeds, peaks = [trial.values[0]], [int(trial.values[1])]
    for again in study.user_attrs.get(StudyAttr.REMEASURED, {}).get(str(trial.number), []):
        speeds.append(reprobe_speed(again))
        peaks.append(int(again["peak_memory_bytes"]))
    return Figures(speeds, peaks)


def reprobe_speed(record: dict[str, Any]) -> float:
    """A kept re-probe's samples/sec: 0 when it did not run ok (an OOM or a failure counts against it)."""
    return record["samples_per_sec"] if record["status"] == Status.OK else 0.0


def choose(
    study: optuna.Study, budget: Budget, defaults: Mapping[str, Any] | None = None
) -> FrozenTrial | None:
    """The re-probed contender with the best mean whose every peak stayed within the limit, unless one that
    keeps more of the trainer's `defaults` is within the noise of it; None when no trial was a contender.

    A contender's first probe is the draw that made it a contender: the best of several noisy draws sits
    high, so a contender left with that one figure (the re-probes ran out of time) is not set against
    means that hold a fresh draw. Only when no contender was re-probed (a stop before any) do first
    figures decide. The noise is NOISE or, when larger, the spread these contenders' own probes showed."""
    remeasured = study.user_attrs.get(StudyAttr.REMEASURED, {})
    if not remeasured:
        return None
    trials = {str(t.number): t for t in finished_trials(study)}
    found = {number: figures(study, trials[number]) for number in remeasured if number in trials}
    fit = {number: f for number, f in found.items() if max(f.peaks) <= budget.limit and min(f.speeds) > 0}
    pool = {number: f for number, f in fit.items() if f.count > 1} or fit
    if not pool:
        return None
    fastest = max(f.mean for f in pool.values())
    noise = max(NOISE, *(f.spread for f in pool.values()))
    close = [number for number, f in pool.items() if f.mean >= fastest * (1 - noise)]

    def rank(number: str) -> tuple[int, float, int]:
        return departures(trial_config_of(trials[number]), defaults or {}), -pool[number].mean, int(number)

    return trials[min(close, key=rank)]


def departures(config: ProbeConfig, defaults: Mapping[str, Any]) -> int:
    """How many of the trainer's defaults the configuration leaves."""
    return sum(getattr(config, knob) != value for knob, value in defaults.items())
