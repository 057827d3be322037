"""When there is no gain to give: a hand-made config that did not run through gets a line that says why and
what would measure it, in the terminal, report.md/html and summary.json, never a silent gap or a 0.

    no_gain_line(gain, timeout_seconds=300)
    # "no gain measured: the hand-made config 'verl defaults' (#0) timed out at 600 s (the load average
    #  reached 8.9 on 2 cores ...); to measure it, start a new study with --timeout-per-probe 1200 ..."
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.probe.conditions import disturbance
from autotune.status import Attr, Status
from autotune.study.trials import trial_environment, trial_status
from autotune.units import gib

if TYPE_CHECKING:
    from autotune.report.data import Gain

__all__ = ["no_gain_line"]

MEMORY = (Status.OOM, Status.INFERRED_OOM, Status.PREDICTED_OOM)


def no_gain_line(gain: Gain, timeout_seconds: float | None) -> str | None:
    """Why `gain` has no ratio and what would measure it; None when it has one (or its config ran ok)."""
    if gain.ratio is not None or gain.verl is not None:
        return None
    trial = gain.trial
    status, attrs = trial_status(trial), trial.user_attrs
    named = f"the hand-made config '{gain.name}' (#{trial.number})"
    if status in MEMORY:
        peak = f" (at least {gib(trial.values[1])} GiB)" if trial.values and trial.values[1] else ""
        return f"no speed gain to give over {named}: it ran out of memory{peak}; the recommended one runs."
    if status == Status.TIMEOUT:
        first = attrs.get(Attr.FIRST_TRY)
        limit = first["second_timeout_seconds"] if first else timeout_seconds
        busy = disturbance(trial_environment(trial)) or (first or {}).get("busy", "")
        at = f" at {limit:.0f} s" if limit else ""
        more = f"--timeout-per-probe {2 * limit:.0f}" if limit else "a larger --timeout-per-probe"
        return (
            f"no gain measured: {named} timed out{at}{f' ({busy})' if busy else ''}; to measure it, start a "
            f"new study (another --out) with {more}, on a quieter machine if you can."
        )
    if status == Status.OK:
        return None
    message = str((attrs.get(Attr.RESULT) or {}).get("message") or "").strip().splitlines()
    why = f" ({message[0][:160]})" if message else ""
    return (
        f"no gain measured: {named} ended {status}{why}; its error is in report.md's trials table: fix it, "
        "then start a new study."
    )
