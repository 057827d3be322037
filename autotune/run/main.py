"""`autotune run`: open (or resume) a study over a search space and probe until the trial count is reached."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from autotune.files import hold_lock, make_folder
from autotune.memory.budget import Budget
from autotune.report.lines import LEGEND, VERL_LEGEND
from autotune.report.tables import recipe_lines
from autotune.run.job_data import data_prompts_file
from autotune.run.live import RUN_LOG, Narrator
from autotune.run.loop import (
    TIME_SPENT,
    TRIALS_DONE,
    LiveView,
    control_stopped,
    print_summary,
    probe_study,
    settle_gain,
    settle_pick,
)
from autotune.run.prepare import Prepared, RunOptions, default_study_name, prepare
from autotune.run.slots import plan_slots
from autotune.run.tuner import Tuner
from autotune.search.sampler import SystemSampler
from autotune.space.model import SearchSpace, misfits
from autotune.status import StudyAttr
from autotune.study.outage import PENDING_FILE
from autotune.study.plan import StudyPlan, check_same_job
from autotune.study.storage import (
    check_parallel_safe,
    default_storage_url,
    file_guard,
    redact,
    sqlite_path,
)
from autotune.study.trials import (
    check_study_name,
    enqueue_seed_configs,
    finished_trials,
    memory_model_error,
    open_study,
)
from autotune.units import GIB

if TYPE_CHECKING:
    import optuna

    from autotune.probe.contract import ProbeSettings
    from autotune.run.from_file import JobFile

__all__ = ["EXIT_INTERRUPTED", "finish", "run_study", "start_message", "unfit_seed_lines"]


def start_message(study_name: str, storage: str, budget: Budget, resumed: int) -> str:
    verb = f"resuming ({resumed} trials done)" if resumed else "starting"
    return (
        f"{verb} study [bold]{study_name}[/bold] in {redact(storage)}; budget {budget.bytes / GIB:.2f} GiB "
        f"per rank, feasible ≤ {budget.limit / GIB:.2f} GiB ({budget.headroom:.0%} headroom)"
    )


EXIT_INTERRUPTED = 130  # stopped by Ctrl-C or SIGTERM: the report holds what was measured; re-running resumes


def run_study(options: RunOptions, console: Console | None = None) -> int:
    """`autotune run`: on this machine, or on the Ray cluster of --ray (joined for the whole run)."""
    from autotune.probe.cluster.connect import check_flags, on_cluster
    from autotune.trainers.registry import check_cluster_use

    check_flags(options.ray, options.nodes)
    check_cluster_use(options.ray, options.nodes, options.probe_engine, options.trainer)
    with on_cluster(options.ray) as cluster:
        return _run_study(options, console or Console(stderr=options.json), cluster)


def _run_study(options: RunOptions, console: Console, cluster: Any) -> int:
    """with --json, stdout carries the summary alone (`console` writes to stderr)"""
    job_file = None
    if options.from_file is not None:
        from autotune.run.from_file import read_job_file

        job_file = read_job_file(options.from_file, options.call)
        options = dataclasses.replace(options, target=job_file.trainer.name)
    job = prepare(options, console, cluster, job_file)
    space = job.space
    if options.study:
        study_name = check_study_name(options.study)
    else:
        study_name = default_study_name(space.name, space.model, space.gpus, job.fingerprint)
    out_dir = make_folder(options.out / study_name)
    settings = _with_data_prompts(job, out_dir)
    storage = options.storage or default_storage_url(out_dir, options.parallel)
    check_parallel_safe(storage, options.parallel, by_default=options.storage is None)
    slots = plan_slots(options.parallel, space.gpus, settings.device, cluster=cluster is not None)
    with one_tuner_per_sqlite_study(storage, study_name):
        study = open_study(storage, study_name, options.seed)
        check_same_job(study, job.identity)
        plan = _saved_plan(study, options, job, settings)
        narrator = Narrator(console, out_dir / RUN_LOG)
        done_before = len(finished_trials(study))
        narrator.say(start_message(study_name, storage, job.budget, done_before))
        _enqueue_and_announce(study, plan, options, space, narrator)
        pending = out_dir / PENDING_FILE
        tuner = Tuner(
            study, space, settings, job.budget, job.memory_model, storage_url=storage, pending_path=pending
        )
        tuner.guard = file_guard(storage)
        study.sampler = SystemSampler(space, job.memory_model, job.budget, seed=options.seed)
        view = LiveView(narrator, tuple(plan.tune or ()))
        reason = probe_study(tuner, options.trials, options.time_budget_seconds, slots, console, view)
        if reason == TRIALS_DONE:
            settle_pick(tuner, slots[0].apply(settings), narrator)
            settle_gain(tuner, slots[0].apply(settings), narrator, options.gain_rounds)
        print_summary(tuner, narrator, *memory_model_error(study))
        run = _run_record(reason, len(finished_trials(study)), options.trials, done_before)
        after = _hand_back_after(job_file, job, narrator) if job_file is not None else None
        return finish(tuner, plan, out_dir, narrator, run, options.json, after)


def _with_data_prompts(job: Prepared, out_dir: Path) -> ProbeSettings:
    """The probe settings, reading the data's own prompts from a file in the study's folder when `--data`
    gave prompts: every probe, and every worker that joins, then draws the same ones."""
    if job.lengths is None or not job.lengths.prompt_texts:
        return job.settings
    prompts = data_prompts_file(job.lengths, out_dir).resolve()
    return dataclasses.replace(job.settings, prompts_file=str(prompts))


def _saved_plan(
    study: optuna.Study, options: RunOptions, job: Prepared, settings: ProbeSettings
) -> StudyPlan:
    """The run's plan, stored with the study: `autotune worker` and `autotune report` read it from there."""
    export = {
        "rollout_engine": options.rollout_engine,
        "target": options.target,
        "model_parameters": job.memory_model.arch.actor_parameters,
        "attention_heads": job.memory_model.arch.heads,
        "generation_share": job.generation_share,
    }
    plan = StudyPlan.of(job.space, settings, job.budget, options.trials, job.identity, **export)
    plan.save(study)
    return plan


def _enqueue_and_announce(
    study: optuna.Study, plan: StudyPlan, options: RunOptions, space: SearchSpace, narrator: Narrator
) -> None:
    """Say the recipe the study holds, enqueue the hand-made configs first (the gain's baselines) and say
    which could not be, then the legend of the trial lines that follow."""
    for line in recipe_lines(plan):
        narrator.say(line, markup=False)
    fresh = not study.user_attrs.get(StudyAttr.SEEDED)
    seeded = enqueue_seed_configs(study, space)
    if seeded:
        narrator.say(f"enqueued the hand-made configs first: {', '.join(seeded)}", markup=False)
    for line in unfit_seed_lines(space, seeded) if fresh else []:
        narrator.say(line, markup=False)
    verl_knobs = options.probe_engine.runs_rollout or bool(space.verl_knobs)
    narrator.say(LEGEND + (VERL_LEGEND if verl_knobs else ""), markup=False)


def _run_record(reason: str, trials_done: int, trials_asked: int, trials_before: int) -> dict[str, Any]:
    """How the run ended, for the summary: why it stopped, and the trials it found, asked for and left."""
    return {
        "stopped": reason,
        "trials_done": trials_done,
        "trials_asked": trials_asked,
        "trials_before": trials_before,
        "complete": reason in (TRIALS_DONE, TIME_SPENT),
        "interrupted": control_stopped(reason),
    }


def _hand_back_after(job_file: JobFile, job: Prepared, narrator: Narrator) -> Callable[[Any], None]:
    """For --from: once the report is written, hand the user's file back tuned beside it."""
    from autotune.run.tuned import hand_back

    def after(result: Any) -> None:
        hand_back(job_file, job.from_file, job.space, result, narrator)

    return after


def unfit_seed_lines(space: SearchSpace, seeded: list[str]) -> list[str]:
    """Why each hand-made config of the space was not enqueued (the space cannot produce it)."""
    lines = [f"hand-made config {name!r} is not enqueued: {why}" for name, why in space.unfit_seeds]
    for seed in space.seed_configs:
        if seed.name not in seeded:
            lines.append(
                f"hand-made config {seed.name!r} is not enqueued: {'; '.join(misfits(space, seed.config))}"
            )
    return lines


def one_tuner_per_sqlite_study(storage: str, study_name: str) -> contextlib.AbstractContextManager:
    """SQLite takes one writer: a second `autotune run` of the same study would share the cores and each
    other's timings. It is refused while the first lives (journal and database storages coordinate several
    tuners through the study itself: `autotune worker`)."""
    database = sqlite_path(storage)
    if database is None:
        return contextlib.nullcontext()
    return hold_lock(
        database.with_name(database.name + ".lock"),
        f"study {study_name!r} ({redact(storage)}) is being tuned by another `autotune run`; wait for it to "
        f"finish, or share the study from the start with --parallel or a journal/PostgreSQL --storage and "
        f"`autotune worker`",
    )


def finish(
    tuner: Tuner,
    plan: StudyPlan,
    out_dir: Path,
    narrator: Narrator,
    run: dict,
    as_json: bool = False,
    after: Callable[[Any], None] | None = None,
) -> int:
    """Write the report (the same code as `autotune report`) and say what it holds; an interrupted run
    says how to resume and exits EXIT_INTERRUPTED. `after(result)` adds to the written report (--from's
    tuned file) before the summary is printed."""
    from autotune.report.write import SUMMARY_FILE, write_report

    result = write_report(tuner.study, out_dir, tuner.budget, plan=plan, run=run)
    for line in result.messages:
        narrator.say(line, markup=False)  # soft-wrapped: a launch line stays whole
    if after is not None:
        after(result)
    if not run["complete"]:
        narrator.say(
            f"[yellow]{run['stopped']}: {run['trials_done']} of {run['trials_asked']} trials are done; run "
            f"the same command again to resume (nothing measured is lost)[/yellow]"
        )
    if as_json:
        print((out_dir / SUMMARY_FILE).read_text(), end="")
    return EXIT_INTERRUPTED if run["interrupted"] else result.exit_code
