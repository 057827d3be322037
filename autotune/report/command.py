"""`autotune report`: write the report of a finished or running study, optionally confirming the winner."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import optuna
from rich.console import Console

from autotune.config.knobs import DEFAULT_HEADROOM
from autotune.errors import UserError
from autotune.memory.budget import Budget
from autotune.probe.contract import ProbeSettings
from autotune.report import gain
from autotune.report.lines import side_line
from autotune.report.selection import select
from autotune.report.write import SUMMARY_FILE, study_plan, write_report
from autotune.status import Attr, StudyAttr
from autotune.study.storage import default_storage_url
from autotune.study.trials import check_study_name, open_study
from autotune.trainers.registry import run_probe
from autotune.units import GIB

__all__ = ["ReportOptions", "confirm_winner", "default_storage", "load_existing_study", "report_study"]


@dataclass
class ReportOptions:
    study: str
    storage: str | None = None
    out: Path = Path("reports")
    memory_budget_gib: float | None = None
    confirm: bool = False
    confirm_iterations: int = 6
    device: str = "auto"
    verl_python: str | None = None  # --confirm of a study probed with --engine verl
    trl_python: str | None = None  # --confirm of a study probed with --engine trl
    json: bool = False  # print summary.json alone on stdout


def load_existing_study(storage: str, name: str) -> optuna.Study:
    return open_study(storage, name, seed=None, create=False)


def default_storage(out: Path, name: str) -> str:
    """The study file `autotune run` left in <out>/<study>/ (SQLite, or a journal after --parallel)."""
    folder = out / name
    if not ((folder / "study.db").exists() or (folder / "study.journal").exists()):
        raise UserError(
            f"--study {name}: no study file in {folder} (study.db or study.journal); pass --storage URL "
            f"or --out DIR"
        )
    return default_storage_url(folder, parallel=1)


def confirm_winner(
    study: optuna.Study, budget: Budget, options: ReportOptions, console: Console
) -> list[int]:
    """Re-probe the recommended trial with more iterations; a failing winner is excluded, the next tried."""
    from autotune.probe.devices import resolve_device

    plan = study_plan(study)
    device = resolve_device(options.device, plan.gpus)
    probed_as = (  # as the study probed, or, for a study `run` did not make, by what it says
        plan.probe_settings(device, engine_python=plan.engine.python_from(options))
        if plan.settings
        else ProbeSettings(
            model=plan.model, reward_model=plan.reward_model, world_size=plan.gpus, device=device
        )
    )
    settings = dataclasses.replace(
        probed_as, iterations=options.confirm_iterations, memory_budget_gib=budget.bytes / GIB
    )
    from autotune.trainers.registry import engine_named

    engine_named(settings.engine).check_environment(settings)
    excluded: list[int] = []
    while (chosen := select(study, budget, excluded).chosen) is not None:
        rivals = gain.hand_made_rivals(study.get_trials(deepcopy=False), chosen)
        names = "".join(
            f" and the hand-made '{t.user_attrs[Attr.SEED_CONFIG]}' (#{t.number})" for t in rivals
        )
        console.print(
            f"confirming trial #{chosen.number}{names} with {options.confirm_iterations} iterations, "
            f"{gain.ROUNDS} probes each, in turn ..."
        )
        comparison = gain.compare(
            study,
            chosen,
            rivals,
            run_probe,
            settings,
            confirmed=True,
            on_result=lambda label, result: console.print(
                side_line(label, result), markup=False, highlight=False
            ),
        )
        if comparison is None:
            break
        speeds, peaks = comparison.speeds(chosen.number), comparison.peaks(chosen.number)
        confirmations = dict(study.user_attrs.get(StudyAttr.CONFIRMATIONS, {}))
        confirmations[str(chosen.number)] = {"samples_per_sec": speeds, "peak_memory_bytes": peaks}
        study.set_user_attr(StudyAttr.CONFIRMATIONS, confirmations)
        if min(speeds) > 0 and max(peaks) <= budget.limit:
            console.print(
                f"confirmed: {sum(speeds) / len(speeds):.3f} samples/s at {max(peaks) / GIB:.3f} GiB "
                f"(these figures are the report's from now on)"
            )
            break
        console.print(
            f"trial #{chosen.number} failed its confirmation (samples/s {speeds}, highest peak "
            f"{max(peaks) / GIB:.3f} GiB): trying the next one"
        )
        excluded.append(chosen.number)
    return excluded


def report_study(options: ReportOptions, console: Console | None = None) -> int:
    console = console or Console()
    check_study_name(options.study)
    storage = options.storage or default_storage(options.out, options.study)
    study = load_existing_study(storage, options.study)
    budget = study_plan(study).budget
    if options.memory_budget_gib:
        budget = Budget(int(options.memory_budget_gib * GIB), budget.headroom if budget else DEFAULT_HEADROOM)
    if budget is None:
        raise UserError(f"study {options.study!r} stores no memory budget: pass --memory-budget GIB")
    if options.json:  # stdout carries the summary alone
        console = Console(stderr=True)
    excluded = confirm_winner(study, budget, options, console) if options.confirm else []
    out_dir = options.out / options.study
    result = write_report(study, out_dir, budget, exclude=excluded)
    for line in result.messages:
        console.print(line, markup=False, highlight=False, soft_wrap=True)  # a launch line stays whole
    if options.json:
        print((out_dir / SUMMARY_FILE).read_text(), end="")
    return result.exit_code
