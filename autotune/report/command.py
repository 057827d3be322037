"""`autotune report`: write the report of a finished or running study, optionally confirming the winner."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import optuna
from rich.console import Console

from autotune.errors import UserError
from autotune.probe.contract import GIB
from autotune.probe.launcher import ProbeSettings, run_probe
from autotune.report.write import budget_from_study, resolve_context, select, write_report
from autotune.search.storage import default_storage_url
from autotune.search.study import Budget, open_study, trial_config


@dataclass
class ReportOptions:
    study: str
    storage: str | None = None
    out: Path = Path("reports")
    memory_budget_gib: float | None = None
    confirm: bool = False
    confirm_iterations: int = 6
    device: str = "auto"


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
    """Re-probe the Pareto-best with more iterations; a failing winner is excluded, the next one tried."""
    from autotune.cli import resolve_device

    ctx = resolve_context(study)
    settings = ProbeSettings(
        model=ctx.model,
        reward_model=ctx.reward_model,
        world_size=ctx.gpus,
        device=resolve_device(options.device, ctx.gpus),
        iterations=options.confirm_iterations,
        memory_budget_gib=budget.bytes / GIB,
    )
    excluded: list[int] = []
    while (chosen := select(study, budget, excluded).chosen) is not None:
        console.print(f"confirming trial #{chosen.number} with {options.confirm_iterations} iterations ...")
        result = run_probe(trial_config(chosen), settings)
        confirmations = dict(study.user_attrs.get("confirmations", {}))
        confirmations[str(chosen.number)] = {
            "status": result.status,
            "samples_per_sec": result.samples_per_sec,
            "peak_memory_bytes": result.peak_memory_bytes,
        }
        study.set_user_attr("confirmations", confirmations)
        if result.status == "ok" and result.peak_memory_bytes <= budget.limit:
            console.print(
                f"confirmed: {result.samples_per_sec:.3f} samples/s at {result.peak_memory_gib:.3f} GiB"
            )
            break
        console.print(
            f"trial #{chosen.number} failed its confirmation ({result.status}, "
            f"{result.peak_memory_gib:.3f} GiB): trying the next one"
        )
        excluded.append(chosen.number)
    return excluded


def report_study(options: ReportOptions, console: Console | None = None) -> int:
    console = console or Console()
    storage = options.storage or default_storage(options.out, options.study)
    study = load_existing_study(storage, options.study)
    budget = budget_from_study(study)
    if options.memory_budget_gib:
        budget = Budget(int(options.memory_budget_gib * GIB), budget.headroom if budget else 0.10)
    if budget is None:
        raise UserError(f"study {options.study!r} stores no memory budget: pass --memory-budget GIB")
    excluded = confirm_winner(study, budget, options, console) if options.confirm else []
    result = write_report(study, options.out / options.study, budget, exclude=excluded)
    for line in result.messages:
        console.print(line, markup=False, highlight=False)
    return result.exit_code
