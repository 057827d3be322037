"""Everything the report's renderers need, computed once from a study: `build_report`.

The recommendation is the study's trainer's export (`Trainer.export`): best_config.yaml in the seed's schema
with a `measured:` block holding the chosen trial's figures exactly as the study recorded them, and the
trainer's own file (verl_overrides.txt, trl_config.yaml).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from autotune.formats.rollout import recorded_resident_bytes
from autotune.formats.seed_yaml import seed_yaml
from autotune.memory.advice import remedies
from autotune.memory.budget import Budget
from autotune.probe.conditions import disturbance, worst_disturbance
from autotune.report import gain, pick
from autotune.report.selection import Selection, select
from autotune.status import LAUNCHED, Attr, Status, StudyAttr
from autotune.study.plan import StudyPlan
from autotune.study.trials import (
    memory_model_error,
    trial_config,
    trial_config_of,
    trial_environment,
    trial_status,
)
from autotune.trainers.export import Export, ExportJob
from autotune.units import GIB, gib

__all__ = [
    "Gain",
    "NearMiss",
    "ReportData",
    "advice",
    "best_config_yaml",
    "build_report",
    "config_yaml",
    "export_job",
    "measured_block",
]

INT_COLUMNS = ("calibration_points", "duplicate_of", "dominates_oom_trial", "log_prob_micro_batch_size")


@dataclass
class Gain:
    name: str  # the hand-made config's name
    trial: FrozenTrial
    ratio: float | None  # chosen samples/sec over the seed's as probed (None when the seed did not run ok)
    back_to_back: bool = False  # from the comparison probed in turn (report.gain), not first measurements
    seed_speed: float | None = None  # the hand-made config's samples/sec the ratio rests on
    conditions: list[str] = field(default_factory=list)  # what other work took during those probes
    # back to back only: what verl's knobs give (the headline), with the pairwise range of its measurements,
    # and what the knobs verl does not read give on top (None when the pick shares them)
    verl: gain.Spread | None = None
    probe_only: gain.Spread | None = None

    @property
    def headline(self) -> float | None:
        """The gain a verl job gets: verl's knobs only when measured so, else the ratio as probed."""
        return self.verl.ratio if self.verl is not None else self.ratio


@dataclass
class NearMiss:
    trial: FrozenTrial
    why: str  # why it was not recommended


@dataclass
class ReportData:
    """Everything the renderers need, computed once."""

    study_name: str
    plan: StudyPlan  # model, reward model, GPUs (those the winner was measured on), space
    budget: Budget
    selection: Selection
    trials: list[FrozenTrial]  # every trial of the study, any state
    frame: pd.DataFrame
    gains: list[Gain]
    cost: dict[str, Any]
    model_error: tuple[float | None, int]
    export: Export | None  # the study's trainer's files for the chosen config (None: nothing chosen)
    created: str
    advice: dict[int, list[str]] = field(default_factory=dict)  # closest trial number -> what to change
    remeasured: list[tuple[FrozenTrial, pick.Figures]] = field(default_factory=list)  # before the pick
    headline: gain.Headline | None = None  # the recommended config's figures as every file states them
    near_misses: list[NearMiss] = field(default_factory=list)
    disturbed: list[tuple[FrozenTrial, str]] = field(default_factory=list)  # probes other work slowed

    @property
    def best_config(self) -> dict[str, Any] | None:
        """best_config.yaml's data: the seed's schema, the trainer's blocks, `measured:` last."""
        return None if self.export is None else self.export.document

    @property
    def complete(self) -> list[FrozenTrial]:
        return [t for t in self.trials if t.state == TrialState.COMPLETE and t.values is not None]


def build_report(
    study: optuna.Study,
    budget: Budget,
    plan: StudyPlan,
    exclude: Iterable[int] = (),
    now: dt.datetime | None = None,
) -> ReportData:
    created = (now or dt.datetime.now(dt.timezone.utc)).isoformat(timespec="seconds")
    selection = select(study, budget, exclude)
    trials = study.get_trials(deepcopy=False)
    chosen = selection.chosen
    measured_gpus = (
        (chosen.user_attrs.get(Attr.RESULT) or {}).get("world_size") if chosen else None
    ) or plan.gpus
    plan = dataclasses.replace(plan, gpus=int(measured_gpus))  # the GPUs the winner was measured on
    export = figures = None
    if chosen is not None:
        figures = gain.headline(study, chosen)
        measured = measured_block(chosen, study.study_name, plan.gpus, budget, created, figures, plan.nodes)
        export = plan.trainer.export(export_job(chosen, plan, budget, measured))
    return ReportData(
        study_name=study.study_name,
        plan=plan,
        budget=budget,
        selection=selection,
        trials=trials,
        frame=trials_frame(trials, selection, budget),
        gains=seed_gains(study, trials, chosen, figures),
        cost=study_cost(trials),
        model_error=memory_model_error(study),
        export=export,
        created=created,
        advice={t.number: advice(t, budget) for t in selection.closest},
        remeasured=remeasured(study, trials),
        headline=figures,
        near_misses=near_misses(study, trials, chosen, budget),
        disturbed=disturbed(trials),
    )


def remeasured(study: optuna.Study, trials: list[FrozenTrial]) -> list[tuple[FrozenTrial, pick.Figures]]:
    """The contenders measured again before the pick, with all their measurements, best mean first."""
    numbers = set(study.user_attrs.get(StudyAttr.REMEASURED, {}))
    found = [(t, pick.figures(study, t)) for t in trials if str(t.number) in numbers and t.values]
    return sorted(found, key=lambda pair: -pair[1].mean)


def export_job(chosen: FrozenTrial, plan: StudyPlan, budget: Budget, measured: dict[str, Any]) -> ExportJob:
    """What the chosen trial's probes recorded, for the trainer's export: the card is the GPU the probe ran
    on (its total memory), else the budget (an emulated card)."""
    result = chosen.user_attrs.get(Attr.RESULT) or {}
    return ExportJob(
        config=trial_config_of(chosen),
        model=plan.model,
        reward_model=plan.reward_model,
        gpus=plan.gpus,
        measured=measured,
        device=result.get("device") or plan.settings.get("device") or "cuda",
        nodes=plan.nodes,
        card_bytes=trial_environment(chosen).get("gpu_memory_bytes") or budget.bytes,
        resident_bytes=recorded_resident_bytes(result),
        rollout_name=plan.rollout_engine,
        rollout_measured=plan.engine.runs_rollout,
        model_parameters=plan.model_parameters,
        attention_heads=plan.attention_heads,
    )


def measured_block(
    trial: FrozenTrial,
    study_name: str,
    gpus: int,
    budget: Budget,
    created: str,
    figures: gain.Headline | None = None,
    nodes: int = 1,
) -> dict[str, Any]:
    """The chosen config's figures for best_config.yaml, as the report's headline states them: a
    confirmation's, else the mean samples/sec of its measurements and their highest peak (`gpus` over all
    `nodes`)."""
    result = trial.user_attrs.get(Attr.RESULT) or {}
    speed, peak = float(trial.values[0]), float(trial.values[1])
    if figures is not None:
        speed, peak = figures.samples_per_sec, float(figures.peak_bytes)
    tokens = result.get("tokens_per_sec")
    if tokens and trial.values[0]:
        tokens = tokens * speed / trial.values[0]  # the same tokens per sample
    busy = disturbance(trial_environment(trial))
    return {
        "samples_per_sec": round(speed, 4),
        "tokens_per_sec": round(tokens, 2) if tokens else tokens,
        "measurements": figures.measurements if figures else 1,
        "basis": figures.basis if figures else "one probe",
        "conditions": busy or "no other work measured on the machine",
        "peak_memory_gib": round(peak / GIB, 4),
        "peak_memory_bytes": int(peak),
        "peak_memory_source": result.get("peak_memory_source"),
        "gpu": trial_environment(trial).get("gpu"),
        "device": result.get("device"),
        "gpus": gpus,
        **({"nodes": nodes} if nodes > 1 else {}),
        "budget_gib": round(budget.bytes / GIB, 4),
        "headroom": budget.headroom,
        "trial_number": trial.number,
        "study_name": study_name,
        "date": created,
    }


def best_config_yaml(report: ReportData) -> str:
    data, plan = report.best_config, report.plan
    assert data is not None, "no recommendation to write"
    reward = "" if plan.reward_model != "function" else "# reward: a rule-based function (no reward model)\n"
    header = (
        f"# autotune: the recommended configuration of study {report.study_name} (trial "
        f"#{data['measured']['trial_number']}), measured by a real {data['algorithm'].upper()} "
        f"iteration.\n# Sizes count samples (responses) over all {plan.gpus} GPU(s); micro sizes are per "
        f"GPU. {plan.trainer.same_config_line()}\n{reward}{_workers_note(report)}"
    )
    return seed_yaml(data, header)


def _workers_note(report: ReportData) -> str:
    """Where best_config.yaml's worker count is not the one the probes ran: why (a header line)."""
    chosen, written = report.selection.chosen, (report.best_config or {}).get("num_rollout_workers")
    probed = trial_config(chosen) if chosen is not None else None
    if probed is None or written is None or written == probed.num_rollout_workers:
        return ""
    return (
        f"# num_rollout_workers: {written} is verl's default, not the {probed.num_rollout_workers} the "
        "probes ran: workers suit the training node's cores, not the probing machine's.\n"
    )


def config_yaml(report: ReportData) -> str:
    """The recommended configuration alone, as YAML in the seed's schema: what a user copies."""
    assert report.best_config is not None, "no recommendation to write"
    assert report.export is not None
    hidden = ("measured", *report.export.blocks)
    shown = {key: value for key, value in report.best_config.items() if key not in hidden}
    return seed_yaml(shown, "")


def advice(trial: FrozenTrial, budget: Budget) -> list[str]:
    """What to change so that this trial's config fits: how far it is, then the first-aid remedies."""
    config, status = trial_config(trial), trial_status(trial)
    if config is None:
        return []
    if status == Status.TIMEOUT:
        return [
            "the probe timed out: raise --timeout-per-probe, or shorten max_response_length "
            f"({config.max_response_length} -> {max(1, config.max_response_length // 2)})"
        ]
    peak = float(trial.values[1])
    over = max(0.0, peak - budget.limit)
    share = f"{over / GIB:.2f} GiB ({over / max(peak, 1.0):.0%})"
    if status in (Status.OOM, Status.INFERRED_OOM):  # the recorded peak is a lower bound: the budget
        tips = [f"{status}: needs more than the {gib(budget.bytes)} GiB budget; cut at least {share}"]
    else:
        tips = [f"peak {gib(peak)} GiB must fall by {share} to fit {gib(budget.limit)} GiB"]
    changes = [remedy.change for remedy in remedies(config)]
    return [*tips, *changes, "or a larger memory budget"]


# --- trials.csv, gains, cost ------------------------------------------------------------------------------


def trial_row(trial: FrozenTrial, selection: Selection, budget: Budget) -> dict[str, Any]:
    attrs = trial.user_attrs
    result = attrs.get(Attr.RESULT) or {}
    done = trial.state == TrialState.COMPLETE and trial.values is not None
    row: dict[str, Any] = {
        "number": trial.number,
        "state": trial.state.name,
        "status": trial_status(trial),
        "seed_config": attrs.get(Attr.SEED_CONFIG),
        "samples_per_sec": trial.values[0] if done else None,
        "tokens_per_sec": result.get("tokens_per_sec"),
        "peak_gib": trial.values[1] / GIB if done else None,
        "predicted_peak_gib": attrs[Attr.PREDICTED_PEAK_BYTES] / GIB
        if attrs.get(Attr.PREDICTED_PEAK_BYTES)
        else None,
        "calibration_points": attrs.get(Attr.CALIBRATION_POINTS),
        "feasible": bool(done and trial_status(trial) == Status.OK and trial.values[1] <= budget.limit),
        "on_front": any(t.number == trial.number for t in selection.front),
        "chosen": selection.chosen is not None and selection.chosen.number == trial.number,
        "iteration_seconds": result.get("iteration_seconds"),
        "wall_seconds": result.get("wall_seconds"),
        "oom_kind": attrs.get(Attr.OOM_KIND),
        "duplicate_of": attrs.get(Attr.DUPLICATE_OF),
        "dominates_oom_trial": attrs.get(Attr.DOMINATES_OOM_TRIAL),
    }
    for phase, seconds in (result.get("phase_seconds") or {}).items():
        row[f"phase_{phase}_s"] = seconds
    row.update(attrs.get(Attr.CONFIG) or {})
    row.update({f"param_{name}": value for name, value in trial.params.items()})
    row["datetime_start"] = trial.datetime_start
    row["datetime_complete"] = trial.datetime_complete
    return row


def trials_frame(trials: list[FrozenTrial], selection: Selection, budget: Budget) -> pd.DataFrame:
    frame = pd.DataFrame([trial_row(t, selection, budget) for t in trials])
    for column in INT_COLUMNS:  # whole numbers stay whole where some trials have none
        if column in frame:
            frame[column] = frame[column].astype("Int64")
    return frame


def seed_gains(
    study: optuna.Study,
    trials: list[FrozenTrial],
    chosen: FrozenTrial | None,
    figures: gain.Headline | None = None,
) -> list[Gain]:
    """The chosen config's speed over each measured hand-made config: from the back-to-back comparison when
    the study holds one for the chosen config, else from the first measurements (and the report says so)."""
    comparison = figures.comparison if figures is not None else None
    gains = []
    for trial in trials:
        name = trial.user_attrs.get(Attr.SEED_CONFIG)
        if not name or trial.state != TrialState.COMPLETE or trial.values is None:
            continue
        if Attr.DUPLICATE_OF in trial.user_attrs:
            continue
        ok = trial_status(trial) == Status.OK and trial.values[0] > 0
        if comparison is not None and str(trial.number) in comparison.measurements and chosen is not None:
            speeds = comparison.speeds(trial.number)
            gains.append(
                Gain(
                    str(name),
                    trial,
                    comparison.ratio(trial.number),
                    back_to_back=True,
                    seed_speed=statistics.mean(speeds) if speeds else None,
                    conditions=comparison.disturbed(),
                    verl=comparison.verl(trial.number),
                    probe_only=comparison.probe_only(trial.number),
                )
            )
            continue
        ratio = chosen.values[0] / trial.values[0] if chosen is not None and ok else None
        worst = worst_disturbance([trial_environment(t) for t in (trial, chosen) if t])
        busy = [worst] if worst else []
        speed = trial.values[0] if ok else None  # a config that did not run through has no speed, not 0
        gains.append(Gain(str(name), trial, ratio, seed_speed=speed, conditions=busy))
    return gains


def disturbed(trials: list[FrozenTrial]) -> list[tuple[FrozenTrial, str]]:
    """Probes that ran while other work took enough of the machine to slow them."""
    found = [(t, disturbance(trial_environment(t))) for t in trials if trial_status(t) in LAUNCHED]
    return [(trial, text) for trial, text in found if text]


def near_misses(
    study: optuna.Study, trials: list[FrozenTrial], chosen: FrozenTrial | None, budget: Budget, count: int = 5
) -> list[NearMiss]:
    """Configurations measured faster than the recommended one, and why each lost: over the limit (within
    the budget but not its headroom, or over the budget), or a lower mean once re-measured."""
    if chosen is None:
        return []
    remeasured = study.user_attrs.get(StudyAttr.REMEASURED, {})
    found = []
    for trial in trials:
        if trial.number == chosen.number or trial.values is None or not trial.user_attrs.get(Attr.STATUS):
            continue
        if trial_status(trial) != Status.OK or Attr.DUPLICATE_OF in trial.user_attrs:
            continue
        if trial.values[0] <= chosen.values[0] and str(trial.number) not in remeasured:
            continue
        peak = trial.values[1]
        if peak > budget.bytes:
            why = f"peak {gib(peak)} GiB is over the {gib(budget.bytes)} GiB budget"
        elif peak > budget.limit:
            why = (
                f"peak {gib(peak)} GiB is within the {gib(budget.bytes)} GiB budget but over the "
                f"{budget.headroom:.0%} headroom (limit {gib(budget.limit)} GiB): a longer run's "
                f"fragmentation could take it over"
            )
        elif str(trial.number) in remeasured:
            why = _remeasured_why(pick.figures(study, trial), pick.figures(study, chosen).mean)
        else:
            why = "its confirmation probe failed (autotune report --confirm)"
        found.append(NearMiss(trial, why))
    return sorted(found, key=lambda miss: -miss.trial.values[0])[:count]


def _remeasured_why(found: pick.Figures, chosen_mean: float) -> str:
    """Why a re-measured contender was not recommended."""
    if found.count == 1:
        return (
            "not re-probed in the time allowed: its one probe, the draw that made it a contender, is not "
            "set against means"
        )
    probes = f"{found.count} probes"
    if found.mean > chosen_mean:
        return (
            f"re-measured: mean {found.mean:.3f} samples/s over {probes}, within the probes' noise of the "
            f"recommended one's, which keeps more of the trainer's defaults"
        )
    return f"re-measured: mean {found.mean:.3f} samples/s over {probes}, below the recommended one's"


def study_cost(trials: list[FrozenTrial]) -> dict[str, Any]:
    """Probes run and their wall time; probes avoided by reason (memory model, dominance, duplicates)."""
    launched = [t for t in trials if trial_status(t) in LAUNCHED and Attr.DUPLICATE_OF not in t.user_attrs]
    avoided: dict[str, int] = {}
    for trial in trials:
        reason = "duplicate" if Attr.DUPLICATE_OF in trial.user_attrs else trial_status(trial)
        if reason not in LAUNCHED and trial.state != TrialState.RUNNING:
            avoided[reason] = avoided.get(reason, 0) + 1
    walls = [float((t.user_attrs.get(Attr.RESULT) or {}).get("wall_seconds") or 0.0) for t in launched]
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    span = (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0
    return {
        "trials": len(trials),
        "probes_run": len(launched),
        "probes_avoided": sum(avoided.values()),
        "avoided_by_status": dict(sorted(avoided.items())),
        "probe_wall_seconds": sum(walls),
        "running": sum(t.state == TrialState.RUNNING for t in trials),
        "study_span_seconds": span,
    }
