"""`autotune run`: open (or resume) a study over a search space and probe until the trial count is reached."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from autotune.config.knobs import ProbeConfig
from autotune.config.numbers import MAX_SECONDS, parse_float
from autotune.errors import UserError
from autotune.files import make_folder
from autotune.probe.contract import ProbeSettings
from autotune.report.selection import best_feasible
from autotune.search.coordination import SWEEP_SECONDS, recover_stale_trials
from autotune.search.outage import PENDING_FILE
from autotune.search.plan import StudyPlan
from autotune.search.slots import Slot, oversubscribed, plan_slots
from autotune.search.storage import check_parallel_safe, default_storage_url, redact
from autotune.search.study import (
    Budget,
    enqueue_seed_configs,
    finished_trials,
    open_study,
    status_counts,
    trial_status,
)
from autotune.search.tuner import Tuner
from autotune.status import Attr, Status
from autotune.units import GIB

__all__ = [
    "RunOptions",
    "SlotLoop",
    "StopControl",
    "data_prompts_file",
    "default_study_name",
    "finish",
    "fit_space_to_data",
    "length_knob_at_least",
    "parse_duration",
    "prepare",
    "print_summary",
    "probe_settings",
    "probe_study",
    "progress_line",
    "resolve_budget_gib",
    "run_study",
    "start_message",
    "tune",
]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'8h', '90m', '1h30m', '45s' or plain seconds; positive, finite, at most a month."""
    stripped = text.strip().lower()
    if re.fullmatch(r"[\d.e+-]+|nan|inf|infinity", stripped):
        return parse_float(stripped, "--time-budget", maximum=MAX_SECONDS)
    parts = _DURATION.findall(stripped)
    if not parts or _DURATION.sub("", stripped).strip():
        raise UserError(f"--time-budget {text!r}: expected a duration such as 8h, 90m, 1h30m or 45s")
    seconds = sum(float(value) * _UNIT_SECONDS[unit] for value, unit in parts)
    if not 0 < seconds <= MAX_SECONDS:
        raise UserError(f"--time-budget {text!r}: must be more than 0 s and at most 30 days")
    return seconds


@dataclass
class RunOptions:
    space: str = "default"
    model: str | None = None
    reward_model: str | None = None
    weights: str = "random"
    gpus: int | None = None
    device: str = "auto"
    trials: int = 20
    timeout_per_probe: float | None = None
    memory_budget_gib: float | None = None
    time_budget_seconds: float | None = None
    storage: str | None = None
    study: str | None = None
    out: Path = Path("reports")
    seed: int = 0
    trust_remote_code: bool = False
    parallel: int = 1
    data: Path | None = None
    prompt_key: str | None = None
    response_key: str | None = None


def default_study_name(space_name: str, model: str, gpus: int) -> str:
    raw = f"{space_name}-{Path(model).name or model}-{gpus}gpu"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw).strip("-")


class StopControl:
    """First Ctrl-C: finish the running probe, then stop. Second: kill the probe now."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.stop_requested = False
        self.cancel = threading.Event()
        self._previous = None

    def __enter__(self) -> StopControl:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum, frame) -> None:
        if self.stop_requested:
            self.cancel.set()
            self.console.print(
                "[red]second Ctrl-C: killing the running probe; the study stays resumable[/red]"
            )
            return
        self.stop_requested = True
        self.console.print(
            "[yellow]Ctrl-C: finishing the running probe, then stopping (Ctrl-C again to kill it)[/yellow]"
        )


def progress_line(tuner: Tuner) -> str:
    counts = status_counts(tuner.study)
    shown = " ".join(f"{status}={count}" for status, count in sorted(counts.items()))
    best = best_feasible(tuner.study, tuner.budget)
    best_text = (
        f"best {best.values[0]:.2f} samples/s @ {best.values[1] / GIB:.2f} GiB (#{best.number})"
        if best
        else "no feasible trial yet"
    )
    return f"{shown} | {best_text}"


CRASH_STREAK_LIMIT = 5  # probes in a row that crash: something is wrong with the setup, not the configs


@dataclass
class SlotLoop:
    """What the probe slots share: when to stop, why, and the first error one of them hit."""

    tuner: Tuner
    trials: int
    deadline: float | None
    control: StopControl
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    reason: str = ""
    error: BaseException | None = None
    crash_streak: int = 0
    last_crash: str = ""
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def halt(self, reason: str, error: BaseException | None = None) -> None:
        with self._lock:
            if not self.reason:
                self.reason, self.error = reason, error
            self.stop.set()

    def should_stop(self) -> bool:
        if self.control.stop_requested:
            self.halt("stopped by Ctrl-C")
        elif self.deadline is not None and time.monotonic() >= self.deadline:
            self.halt("time budget spent")
        return self.stop.is_set()

    def note(self, trial) -> None:
        """Count crashes in a row across slots; stop the study when they say the setup is broken."""
        with self._lock:
            if trial_status(trial) != Status.CRASHED:
                self.crash_streak = 0
                return
            self.crash_streak += 1
            message = (trial.user_attrs.get(Attr.RESULT) or {}).get("message", "")
            self.last_crash = f"trial #{trial.number}: {message}".strip(": ")
        if self.crash_streak >= CRASH_STREAK_LIMIT:
            self.halt(
                f"{self.crash_streak} probes in a row crashed (last {self.last_crash}); see the stderr "
                f"tails in trials.csv"
            )

    def run_slot(self, slot: Slot) -> None:
        settings = slot.apply(self.tuner.settings)
        last_sweep = time.monotonic()
        try:
            while not self.should_stop():
                trial = self.tuner.step(cancel=self.control.cancel, settings=settings, quota=self.trials)
                if trial is not None:
                    self.note(trial)
                    continue
                study, retry = self.tuner.study, self.tuner.retry
                if len(retry(functools.partial(finished_trials, study), "counting trials")) >= self.trials:
                    self.halt("trial count reached")
                    return
                # The quota is taken by running trials (other slots' or workers'): wait; one may fail.
                self.stop.wait(1.0)
                if time.monotonic() - last_sweep > SWEEP_SECONDS:
                    retry(functools.partial(recover_stale_trials, study), "sweeping dead workers' trials")
                    last_sweep = time.monotonic()
        except Exception as exc:  # the storage gave up, most likely: stop the other slots too
            self.halt(f"error in {slot.describe()}", exc)


def tune(
    tuner: Tuner, trials: int, deadline: float | None, console: Console, slots: list[Slot] | None = None
) -> str:
    """Run trials on every slot until `trials` are complete; returns why it stopped (raises the first
    error a slot hit, such as the storage going away for good, once every slot has stopped)."""
    slots = slots or [Slot(0)]
    with (
        StopControl(console) as control,
        Progress(
            TextColumn("[bold]trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=console,
            transient=False,
        ) as progress,
    ):
        loop = SlotLoop(tuner, trials, deadline, control)
        tuner.cancel = control.cancel
        task = progress.add_task(
            progress_line(tuner), total=trials, completed=len(finished_trials(tuner.study))
        )
        threads = [
            threading.Thread(target=loop.run_slot, args=(slot,), name=f"slot-{slot.index}", daemon=True)
            for slot in slots
        ]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(timeout=0.5 / len(threads))
            with contextlib.suppress(Exception):  # a storage outage: the slots report it
                progress.update(
                    task, completed=len(finished_trials(tuner.study)), description=progress_line(tuner)
                )
    if loop.error is not None:
        raise loop.error
    if control.cancel.is_set():
        return "probe killed by a second Ctrl-C"
    return loop.reason or "trial count reached"


def start_message(options: RunOptions, study_name: str, storage: str, budget: Budget, resumed: int) -> str:
    verb = f"resuming ({resumed} trials done)" if resumed else "starting"
    return (
        f"{verb} study [bold]{study_name}[/bold] in {redact(storage)}; budget {budget.bytes / GIB:.2f} GiB "
        f"per rank, feasible ≤ {budget.limit / GIB:.2f} GiB ({budget.headroom:.0%} headroom)"
    )


def probe_settings(space, options: RunOptions, device: str) -> ProbeSettings:
    return ProbeSettings(
        model=space.model,
        reward_model=space.reward_model,
        weights=options.weights,
        device=device,
        world_size=space.gpus,
        warmup_iterations=space.probe.warmup,
        iterations=space.probe.iterations,
        timeout_seconds=options.timeout_per_probe or space.probe.timeout_seconds,
        memory_budget_gib=None,
        seed=options.seed,
        trust_remote_code=options.trust_remote_code,
    )


def resolve_budget_gib(space, options: RunOptions, device: str) -> float:
    """--memory-budget, else the space's, else the device's memory per rank."""
    if options.memory_budget_gib:
        return options.memory_budget_gib
    if space.memory_budget_gib:
        return space.memory_budget_gib
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory / GIB
    import psutil

    return psutil.virtual_memory().total / GIB / space.gpus


def prepare(options: RunOptions, console: Console):
    """Everything checked before the first probe: space, model, budget, storage, study."""
    from autotune.config.rules import position_findings, raise_for
    from autotune.memory.model import Architecture, MemoryModel
    from autotune.models.registry import resolve_model, resolve_reward_model
    from autotune.probe.devices import resolve_device
    from autotune.search.space import load_space

    space = load_space(options.space)
    changes = {
        key: value
        for key, value in (
            ("model", options.model),
            ("gpus", options.gpus),
            ("reward_model", options.reward_model),
        )
        if value is not None
    }
    if changes:
        space = space.with_settings(**changes)
    lengths = None
    if options.data is not None:
        from autotune.data.lengths import measure_lengths

        lengths = measure_lengths(options.data, space.model, options.prompt_key, options.response_key)
        space, notes = fit_space_to_data(space, lengths)
        for note in notes:
            console.print(f"--data {options.data}: {note}")
    device = resolve_device(options.device, space.gpus)
    actor = resolve_model(space.model, options.weights, options.trust_remote_code)
    reward = resolve_reward_model(space.reward_model)
    budget_gib = resolve_budget_gib(space, options, device)
    budget = Budget(int(budget_gib * GIB), space.headroom)
    model = MemoryModel(Architecture.from_specs(actor, reward), space.gpus, device)
    longest = ProbeConfig(
        **space.fixed_fields,
        max_prompt_length=max(space.knob("max_prompt_length").values()),
        max_response_length=max(space.knob("max_response_length").values()),
    )
    raise_for(position_findings(longest, actor))
    floor = model.minimum_bytes(ProbeConfig(**space.fixed_fields))
    if floor > budget.limit:
        raise UserError(
            f"--memory-budget {budget_gib:g} GiB: {space.model}'s weights, gradients and optimizer "
            f"state alone need about {floor / GIB:.1f} GiB per rank (budget less "
            f"{space.headroom:.0%} headroom is {budget.limit / GIB:.1f} GiB); use LoRA, more memory "
            f"or a smaller model"
        )
    settings = probe_settings(space, options, device)
    settings = dataclasses.replace(settings, memory_budget_gib=budget_gib)
    return space, settings, budget, model, lengths


def run_study(options: RunOptions, console: Console | None = None) -> int:
    from autotune.search.study import memory_model_error

    console = console or Console()
    space, settings, budget, model, lengths = prepare(options, console)
    study_name = options.study or default_study_name(space.name, space.model, space.gpus)
    out_dir = make_folder(options.out / study_name)
    if lengths is not None and lengths.prompt_texts:
        prompts = data_prompts_file(lengths, out_dir).resolve()
        settings = dataclasses.replace(settings, prompts_file=str(prompts))
    storage = options.storage or default_storage_url(out_dir, options.parallel)
    check_parallel_safe(storage, options.parallel, by_default=options.storage is None)
    slots = plan_slots(options.parallel, space.gpus, settings.device)
    study = open_study(storage, study_name, options.seed)
    plan = StudyPlan.of(space, settings, budget, options.trials)
    plan.save(study)
    console.print(start_message(options, study_name, storage, budget, len(finished_trials(study))))
    seeded = enqueue_seed_configs(study, space)
    if seeded:
        console.print(f"enqueued the hand-made configs first: {', '.join(seeded)}")
    tuner = Tuner(
        study, space, settings, budget, model, storage_url=storage, pending_path=out_dir / PENDING_FILE
    )
    probe_study(tuner, options.trials, options.time_budget_seconds, slots, console)
    error, count = memory_model_error(study)
    print_summary(tuner, console, error, count)
    return finish(tuner, plan, out_dir, console)


def probe_study(
    tuner: Tuner, trials: int, time_budget: float | None, slots: list[Slot], console: Console
) -> str:
    """Recover what dead tuners left, record what an outage kept back, then probe on every slot until
    `trials` are complete (shared by `autotune run` and `autotune worker`)."""
    replay_pending(tuner, console)  # before the sweep: a kept measurement completes its own trial
    recovered = recover_stale_trials(tuner.study)
    if recovered:
        console.print(
            f"recovered trials {recovered} left RUNNING by a tuner that died: marked failed, re-queued"
        )
    if len(slots) > 1:
        console.print(f"{len(slots)} probes at a time: " + "; ".join(slot.describe() for slot in slots))
    if oversubscribed(slots, tuner.space.gpus):
        console.print(
            f"[yellow]{len(slots)} probes × {tuner.space.gpus} ranks exceed the {os.cpu_count()} cores: "
            f"timings will mostly measure waiting; lower --parallel[/yellow]"
        )
    deadline = time.monotonic() + time_budget if time_budget else None
    started = time.monotonic()
    try:
        reason = tune(tuner, trials, deadline, console, slots)
    finally:
        keep_trying(tuner, console)
    console.print(f"stopped: {reason} after {time.monotonic() - started:.0f} s")
    return reason


def keep_trying(tuner: Tuner, console: Console, every: float = 5.0) -> None:
    """Measurements no file could take yet (a full disk): retry while this process lives, up to the storage
    patience, so that freeing some space keeps them; Ctrl-C gives up (they were printed)."""
    pending = tuner.pending
    if not pending.unwritten or pending.flush():
        return
    console.print(
        f"[yellow]{len(pending.unwritten)} measurement(s) could not be written to {pending.path}: free some "
        f"space; retrying every {every:g} s for {tuner.patience:.0f} s (Ctrl-C gives up)[/yellow]"
    )
    deadline = time.monotonic() + tuner.patience
    while time.monotonic() < deadline and not (tuner.cancel is not None and tuner.cancel.is_set()):
        time.sleep(every)
        if pending.flush():
            console.print(f"the measurements kept in memory are now in {pending.path}")
            return


def replay_pending(tuner: Tuner, console: Console) -> None:
    """Record what an earlier run kept in the pending file; put aside what cannot be read, and say so."""
    if tuner.pending.path is None:
        return
    replay = tuner.replay_pending()
    if replay.trials:
        console.print(f"recorded the measurements kept while the storage was away (trials {replay.trials})")
    if replay.damaged:
        console.print(
            f"[yellow]{replay.damaged_lines} line(s) of {tuner.pending.path} could not be read: kept aside "
            f"in {replay.damaged}, not recorded[/yellow]"
        )


def print_summary(tuner: Tuner, console: Console, error: float | None, count: int) -> None:
    counts = status_counts(tuner.study)
    console.print("trials by status: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    if error is None:
        console.print("memory model: no probe was measured after calibration yet")
    else:
        console.print(
            f"memory model: median relative error {error:.1%} over {count} probes predicted after calibration"
        )


def finish(tuner: Tuner, plan: StudyPlan, out_dir: Path, console: Console) -> int:
    """Print the best configuration and write the report (the same code as `autotune report`)."""
    from autotune.report.console import print_best
    from autotune.report.write import write_report

    print_best(best_feasible(tuner.study, tuner.budget), tuner.budget, console)
    result = write_report(tuner.study, out_dir, tuner.budget, plan=plan)
    for line in result.messages:
        console.print(line, markup=False, highlight=False)
    return result.exit_code


def length_knob_at_least(space, name: str, minimum: int) -> Any:
    """The knob's YAML value with every length below `minimum` dropped and `minimum` itself offered.

    A fixed length becomes the data's suggestion; a range keeps its values at or above it, plus it.
    """
    spec = space.knob(name)
    if spec.kind == "fixed":
        return minimum
    kept = sorted({value for value in spec.values() if value > minimum} | {minimum})
    return kept[0] if len(kept) == 1 else {"choices": kept}


def fit_space_to_data(space, report) -> tuple[Any, list[str]]:
    """Bound the length knobs below by the data's suggestions (p95 prompts, p90 responses)."""
    from autotune.search.space import space_from_dict

    limits = {
        "max_prompt_length": report.suggested_prompt_length,
        "max_response_length": report.suggested_response_length,
    }
    data = copy.deepcopy(dict(space.raw))
    notes = []
    for name, minimum in limits.items():
        if minimum is None:
            notes.append(f"{name}: the data has no responses; the space's values are kept")
            continue
        data["knobs"][name] = length_knob_at_least(space, name, minimum)
        notes.append(f"{name} >= {minimum} (the data's suggestion): {data['knobs'][name]}")
    return space_from_dict(data, source=space.source, cores=space.cores, name=space.name), notes


def data_prompts_file(report, out_dir: Path, limit: int = 10_000) -> Path:
    """The data's prompt texts (templated when chat), for the probe's DataLoader to tokenize."""
    path = out_dir / "data_prompts.json"
    path.write_text(json.dumps(report.prompt_texts[:limit]))
    return path
