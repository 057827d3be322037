"""Write the report of a study into `<out>/<study>/` (docs/design.md, "The report and the verl export").

    result = write_report(study, Path("reports/my-study"))
    sys.exit(result.exit_code)            # 0: a feasible config was written; 1: none is feasible

Files:

    best_config.yaml     the seed's schema + a `measured:` block whose figures are the chosen trial's
    verl_overrides.txt   one Hydra override per line for `python -m verl.trainer.main_ppo` (verl 0.9.1)
    trl_config.yaml      instead, for a study run with --target trl: GRPOConfig's fields for TRL 1.16
    trials.csv           every trial: state, status, knobs, params, figures, phases, seed name
    report.md            the same story as the HTML, in text
    report.html          self-contained (inline SVG plots, inline CSS, no scripts): opens offline
    summary.json         the pick, its figures, the gain, near misses, warnings, the files, the launch line

When no trial is feasible, best_config.yaml and verl_overrides.txt are not written (stale ones from an
earlier report are removed), the reports list the closest trials and what to change, and `exit_code` is 1.
Every file is written through a temporary file and a rename: a full disk never leaves a truncated file.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.errors import Unavailable, UserError
from autotune.files import make_folder, write_whole
from autotune.memory.budget import Budget
from autotune.report.data import ReportData, best_config_yaml, build_report, config_yaml
from autotune.report.markdown import render_markdown
from autotune.report.missing_gain import no_gain_line
from autotune.report.tables import (
    conditions_lines,
    default_lines,
    gain_lines,
    launch_line,
    recipe_lines,
    remeasured_line,
    verdict_line,
)
from autotune.status import Attr
from autotune.study.plan import StudyPlan
from autotune.study.trials import trial_status
from autotune.trainers.registry import TRAINERS
from autotune.units import GIB, gib

__all__ = [
    "FILES",
    "SUMMARY_FILE",
    "ReportResult",
    "study_plan",
    "summary",
    "write_report",
]

SUMMARY_FILE = "summary.json"
# every file a report may write, in order; of the trainers' exports, only the study's trainer's is written
FILES = (
    "best_config.yaml",
    *(trainer.export_file for trainer in TRAINERS.values()),
    "trials.csv",
    "report.md",
    "report.html",
    SUMMARY_FILE,
)


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


def study_plan(study: optuna.Study) -> StudyPlan:
    """The study's stored plan; for a study `autotune run` did not make, what its trials say (the GPUs)."""
    plan = StudyPlan.load(study)
    if plan is not None:
        return plan
    sizes = (
        (t.user_attrs.get(Attr.RESULT) or {}).get("world_size") for t in study.get_trials(deepcopy=False)
    )
    return StudyPlan(gpus=int(next((size for size in sizes if size), 1)))


def write_report(
    study: optuna.Study,
    out_dir: Path,
    budget: Budget | None = None,
    *,
    plan: StudyPlan | None = None,
    exclude: Iterable[int] = (),
    now: dt.datetime | None = None,
    run: dict[str, Any] | None = None,
) -> ReportResult:
    """Pick the recommended trial and write the report files into `out_dir` (FILES: the trainer's file of
    the two, and the rest).

    `plan` (model, reward model, GPUs, budget) defaults to the one stored with the study, and `budget` to the
    plan's. Works on a finished study and on a running one.
    """
    from autotune.report.html import render_html  # matplotlib: imported only to write a report

    plan = plan or study_plan(study)
    budget = budget or plan.budget
    if budget is None:
        raise UserError(f"study {study.study_name!r} stores no memory budget: pass --memory-budget GIB")
    report = build_report(study, budget, plan, exclude, now)
    out_dir = make_folder(Path(out_dir))
    texts = {
        "trials.csv": report.frame.to_csv(index=False),
        "report.md": render_markdown(report),
        "report.html": render_html(report),
    }
    if report.export is not None:
        texts["best_config.yaml"] = best_config_yaml(report)
        texts[report.plan.trainer.export_file] = report.export.text
    written = [name for name in FILES if name in texts] + [SUMMARY_FILE]
    texts[SUMMARY_FILE] = json.dumps(summary(report, out_dir, written, run), indent=2) + "\n"
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
        summary_lines(report, out_dir, files),
    )


def export_launch(report: ReportData, out_dir: Path) -> str:
    """The command that starts the target trainer on the exported file."""
    return launch_line(report, str((out_dir / report.plan.trainer.export_file).resolve()))


def summary_lines(report: ReportData, out_dir: Path, files: dict[str, Path]) -> list[str]:
    """What the terminal shows last: the verdict and the gain, the configuration, the files by absolute
    path, and the command to copy."""
    chosen, budget = report.selection.chosen, report.budget
    recipe = " ".join(recipe_lines(report.plan))  # one line: what was trained, and what of it was searched
    lines = [recipe] if recipe else []
    if chosen is None and not report.complete:
        lines += ["no trial was measured yet: nothing to recommend"]
    elif chosen is None:
        lines += [
            f"no feasible configuration: no trial ran within {gib(budget.limit)} GiB "
            f"(budget {gib(budget.bytes)} GiB less {budget.headroom:.0%} headroom)"
        ]
        for trial in report.selection.closest[:1]:
            lines += [
                f"closest: trial #{trial.number} ({trial_status(trial)}, {gib(trial.values[1])} GiB); try:"
            ]
            lines += [f"  - {tip}" for tip in report.advice.get(trial.number, [])[1:4]]
    else:
        lines += [verdict_line(report)]
        if report.remeasured:
            lines += [f"  {remeasured_line(report)}"]
        lines += gain_lines(report) + conditions_lines(report)
        lines += ["configuration (best_config.yaml):"]
        lines += ["  " + line for line in config_yaml(report).splitlines()]
        if differing := default_lines(report):
            label = report.plan.trainer.label
            lines += [f"set away from {label}'s defaults by rule or memory (report.md lists every key):"]
            lines += differing
    lines += ["files:"] + [f"  {path.resolve()}" for name, path in files.items() if name != "report.md"]
    run_log = out_dir / "run.log"
    if run_log.exists():
        lines += [f"  {run_log.resolve()}"]
    if chosen is not None:
        trainer = report.plan.trainer
        lines += [f"start {trainer.label} on it (replace {trainer.launch_edits}):"]
        lines += ["  " + export_launch(report, out_dir)]
    return lines


def summary(
    report: ReportData, out_dir: Path, written: list[str], run: dict[str, Any] | None = None
) -> dict[str, Any]:
    """summary.json: the run in numbers, for scripts and overnight pipelines (docs/design.md: its keys)."""
    chosen, figures, budget = report.selection.chosen, report.headline, report.budget
    recommended = None
    if chosen is not None and figures is not None:
        measured = (report.best_config or {}).get("measured", {})
        recommended = {
            "trial": chosen.number,
            "samples_per_sec": round(figures.samples_per_sec, 4),
            "tokens_per_sec": measured.get("tokens_per_sec"),
            "peak_memory_gib": round(figures.peak_bytes / GIB, 4),
            "measurements": figures.measurements,
            "basis": figures.basis,
            "config": (chosen.user_attrs.get(Attr.CONFIG) or {}),
        }
    return {
        "study": report.study_name,
        "written": report.created,
        "exit_code": 0 if chosen is not None else 1,
        "run": run,
        "recommended": recommended,
        "gain": [
            {
                "hand_made": g.name,
                "trial": g.trial.number,
                "ratio": None if g.ratio is None else round(g.ratio, 4),
                "back_to_back": g.back_to_back,
                "hand_made_samples_per_sec": g.seed_speed,
                "conditions": g.conditions,
                # what a verl job gets: the knobs verl reads, with the range of the pairwise ratios
                "verl": None if g.verl is None else g.verl.to_dict(),
                "probe_only": None if g.probe_only is None else g.probe_only.to_dict(),
                # why there is no ratio and what would measure it (None when there is one)
                "missing": no_gain_line(g, report.plan.settings.get("timeout_seconds"))
                if chosen is not None
                else None,
            }
            for g in report.gains
        ],
        "near_misses": [
            {
                "trial": miss.trial.number,
                "samples_per_sec": miss.trial.values[0],
                "peak_memory_gib": round(miss.trial.values[1] / GIB, 4),
                "why": miss.why,
            }
            for miss in report.near_misses
        ],
        "warnings": conditions_lines(report),
        "budget": {"gib": budget.bytes / GIB, "limit_gib": budget.limit / GIB, "headroom": budget.headroom},
        "recipe": report.plan.recipe,
        "trials": dict(sorted(Counter(trial_status(t) for t in report.trials).items())),
        "cost": report.cost,
        "files": {name: str((out_dir / name).resolve()) for name in written},
        "launch": export_launch(report, out_dir) if chosen else None,
    }
