"""The probe loop `autotune run` and `autotune worker` share: P probe slots on one tuner until the trial count
is complete, with Ctrl-C (or SIGTERM) to stop, a live status line, and what an outage or a dead tuner left."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column

from autotune.config.knobs import usable_cores
from autotune.probe.conditions import busy_now
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.report import gain, pick
from autotune.report.lines import short_config, side_line, trial_line
from autotune.report.selection import best_feasible
from autotune.run.live import Narrator, eta_text, probing_text
from autotune.run.slots import Slot, oversubscribed
from autotune.run.tuner import Tuner
from autotune.status import Attr, Status
from autotune.study.coordination import SWEEP_SECONDS, recover_stale_trials
from autotune.study.trials import finished_trials, status_counts, trial_status
from autotune.units import GIB

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any, TypeAlias

    # What signal.signal takes and returns: a function, SIG_DFL / SIG_IGN, or None (not set from Python)
    _SignalHandler: TypeAlias = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

__all__ = [
    "CRASH_STREAK_LIMIT",
    "TIME_SPENT",
    "TRIALS_DONE",
    "LiveView",
    "SlotLoop",
    "StopControl",
    "control_stopped",
    "keep_trying",
    "print_summary",
    "probe_study",
    "progress_line",
    "replay_kept",
    "settle_gain",
    "settle_pick",
    "tune",
]


class StopControl:
    """First Ctrl-C (or SIGTERM, as a scheduler or `kill` sends): finish the running probe, write the report,
    stop. Second: kill the probe now; the study stays resumable.

    Presses are counted from the signal wakeup fd, not from handler calls: Python runs a handler once for
    all the signals that arrived before the main thread woke (up to half a second while it waits on the
    probe slots, measured under load), but writes a byte to the wakeup fd for each one. Two quick presses
    are then two presses, not one."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, console: Console) -> None:
        self.console = console
        self.stop_requested = False
        self.stop_reason = ""
        self.cancel = threading.Event()
        self._previous: dict[int, _SignalHandler] = {}
        self._pipe: tuple[int, int] | None = None
        self._previous_wakeup = -1

    def __enter__(self) -> StopControl:
        self._pipe = os.pipe()
        for end in self._pipe:
            os.set_blocking(end, False)
        self._previous_wakeup = signal.set_wakeup_fd(self._pipe[1], warn_on_full_buffer=False)
        self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._previous_wakeup)
        if self._pipe is not None:
            for end in self._pipe:
                os.close(end)
            self._pipe = None

    def _presses(self) -> int:
        """Stop signals delivered since the last look (at least the one being handled)."""
        delivered = b""
        with contextlib.suppress(OSError):  # BlockingIOError: nothing (more) to read
            while self._pipe is not None and (chunk := os.read(self._pipe[0], 512)):
                delivered += chunk
        return max(1, sum(1 for signum in delivered if signum in self.SIGNALS))

    def _handle(self, signum, frame) -> None:
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        for _ in range(min(2, self._presses())):
            self._press(name)

    def _press(self, name: str) -> None:
        if self.stop_requested:
            self.cancel.set()
            self.console.print(
                f"[red]{name} again: killing the running probe; the study stays resumable[/red]"
            )
            return
        self.stop_requested = True
        self.stop_reason = f"{STOPPED_BY}{name}"
        self.console.print(
            f"[yellow]{name}: finishing the running probe, then stopping ({name} again kills it)[/yellow]"
        )


@dataclass
class LiveView:
    """What a run shows as it goes: the narrator (terminal and run.log), the recipe knobs the study searches
    (they appear in the short form of a configuration), and the pace for the ETA."""

    narrator: Narrator
    searched_recipe: tuple[str, ...] = ()
    trials: int = 0
    slots: int = 1
    started: float = dataclasses.field(default_factory=time.monotonic)
    done_at_start: int = 0
    changed: threading.Event = dataclasses.field(default_factory=threading.Event)  # the status line is stale

    def finished(self, trial) -> None:
        self.changed.set()
        self.narrator.say(trial_line(trial, self.searched_recipe), markup=False)

    def probing(self, number: int, config) -> None:
        self.changed.set()
        line = f"#{number:<3} probing        {short_config(config, self.searched_recipe)}"
        if self.narrator.console.is_terminal:
            self.narrator.log(line)  # the status line shows it on a terminal
        else:
            self.narrator.say(line, markup=False)

    def eta(self, finished: list) -> str:
        walls = [float((t.user_attrs.get(Attr.RESULT) or {}).get("wall_seconds") or 0.0) for t in finished]
        elapsed = time.monotonic() - self.started
        done_now = len(finished) - self.done_at_start
        return eta_text(done_now, self.trials - len(finished), elapsed, [w for w in walls if w], self.slots)


def progress_line(tuner: Tuner, view: LiveView | None = None, finished: list | None = None) -> str:
    """The status line; `finished`: the study's finished trials when the caller has just read them."""
    counts = status_counts(tuner.study)
    shown = " ".join(f"{status}={count}" for status, count in sorted(counts.items()))
    best = best_feasible(tuner.study, tuner.budget)
    best_text = (
        f"best {best.values[0]:.2f} samples/s @ {best.values[1] / GIB:.2f} GiB (#{best.number})"
        if best
        else "no feasible trial yet"
    )
    parts = [shown, best_text]
    if view is not None:
        parts += [
            probing_text(dict(tuner.active), view.searched_recipe),
            view.eta(finished if finished is not None else finished_trials(tuner.study)),
            busy_now(probing=bool(tuner.active)),
        ]
    return " | ".join(part for part in parts if part)


TRIALS_DONE = "trial count reached"  # why a study stopped when it did all it was asked to
TIME_SPENT = "time budget spent"  # --time-budget: a planned end, not an interruption
KILLED = "probe killed by a second Ctrl-C"
STOPPED_BY = "stopped by "  # + the signal's name (StopControl)


def control_stopped(reason: str) -> bool:
    """A person (Ctrl-C) or a scheduler (SIGTERM) stopped the run: it did not end by itself."""
    return reason == KILLED or reason.startswith(STOPPED_BY)


CRASH_STREAK_LIMIT = 5  # probes in a row that crash: something is wrong with the setup, not the configs


@dataclass
class SlotLoop:
    """What the probe slots share: when to stop, why, and the first error one of them hit."""

    tuner: Tuner
    trials: int
    deadline: float | None
    control: StopControl
    view: LiveView | None = None
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
            self.halt(self.control.stop_reason)
        elif self.deadline is not None and time.monotonic() >= self.deadline:
            self.halt(TIME_SPENT)
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
                    if self.view is not None:
                        self.view.finished(trial)
                    continue
                study, retry = self.tuner.study, self.tuner.retry
                if len(retry(functools.partial(finished_trials, study), "counting trials")) >= self.trials:
                    self.halt(TRIALS_DONE)
                    return
                # The quota is taken by running trials (other slots' or workers'): wait; one may fail.
                self.stop.wait(1.0)
                if time.monotonic() - last_sweep > SWEEP_SECONDS:
                    retry(functools.partial(recover_stale_trials, study), "sweeping dead workers' trials")
                    last_sweep = time.monotonic()
        except Exception as exc:  # the storage gave up, most likely: stop the other slots too
            self.halt(f"error in {slot.describe()}", exc)


def progress_columns() -> list[ProgressColumn]:
    """The live line: `trials ━━━  3/12 0:04:10` keeps its width on any terminal; the status after it wraps
    under itself rather than squeezing the count and the elapsed time out at 80 columns."""
    status = TextColumn("{task.description}", table_column=Column(ratio=1, no_wrap=False, overflow="fold"))
    return [
        TextColumn("[bold]trials"),
        BarColumn(bar_width=16),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        status,
    ]


def tune(
    tuner: Tuner,
    trials: int,
    deadline: float | None,
    console: Console,
    slots: list[Slot] | None = None,
    view: LiveView | None = None,
) -> str:
    """Run trials on every slot until `trials` are complete; returns why it stopped (raises the first
    error a slot hit, such as the storage going away for good, once every slot has stopped)."""
    slots = slots or [Slot(0)]
    with (
        StopControl(console) as control,
        Progress(
            *progress_columns(),
            console=console,
            expand=True,
            transient=False,
            disable=not console.is_terminal,  # in a file or a pipe the trial lines say it all, unclipped
        ) as progress,
    ):
        loop = SlotLoop(tuner, trials, deadline, control, view)
        tuner.cancel = control.cancel
        done = len(finished_trials(tuner.study))
        if view is not None:
            view.trials, view.slots, view.done_at_start = trials, len(slots), done
            view.started = time.monotonic()
            tuner.on_probe_start = view.probing
        task = progress.add_task(progress_line(tuner, view), total=trials, completed=done)
        threads = [
            threading.Thread(target=loop.run_slot, args=(slot,), name=f"slot-{slot.index}", daemon=True)
            for slot in slots
        ]
        for thread in threads:
            thread.start()
        read_at = time.monotonic()
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(timeout=0.5 / len(threads))
            if not _line_due(console, view, read_at):
                continue
            read_at = time.monotonic()
            with contextlib.suppress(Exception):  # a storage outage: the slots report it
                finished = finished_trials(tuner.study)  # read once per refresh, for the bar and the ETA
                progress.update(
                    task, completed=len(finished), description=progress_line(tuner, view, finished)
                )
    if loop.error is not None:
        raise loop.error
    if control.cancel.is_set():
        return KILLED
    return loop.reason or TRIALS_DONE


STATUS_LINE_SECONDS = 5.0  # how often the status line reads the study when nothing happened here


def _line_due(console: Console, view: LiveView | None, read_at: float) -> bool:
    """Whether to read the study again for the status line. Reading it costs CPU the probe shares: not at
    all without a terminal (the trial lines say it all), else when a trial here started or finished, or
    every few seconds (trials other workers record, the ETA)."""
    if not console.is_terminal:
        return False
    if view is not None and view.changed.is_set():
        view.changed.clear()
        return True
    return time.monotonic() - read_at >= STATUS_LINE_SECONDS


def probe_study(
    tuner: Tuner,
    trials: int,
    time_budget: float | None,
    slots: list[Slot],
    console: Console,
    view: LiveView | None = None,
) -> str:
    """Recover what dead tuners left, record what an outage kept back, then probe on every slot until
    `trials` are complete (shared by `autotune run` and `autotune worker`)."""
    replay_kept(tuner, console)  # before the sweep: a kept measurement completes its own trial
    recovered = recover_stale_trials(tuner.study)
    if recovered:
        console.print(
            f"recovered trials {recovered} left RUNNING by a tuner that died: marked failed, re-queued"
        )
    if len(slots) > 1:
        console.print(f"{len(slots)} probes at a time: " + "; ".join(slot.describe() for slot in slots))
    if oversubscribed(slots, tuner.space.gpus):
        console.print(
            f"[yellow]{len(slots)} probes × {tuner.space.gpus} ranks exceed the {usable_cores()} cores: "
            f"timings will mostly measure waiting; lower --parallel[/yellow]"
        )
    deadline = time.monotonic() + time_budget if time_budget else None
    started = time.monotonic()
    try:
        reason = tune(tuner, trials, deadline, console, slots, view)
    finally:
        keep_trying(tuner, console)
    stopped = f"stopped: {reason} after {time.monotonic() - started:.0f} s"
    if view is not None:
        view.narrator.say(stopped, markup=False)
    else:
        console.print(stopped)
    return reason


def settle_pick(tuner: Tuner, settings: ProbeSettings, narrator: Narrator) -> int:
    """Re-measure the configurations within the probe noise of the fastest before the report, alternately,
    within a share of the study's probing time (autotune.report.pick); returns the re-probes run. Ctrl-C
    stops it (twice: kills the running re-probe); a storage error ends it with what was kept."""
    study = tuner.study
    rivals = pick.contenders(study, tuner.budget)
    if not rivals:
        return 0
    probed = sum(
        float((t.user_attrs.get(Attr.RESULT) or {}).get("wall_seconds") or 0.0)
        for t in finished_trials(study)
    )
    allowed = probed * pick.TIME_SHARE
    numbers = ", ".join(f"#{t.number}" for t in rivals)
    narrator.say(
        f"re-measuring the {len(rivals)} configurations within {pick.NOISE:.0%} of the fastest ({numbers}), "
        f"one after the other, for at most {allowed:.0f} s ({pick.TIME_SHARE:.0%} of the probing time): "
        f"the pick goes by the mean",
        markup=False,
    )

    def show(trial, result: ProbeResult) -> None:
        narrator.say(
            f"  #{trial.number} again: {result.status} {result.samples_per_sec:.2f} samples/s, "
            f"{result.peak_memory_bytes / GIB:.3f} GiB",
            markup=False,
        )

    with StopControl(narrator.console) as control:
        try:
            return pick.remeasure(
                study,
                rivals,
                tuner.probe,
                settings,
                allowed,
                control.cancel,
                show,
                lambda: control.stop_requested,
            )
        except Exception as exc:  # the storage went away: the pick goes by what was kept
            narrator.say(f"re-measuring stopped: {type(exc).__name__}: {exc}", markup=False, style="yellow")
            return 0


def settle_gain(
    tuner: Tuner, settings: ProbeSettings, narrator: Narrator, rounds: int = gain.ROUNDS
) -> gain.Comparison | None:
    """Probe the recommended configuration and the hand-made ones back to back, alternating, so that the gain
    compares measurements taken in the same conditions; skipped when the study already holds such a
    comparison for this recommendation (a finished study run again)."""
    study = tuner.study
    winner = best_feasible(study, tuner.budget)
    if winner is None:
        return None
    rivals = gain.hand_made_rivals(finished_trials(study), winner)
    if not rivals:
        return None
    kept = gain.comparison_for(study, winner.number)
    if kept is not None and all(str(t.number) in kept.measurements for t in rivals):
        return kept
    if rounds <= 0:
        narrator.say(
            "the gain is not measured back to back (--gain-rounds 0): it rests on first measurements"
        )
        return None
    names = ", ".join(f"'{t.user_attrs[Attr.SEED_CONFIG]}' (#{t.number})" for t in rivals)

    def say(text: str) -> None:
        narrator.say(text, markup=False)

    say(
        f"measuring the gain: the recommended #{winner.number} and the hand-made {names} probed in turn, "
        f"{rounds} times each, in the same conditions"
    )

    def show(label: str, result: ProbeResult) -> None:
        say(side_line(label, result))

    with StopControl(narrator.console) as control:
        try:
            comparison = gain.compare(
                study,
                winner,
                rivals,
                tuner.probe,
                settings,
                cancel=control.cancel,
                rounds=rounds,
                on_result=show,
                should_stop=lambda: control.stop_requested,
            )
        except Exception as exc:  # the storage went away: the gain goes by the first measurements
            say(f"measuring the gain stopped: {type(exc).__name__}: {exc}")
            return None
    if comparison is None:
        say("the gain was not measured back to back (stopped): the report compares the first measurements")
    return comparison


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


def replay_kept(tuner: Tuner, console: Console) -> None:
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


def print_summary(tuner: Tuner, narrator: Narrator, error: float | None, count: int) -> None:
    counts = status_counts(tuner.study)
    narrator.say(
        "trials by status: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())), markup=False
    )
    if error is None:
        narrator.say("memory model: no probe was measured after calibration yet", markup=False)
    else:
        narrator.say(
            f"memory model: median relative error {error:.1%} over {count} probes predicted after "
            "calibration",
            markup=False,
        )
