"""How the parent decides a finished probe's status from exit codes, per-rank results and the clock.

The child never decides its own fate alone: a rank may write `oom` (it caught the allocator's exception type,
not a string), but timeouts, signals, missing results and emulated budgets are judged here, by the parent.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

from autotune.status import Status
from autotune.units import GIB

__all__ = ["classify", "describe_exit", "over_emulated_budget"]


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def classify(
    exit_codes: list[int | None],
    rank_results: list[dict[str, Any] | None],
    timed_out: bool,
    peak_bytes: int,
    budget_bytes: int | None,
    device: str,
    gone: Mapping[int, str] | None = None,
) -> tuple[str, str | None, str]:
    """Decide (status, oom_kind, message) for a finished probe. Pure, so it is tested on its own.

    Order matters: a rank that caught a real OOM explains the others' hang or crash, so it wins over
    `timeout`; so does a rank whose host went away with it (`gone`: rank -> why, on a Ray cluster: its node
    was lost, or its Ray worker died); a timeout wins over exit codes (we killed the processes ourselves).
    """
    for result in rank_results:
        if result and result.get("status") == Status.OOM:
            kind = result.get("oom_kind", "cuda" if device == "cuda" else "host")
            return Status.OOM, kind, result.get("message", "out of memory")
    for rank, why in sorted((gone or {}).items()):
        return Status.CRASHED, None, f"rank {rank}: {why}"
    if timed_out:
        return Status.TIMEOUT, None, "probe exceeded its wall-clock timeout; the process group was killed"
    for rank, code in enumerate(exit_codes):
        if code != 0:
            return Status.CRASHED, None, f"rank {rank}: {describe_exit(code)}"
    for rank, result in enumerate(rank_results):
        if not result or result.get("status") != Status.OK:
            return Status.CRASHED, None, f"rank {rank}: exited 0 without a readable result"
    return over_emulated_budget(peak_bytes, budget_bytes, device) or (Status.OK, None, "")


def over_emulated_budget(
    peak_bytes: int, budget_bytes: int | None, device: str
) -> tuple[str, str | None, str] | None:
    """An `oom` ("emulated") verdict for a run that finished with a peak above the budget off CUDA, else None.
    On CUDA the budget is enforced by the allocator (a per-process memory fraction): only a real OOM counts
    there. On CPU nothing enforces it (the built-in ranks' watch stops them past it, but can miss the last
    moments; a trainer's own run has no watch), so the peak is compared here."""
    if budget_bytes is None or peak_bytes <= budget_bytes or device == "cuda":
        return None
    message = (
        f"peak {peak_bytes / GIB:.3f} GiB is above the emulated budget {budget_bytes / GIB:.3f} GiB "
        "(peak RSS compared after the rounds; no allocator enforced it)"
    )
    return Status.OOM, "emulated", message
