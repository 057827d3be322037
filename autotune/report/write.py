"""The report (DESIGN §6): select the Pareto-best trial of a study and write what a person and verl need.

    result = write_report(study, Path("reports/my-study"), budget, space=space)
    sys.exit(result.exit_code)            # 0: a feasible config was written; 1: none is feasible

Selection: Optuna's Pareto front (`study.best_trials`, which keeps only feasible trials: every constraint
<= 0); among its ok trials within budget·(1 − headroom) the fastest, ties to less memory (then to the
original measurement over a duplicate). Files written into `out_dir`:

    best_config.yaml     the seed's schema + a `measured:` block whose figures are the chosen trial's
    verl_overrides.txt   one Hydra override per line for `python -m verl.trainer.main_ppo` (verl 0.9.1)
    trials.csv           every trial: state, status, knobs, params, figures, phases, seed name
    report.md            the same story as the HTML, in text
    report.html          self-contained (inline SVG plots, inline CSS, no scripts): opens offline

When no trial is feasible, best_config.yaml and verl_overrides.txt are not written (stale ones from an
earlier report are removed), the reports list the closest trials and what to change, and `exit_code` is 1.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import yaml
from optuna.trial import FrozenTrial, TrialState

from autotune.config.knobs import ProbeConfig
from autotune.errors import Unavailable, UserError
from autotune.formats.verl import VerlOverrides, format_overrides, verl_overrides
from autotune.probe.contract import GIB
from autotune.report.markdown import render_markdown, status_of
from autotune.search.study import Budget, memory_model_error, ok_front, pareto_best, trial_config

__all__ = [
    "CONTEXT_ATTR",
    "ReportContext",
    "ReportData",
    "ReportResult",
    "Selection",
    "budget_from_study",
    "remember_context",
    "select",
    "write_report",
]

CONTEXT_ATTR = "report_context"  # study user attr: what the report needs that trials do not record
FILES = ("best_config.yaml", "verl_overrides.txt", "trials.csv", "report.md", "report.html")
LAUNCHED = ("ok", "oom", "timeout", "crashed", "interrupted")  # statuses of probes that really ran
CLOSEST = 3
INT_COLUMNS = ("calibration_points", "duplicate_of", "dominates_oom_trial", "log_prob_micro_batch_size")


@dataclass(frozen=True)
class ReportContext:
    """Study-level facts: the model, reward model and GPU count the trials were measured with."""

    study_name: str
    model: str = "unknown"
    reward_model: str = "function"
    gpus: int = 1
    space_name: str | None = None


@dataclass
class Selection:
    front: list[FrozenTrial]  # Optuna's feasible Pareto front, fastest first
    chosen: FrozenTrial | None  # the Pareto-best config, None when nothing is feasible
    closest: list[FrozenTrial] = field(default_factory=list)  # only when nothing is feasible


@dataclass
class Gain:
    name: str  # the hand-made config's name
    trial: FrozenTrial
    ratio: float | None  # chosen samples/sec over the seed's (None when the seed did not run ok)


@dataclass
class ReportData:
    """Everything the renderers need, computed once."""

    context: ReportContext
    budget: Budget
    selection: Selection
    trials: list[FrozenTrial]  # every trial of the study, any state
    frame: pd.DataFrame
    gains: list[Gain]
    cost: dict[str, Any]
    model_error: tuple[float | None, int]
    best_config: dict[str, Any] | None
    verl: VerlOverrides | None
    created: str
    advice: dict[int, list[str]] = field(default_factory=dict)  # closest trial number -> what to change

    @property
    def complete(self) -> list[FrozenTrial]:
        return [t for t in self.trials if t.state == TrialState.COMPLETE and t.values is not None]


@dataclass
class ReportResult:
    out_dir: Path
    files: dict[str, Path]  # file name -> path, only those written
    chosen: FrozenTrial | None
    front: list[FrozenTrial]
    closest: list[FrozenTrial]
    messages: list[str]  # one-line summaries for the terminal

    @property
    def ok(self) -> bool:
        return self.chosen is not None

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


# --- study context ---------------------------------------------------------------------------------------


def remember_context(study: optuna.Study, space: Any, budget: Budget) -> None:
    """Store what `autotune report --study NAME` needs later (model, GPUs, budget) with the study."""
    study.set_user_attr(
        CONTEXT_ATTR,
        {
            "space": space.name,
            "model": space.model,
            "reward_model": space.reward_model,
            "gpus": space.gpus,
            "budget_bytes": int(budget.bytes),
            "headroom": float(budget.headroom),
        },
    )


def budget_from_study(study: optuna.Study) -> Budget | None:
    stored = study.user_attrs.get(CONTEXT_ATTR) or {}
    if "budget_bytes" not in stored:
        return None
    return Budget(int(stored["budget_bytes"]), float(stored.get("headroom", 0.10)))


def resolve_context(
    study: optuna.Study, space: Any = None, space_name: str | None = None, **given: Any
) -> ReportContext:
    """Explicit arguments, else the space, else what the study stored, else what the trials say."""
    stored = dict(study.user_attrs.get(CONTEXT_ATTR) or {})
    if space is not None:
        stored.update(space=space.name, model=space.model, reward_model=space.reward_model, gpus=space.gpus)
    stored.update({k: v for k, v in given.items() if v is not None})
    gpus = stored.get("gpus") or _world_size_from_trials(study) or 1
    return ReportContext(
        study_name=study.study_name,
        model=stored.get("model", "unknown"),
        reward_model=stored.get("reward_model", "function"),
        gpus=int(gpus),
        space_name=space_name or stored.get("space"),
    )


def _world_size_from_trials(study: optuna.Study) -> int | None:
    for trial in study.get_trials(deepcopy=False):
        size = (trial.user_attrs.get("result") or {}).get("world_size")
        if size:
            return int(size)
    return None


def model_name_or_path(name: str) -> str:
    """The Hugging Face id of a registry model (the seed's `model_name_or_path`), else the name or path."""
    if Path(name).exists() or name == "unknown":
        return name
    from autotune.models.registry import MODELS  # imports torch: only when there is a name to look up

    role, source = MODELS.get(name, ("", name))
    return name if role in ("test", "") else source


def verl_model_path(name: str) -> str | None:
    """A path verl can load (hub id or local directory); None for autotune's own test models."""
    path = model_name_or_path(name)
    return None if path in (name, "unknown") and not Path(name).exists() else path


# --- selection -------------------------------------------------------------------------------------------


def _speed(trial: FrozenTrial) -> float:
    return float(trial.values[0])


def _peak(trial: FrozenTrial) -> float:
    return float(trial.values[1])


def select(study: optuna.Study, budget: Budget, exclude: Iterable[int] = ()) -> Selection:
    """The feasible Pareto front and the Pareto-best trial.

    `exclude`: trial numbers a confirmation probe rejected; their duplicates (same config) go with them.
    """
    front = ok_front(study)
    chosen = pareto_best(front, budget, set(exclude))
    closest = [] if chosen else closest_trials(study, budget)
    return Selection(front, chosen, closest)


def closest_trials(study: optuna.Study, budget: Budget, count: int = CLOSEST) -> list[FrozenTrial]:
    """Complete trials with the smallest violation: memory over the limit first, then a failed run."""
    complete = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.values is not None and "duplicate_of" not in t.user_attrs
    ]

    def violation(t: FrozenTrial) -> tuple[float, int, float]:
        return max(0.0, _peak(t) - budget.limit), int(status_of(t) != "ok"), -_speed(t)

    return sorted(complete, key=violation)[:count]


def advice(trial: FrozenTrial, budget: Budget) -> list[str]:
    """What to change so that this trial's config fits (the seed's OOM checklist, with numbers)."""
    config, status = trial_config(trial), status_of(trial)
    if config is None:
        return []
    if status == "timeout":
        return [
            "the probe timed out: raise --timeout-per-probe, or shorten max_response_length "
            f"({config.max_response_length} -> {max(1, config.max_response_length // 2)})"
        ]
    over = max(0.0, _peak(trial) - budget.limit)
    share = f"{over / GIB:.2f} GiB ({over / max(_peak(trial), 1.0):.0%})"
    if status in ("oom", "inferred_oom"):  # the recorded peak is a lower bound: the budget
        tips = [f"{status}: needs more than the {_gib(budget.bytes)} GiB budget; cut at least {share}"]
    else:
        tips = [f"peak {_gib(_peak(trial))} GiB must fall by {share} to fit {_gib(budget.limit)} GiB"]
    return tips + _memory_tips(config)


def _memory_tips(c: ProbeConfig) -> list[str]:
    tips = []
    if c.micro_batch_size > 1:
        tips.append(f"halve micro_batch_size: {c.micro_batch_size} -> {c.micro_batch_size // 2}")
    if c.forward_micro_batch_size > c.micro_batch_size:
        tips.append(
            f"halve log_prob_micro_batch_size: {c.forward_micro_batch_size} -> "
            f"{c.forward_micro_batch_size // 2}"
        )
    tips.append(
        f"shorter lengths: max_response_length {c.max_response_length} -> "
        f"{max(1, c.max_response_length // 2)}, max_prompt_length {c.max_prompt_length} -> "
        f"{max(1, c.max_prompt_length // 2)} (keep them above your data's p90/p95)"
    )
    if not c.gradient_checkpointing:
        tips.append("turn on gradient_checkpointing")
    if not c.use_lora:
        tips.append("use LoRA (lora: {enabled: true, r: 16}): no full optimizer state")
    tips.append("offload parameters/optimizer to CPU (FSDP offload), or a larger memory budget")
    return tips


# --- best_config.yaml --------------------------------------------------------------------------------------


def best_config(trial: FrozenTrial, ctx: ReportContext, budget: Budget, created: str) -> dict[str, Any]:
    """The seed's schema with the chosen trial's figures in a `measured:` block."""
    c = trial_config(trial)
    assert c is not None, f"trial {trial.number} has no config"
    result = trial.user_attrs.get("result") or {}
    env = result.get("environment") or {}
    data: dict[str, Any] = {
        key: getattr(c, key)
        for key in (
            "rollout_batch_size",
            "train_batch_size",
            "micro_batch_size",
            "gradient_accumulation_steps",
            "num_rollout_workers",
            "max_prompt_length",
            "max_response_length",
        )
    }
    if c.log_prob_micro_batch_size is not None:
        data["log_prob_micro_batch_size"] = c.log_prob_micro_batch_size
    data.update(
        gradient_checkpointing=c.gradient_checkpointing,
        algorithm=c.algorithm,
        rollout_n=c.rollout_n,
        kl_coef=c.kl_coef,
    )
    actor: dict[str, Any] = {"model_name_or_path": model_name_or_path(ctx.model), "use_lora": c.use_lora}
    if c.use_lora:
        actor.update(lora_r=c.lora_r, lora_alpha=c.lora_alpha)
    data["actor_model_config"] = actor
    if ctx.reward_model != "function":
        data["reward_model_config"] = {
            "model_name_or_path": model_name_or_path(ctx.reward_model),
            "trainable": False,
        }
    data["measured"] = {
        "samples_per_sec": _speed(trial),
        "tokens_per_sec": result.get("tokens_per_sec"),
        "peak_memory_gib": round(_peak(trial) / GIB, 4),
        "peak_memory_bytes": int(_peak(trial)),
        "peak_memory_source": result.get("peak_memory_source"),
        "gpu": env.get("gpu"),
        "device": result.get("device"),
        "gpus": ctx.gpus,
        "budget_gib": round(budget.bytes / GIB, 4),
        "headroom": budget.headroom,
        "trial_number": trial.number,
        "study_name": ctx.study_name,
        "date": created,
    }
    return data


def best_config_yaml(data: dict[str, Any], ctx: ReportContext) -> str:
    reward = "" if ctx.reward_model != "function" else "# reward: a rule-based function (no reward model)\n"
    header = (
        f"# autotune: the Pareto-best configuration of study {ctx.study_name} (trial "
        f"#{data['measured']['trial_number']}), measured by a real {data['algorithm'].upper()} "
        f"iteration.\n# Sizes count samples (responses) over all {ctx.gpus} GPU(s); micro sizes are per "
        f"GPU. verl_overrides.txt has the same config in verl's keys.\n{reward}"
    )
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


# --- trials.csv, gains, cost ------------------------------------------------------------------------------


def trial_row(trial: FrozenTrial, selection: Selection, budget: Budget) -> dict[str, Any]:
    attrs = trial.user_attrs
    result = attrs.get("result") or {}
    done = trial.state == TrialState.COMPLETE and trial.values is not None
    row: dict[str, Any] = {
        "number": trial.number,
        "state": trial.state.name,
        "status": status_of(trial),
        "seed_config": attrs.get("seed_config"),
        "samples_per_sec": _speed(trial) if done else None,
        "tokens_per_sec": result.get("tokens_per_sec"),
        "peak_gib": _peak(trial) / GIB if done else None,
        "predicted_peak_gib": attrs["predicted_peak_bytes"] / GIB
        if attrs.get("predicted_peak_bytes")
        else None,
        "calibration_points": attrs.get("calibration_points"),
        "feasible": bool(done and status_of(trial) == "ok" and _peak(trial) <= budget.limit),
        "on_front": any(t.number == trial.number for t in selection.front),
        "chosen": selection.chosen is not None and selection.chosen.number == trial.number,
        "iteration_seconds": result.get("iteration_seconds"),
        "wall_seconds": result.get("wall_seconds"),
        "oom_kind": attrs.get("oom_kind"),
        "duplicate_of": attrs.get("duplicate_of"),
        "dominates_oom_trial": attrs.get("dominates_oom_trial"),
    }
    for phase, seconds in (result.get("phase_seconds") or {}).items():
        row[f"phase_{phase}_s"] = seconds
    row.update(attrs.get("config") or {})
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


def seed_gains(trials: list[FrozenTrial], chosen: FrozenTrial | None) -> list[Gain]:
    """The chosen config's speed over each measured hand-made config of the seed."""
    gains = []
    for trial in trials:
        name = trial.user_attrs.get("seed_config")
        if not name or trial.state != TrialState.COMPLETE or trial.values is None:
            continue
        ok = status_of(trial) == "ok" and _speed(trial) > 0
        ratio = _speed(chosen) / _speed(trial) if chosen is not None and ok else None
        gains.append(Gain(str(name), trial, ratio))
    return gains


def study_cost(trials: list[FrozenTrial]) -> dict[str, Any]:
    """Probes run and their wall time; probes avoided by reason (memory model, dominance, duplicates)."""
    launched = [t for t in trials if status_of(t) in LAUNCHED and "duplicate_of" not in t.user_attrs]
    avoided: dict[str, int] = {}
    for trial in trials:
        reason = "duplicate" if "duplicate_of" in trial.user_attrs else status_of(trial)
        if reason not in LAUNCHED and trial.state != TrialState.RUNNING:
            avoided[reason] = avoided.get(reason, 0) + 1
    walls = [float((t.user_attrs.get("result") or {}).get("wall_seconds") or 0.0) for t in launched]
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


# --- assembling and writing -------------------------------------------------------------------------------


def build_report(
    study: optuna.Study,
    budget: Budget,
    ctx: ReportContext,
    exclude: Iterable[int] = (),
    now: dt.datetime | None = None,
) -> ReportData:
    created = (now or dt.datetime.now(dt.timezone.utc)).isoformat(timespec="seconds")
    selection = select(study, budget, exclude)
    trials = study.get_trials(deepcopy=False)
    chosen = selection.chosen
    measured_gpus = (
        (chosen.user_attrs.get("result") or {}).get("world_size") if chosen else None
    ) or ctx.gpus
    ctx = dataclasses.replace(ctx, gpus=int(measured_gpus))  # the GPUs the winner was measured on
    data = best_config(chosen, ctx, budget, created) if chosen else None
    verl = None
    if chosen is not None:
        verl = verl_overrides(trial_config(chosen), ctx.gpus, verl_model_path(ctx.model))
    return ReportData(
        context=ctx,
        budget=budget,
        selection=selection,
        trials=trials,
        frame=trials_frame(trials, selection, budget),
        gains=seed_gains(trials, chosen),
        cost=study_cost(trials),
        model_error=memory_model_error(study),
        best_config=data,
        verl=verl,
        created=created,
        advice={t.number: advice(t, budget) for t in selection.closest},
    )


def write_report(
    study: optuna.Study,
    out_dir: Path,
    budget: Budget | None = None,
    space_name: str | None = None,
    *,
    space: Any = None,
    model: str | None = None,
    reward_model: str | None = None,
    gpus: int | None = None,
    exclude: Iterable[int] = (),
    now: dt.datetime | None = None,
) -> ReportResult:
    """Select the Pareto-best trial and write the five report files into `out_dir`.

    `budget` defaults to the one stored with the study (`remember_context`); model, reward model and GPU count
    come from the arguments, else `space`, else the study. Works on a finished study and on a running one.
    """
    from autotune.report.html import render_html  # matplotlib: imported only to write a report

    budget = budget or budget_from_study(study)
    if budget is None:
        raise UserError(f"study {study.study_name!r} stores no memory budget: pass --memory-budget GIB")
    ctx = resolve_context(study, space, space_name, model=model, reward_model=reward_model, gpus=gpus)
    report = build_report(study, budget, ctx, exclude, now)
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"--out {out_dir}: cannot create it ({exc.strerror}); choose a writable folder"
        ) from None
    texts = {
        "trials.csv": report.frame.to_csv(index=False),
        "report.md": render_markdown(report),
        "report.html": render_html(report),
    }
    if report.best_config is not None and report.verl is not None:
        texts["best_config.yaml"] = best_config_yaml(report.best_config, ctx)
        texts["verl_overrides.txt"] = format_overrides(report.verl.values)
    files = {}
    for name in FILES:
        path = out_dir / name
        try:
            if name in texts:
                write_whole(path, texts[name])
                files[name] = path
            elif path.exists():
                path.unlink()  # a stale recommendation from an earlier report must not survive
        except OSError as exc:
            raise Unavailable(
                f"cannot write {path} ({exc.strerror or exc}); the study is intact: free space or choose "
                f"another --out, then run `autotune report --study {study.study_name} --out DIR` "
                f"(with --storage URL if it is not the default)"
            ) from None
    return ReportResult(
        out_dir,
        files,
        report.selection.chosen,
        report.selection.front,
        report.selection.closest,
        summary_lines(report, out_dir),
    )


def write_whole(path: Path, text: str) -> None:
    """Write through a temporary file and rename: a full disk never leaves a truncated best_config.yaml
    for a training job to pick up."""
    partial = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.partial")  # one per writer
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def summary_lines(report: ReportData, out_dir: Path) -> list[str]:
    chosen, budget = report.selection.chosen, report.budget
    if chosen is None:
        lines = [
            f"no feasible configuration: no trial ran within {_gib(budget.limit)} GiB "
            f"(budget {_gib(budget.bytes)} GiB less {budget.headroom:.0%} headroom)"
        ]
        for trial in report.selection.closest[:1]:
            lines += [f"closest: trial #{trial.number} ({status_of(trial)}, {_gib(_peak(trial))} GiB); try:"]
            lines += [f"  - {tip}" for tip in report.advice.get(trial.number, [])[1:4]]
    else:
        lines = [
            f"Pareto-best: trial #{chosen.number}, {_speed(chosen):.3f} samples/s at "
            f"{_gib(_peak(chosen))} GiB (feasible <= {_gib(budget.limit)} GiB)"
        ]
        lines += [f"{g.ratio:.2f}x the hand-made config '{g.name}'" for g in report.gains if g.ratio]
    return [*lines, f"report: {out_dir / 'report.html'}"]


def _gib(value: float) -> str:
    return f"{value / GIB:.3f}" if math.isfinite(value) else "inf"
