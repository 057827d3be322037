"""What a person watching a run sees, and what a log keeps: one line per finished trial, the probes running
now, an ETA — on the terminal and in `<out>/<study>/run.log` (plain text with a time stamp per line, so a run
redirected to a file or left overnight can be followed with `tail -f`)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from autotune.config.knobs import ProbeConfig
from autotune.report.lines import short_config

__all__ = ["RUN_LOG", "Narrator", "eta_text", "probing_text"]

RUN_LOG = "run.log"


# The short form of a configuration in trial lines and the report's tables; explained once per run.
def probing_text(running: dict[int, tuple[ProbeConfig, float]], searched_recipe: Sequence[str] = ()) -> str:
    """`probing #8 R64 m4 ... for 35 s`, one per running probe."""
    now = time.monotonic()
    return "; ".join(
        f"probing #{number} {short_config(config, searched_recipe)} for {now - started:.0f} s"
        for number, (config, started) in sorted(running.items())
    )


def eta_text(done_now: int, remaining: int, elapsed: float, past_walls: Sequence[float], slots: int) -> str:
    """Time left at the pace of this run's finished trials, else of the study's earlier probes."""
    if remaining <= 0:
        return ""
    if done_now:
        per_trial = elapsed / done_now
    elif past_walls:
        per_trial = sum(past_walls) / len(past_walls) / max(1, slots)
    else:
        return "ETA after the first trial"
    seconds = per_trial * remaining
    return f"ETA {dt.timedelta(seconds=round(seconds))}"


class Narrator:
    """Prints to the terminal and appends the same line, plain, to the run's log. A log that cannot be
    written (a full disk) is given up with one warning: the study, not the log, holds the measurements."""

    def __init__(self, console: Console, log_path: Path | None = None) -> None:
        self.console = console
        self.log_path = log_path
        self._lock = threading.Lock()

    def say(self, text: str, markup: bool = True, style: str | None = None) -> None:
        self.console.print(text, markup=markup, highlight=False, soft_wrap=True, style=style)
        self.log(Text.from_markup(text).plain if markup else text)

    def log(self, plain: str) -> None:
        if self.log_path is None:
            return
        stamp = dt.datetime.now().astimezone().isoformat(timespec="seconds")
        lines = "".join(f"{stamp} {line}\n" for line in plain.splitlines() or [""])
        with self._lock:
            try:
                with self.log_path.open("a", encoding="utf-8") as log:
                    log.write(lines)
            except OSError as exc:
                path, self.log_path = self.log_path, None
                self.console.print(
                    f"[yellow]cannot write {path} ({exc.strerror or exc}): the run goes on without its log; "
                    f"every measurement is in the study[/yellow]"
                )
