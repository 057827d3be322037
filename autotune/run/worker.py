"""`autotune worker`: join a study that `autotune run` started, from this or another machine.

The study's storage (PostgreSQL across machines, a journal file on one node) is the only thing workers
share: Optuna hands out trials, each worker probes on its own GPUs, and `autotune run` stored the space and
probe settings with the study (its `StudyPlan`) so every worker probes the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from autotune.config.job_lengths import JobLengths
from autotune.config.passes import Passes
from autotune.errors import UserError
from autotune.probe.contract import ProbeSettings
from autotune.study.plan import StudyPlan, check_same_job
from autotune.study.storage import check_parallel_safe, is_sqlite, redact

if TYPE_CHECKING:
    from autotune.memory.budget import Budget
    from autotune.memory.calibration import MemoryModel
    from autotune.models.catalog import ModelSpec
    from autotune.run.slots import Slot
    from autotune.run.tuner import Tuner
    from autotune.space.model import SearchSpace

__all__ = ["WorkerOptions", "check_shared_storage", "run_worker", "stored_plan", "worker_settings"]


@dataclass
class WorkerOptions:
    study: str
    storage: str
    gpus: int | None = None
    parallel: int = 1
    device: str = "auto"
    trials: int | None = None
    time_budget_seconds: float | None = None
    out: Path = Path("reports")
    trust_remote_code: bool = False
    verl_python: str | None = None  # this machine's verl environment, for a study probed with --engine verl
    trl_python: str | None = None  # this machine's TRL environment, for a study probed with --engine trl


def check_shared_storage(storage: str, study: str) -> None:
    """A worker always writes beside `autotune run` or another worker, and SQLite locks the whole file per
    write ('database is locked'): say which storage to start the study on instead. (The run's own message,
    "leave --storage out", does not apply: a worker has no default storage to fall back to.)"""
    if is_sqlite(storage):
        raise UserError(
            f"--storage {redact(storage)}: a worker writes to the study beside `autotune run` and other "
            f"workers, and SQLite is not safe for concurrent writers: start the study on a shared storage, "
            f"`autotune run --study {study} --storage journal:PATH` (workers on the same node) or with a "
            f"PostgreSQL URL (workers on other machines), and pass each worker the same --storage"
        )


def stored_plan(study, name: str, storage: str) -> StudyPlan:
    plan = StudyPlan.load(study)
    if plan is None or not plan.space:
        raise UserError(
            f"study {name!r} in {redact(storage)} was not started by `autotune run` (it stores no probe "
            f"plan): start it with `autotune run --storage URL --study {name}` first"
        )
    return plan


def worker_settings(
    plan: StudyPlan, device: str, trust_remote_code: bool, engine_python: str | None = None
) -> ProbeSettings:
    settings = plan.probe_settings(device, trust_remote_code, engine_python)
    plan.engine.check_environment(settings)
    if settings.prompts_file and not Path(settings.prompts_file).is_file():
        raise UserError(
            f"the study's probes read their prompts from {settings.prompts_file} (autotune run --data), "
            f"which this machine lacks: copy it to the same path"
        )
    return settings


def run_worker(options: WorkerOptions, console: Console | None = None) -> int:
    from autotune.models.catalog import resolve_model, resolve_reward_model
    from autotune.probe.devices import device_label, resolve_device
    from autotune.run.identity import machine_identity
    from autotune.run.prepare import check_offload
    from autotune.run.slots import plan_slots
    from autotune.run.tuner import Tuner
    from autotune.search.sampler import SystemSampler
    from autotune.study.outage import PENDING_FILE
    from autotune.study.trials import check_study_name, open_study

    console = console or Console()
    check_study_name(options.study)
    check_shared_storage(options.storage, options.study)
    check_parallel_safe(options.storage, writers=2)  # a worker always shares the study with another
    study = open_study(options.storage, options.study, seed=None, create=False)  # seeds differ per worker
    plan = stored_plan(study, options.study, options.storage)
    space = _joinable_space(plan, options)
    device = resolve_device(options.device, space.gpus)
    check_offload(space, device)
    plan.engine.check_space_knobs(space, device)
    settings = worker_settings(plan, device, options.trust_remote_code, plan.engine.python_from(options))
    actor = resolve_model(space.model, settings.weights, options.trust_remote_code)
    reward = resolve_reward_model(space.reward_model)
    here = machine_identity(actor, reward, device_label(device), space.gpus)  # the study's job, or another?
    check_same_job(study, here, keys=tuple(here))
    budget = _stored_budget(plan, options)
    model = _memory_model(actor, reward, space, settings, device, budget, plan.target)
    slots = plan_slots(options.parallel, space.gpus, device)
    trials = options.trials or int(plan.trials or 0)
    pending = options.out / options.study / PENDING_FILE
    tuner = Tuner(study, space, settings, budget, model, storage_url=options.storage, pending_path=pending)
    study.sampler = SystemSampler(space, model, budget)
    _probe_as_worker(tuner, plan, options, trials, slots, device, console)
    return 0


def _joinable_space(plan: StudyPlan, options: WorkerOptions) -> SearchSpace:
    """The study's space, where this worker can probe it as the study does: on one machine (a worker cannot
    span Ray nodes) and on the study's GPUs per probe (else its samples/sec would not compare)."""
    from autotune.space.loading import space_from_dict

    if plan.nodes > 1:
        raise UserError(
            f"study {options.study!r} measures probes that span {plan.nodes} nodes of a Ray cluster, and a "
            f"worker probes on its own machine: run the study's `autotune run --ray ADDRESS --nodes "
            f"{plan.nodes}` command again instead (its --parallel runs several probes across the cluster)"
        )
    space = space_from_dict(plan.space, source=f"study {options.study}", name=plan.space_name)
    if options.gpus is not None and options.gpus != space.gpus:
        raise UserError(
            f"--gpus {options.gpus}: study {options.study!r} measures probes on {space.gpus} GPU(s) each; "
            f"a worker must use the same, or its samples/sec would not compare (leave --gpus out)"
        )
    return space


def _stored_budget(plan: StudyPlan, options: WorkerOptions) -> Budget:
    """The study's own memory budget: a worker measures against it, never against one of its own."""
    if plan.budget is None:  # `autotune run` stores it with the plan: only a damaged or partial plan lacks it
        raise UserError(
            f"study {options.study!r} in {redact(options.storage)} stores no memory budget: a worker "
            f"measures against the study's own; start the study with `autotune run` first"
        )
    return plan.budget


def _memory_model(
    actor: ModelSpec,
    reward: ModelSpec | None,
    space: SearchSpace,
    settings: ProbeSettings,
    device: str,
    budget: Budget,
    target: str,
) -> MemoryModel:
    """The memory model of the study's job on this machine's device, uncalibrated: the sampler calibrates it
    on the study's measured probes, whichever worker ran them."""
    from autotune.memory.architecture import Architecture
    from autotune.memory.calibration import MemoryModel
    from autotune.run.prepare import rollout_card_bytes
    from autotune.trainers.registry import engine_named, trainer_named

    engine = engine_named(settings.engine)
    return MemoryModel(
        Architecture.from_specs(actor, reward),
        space.gpus,
        device,
        rollout_card_bytes=rollout_card_bytes(engine, device, budget, trainer_named(target)),
        lengths=JobLengths.from_dict(settings.lengths),
        passes=engine.model_passes(Passes(settings.passes)),
    )


def _probe_as_worker(
    tuner: Tuner,
    plan: StudyPlan,
    options: WorkerOptions,
    trials: int,
    slots: list[Slot],
    device: str,
    console: Console,
) -> None:
    """Probe until the study has `trials`, saying so in the same lines as `run`, then how to get the report
    (a worker writes none: the study may still be running elsewhere)."""
    from autotune.files import make_folder
    from autotune.run.live import RUN_LOG, Narrator
    from autotune.run.loop import LiveView, print_summary, probe_study
    from autotune.study.trials import finished_trials, memory_model_error

    study, space = tuner.study, tuner.space
    console.print(
        f"joining study [bold]{options.study}[/bold] in {redact(options.storage)}: "
        f"{len(finished_trials(study))} of {trials} trials complete; {space.model} on {space.gpus} "
        f"{device} rank(s) per probe"
    )
    narrator = Narrator(
        console, make_folder(options.out / options.study) / RUN_LOG
    )  # the same lines as `run`
    view = LiveView(narrator, tuple(plan.tune or ()))
    probe_study(tuner, trials, options.time_budget_seconds, slots, console, view)
    print_summary(tuner, narrator, *memory_model_error(study))
    console.print(
        f"report: autotune report --study {options.study} --storage '{redact(options.storage)}'",
        markup=False,
        highlight=False,
    )
