"""An emulated card's wall, on CPU: a rank stops itself where its resident set passes the memory budget.

A device's allocator fails at the allocation that does not fit, so a probe over a card's memory ends there.
On CPU nothing enforces `--memory-budget`, and a probe over it would run all its rounds to be judged after
them. So, once its models are built (`reset_peak`), a rank watches its own peak resident set (VmHWM) every
50 ms from a thread and, past the budget, writes an `oom` result of kind `emulated` and exits with
OOM_EXIT_CODE, as a rank that caught the allocator's error does. What is lost is nothing the study uses: an
OOM's peak counts as at least the budget, and the memory model is calibrated on the probes that fit.

Imported by the probe programs (in the child), never needed by the tuner itself.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from autotune.probe.contract import OOM_EXIT_CODE
from autotune.probe.rank.measure import peak_rss_bytes, rss_peak
from autotune.probe.rank.process import write_result
from autotune.status import Status
from autotune.units import GIB

__all__ = ["WATCH_SECONDS", "over_budget_result", "watch_budget"]

WATCH_SECONDS = 0.05  # the high-water mark misses no transient; this only bounds how late the stop comes


def watch_budget(job: dict[str, Any], rank: int) -> threading.Event | None:
    """Start the watch for a CPU rank whose job has a memory budget; setting the event it returns ends it.
    None where there is nothing to watch: on CUDA the caching allocator enforces the budget (a fraction)."""
    settings = job["settings"]
    budget_gib = settings.get("memory_budget_gib")
    if settings["device"] == "cuda" or not budget_gib:
        return None
    budget_bytes, out_dir, done = int(budget_gib * GIB), Path(job["out"]), threading.Event()
    thread = threading.Thread(
        target=_watch, args=(budget_bytes, rank, out_dir, done), name="autotune-budget-watch", daemon=True
    )
    thread.start()
    return done


def over_budget_result(peak_bytes: int, budget_bytes: int) -> dict[str, Any]:
    return {
        "status": Status.OOM,
        "oom_kind": "emulated",
        "message": (
            f"peak {peak_bytes / GIB:.3f} GiB passed the emulated budget {budget_bytes / GIB:.3f} GiB "
            "(peak RSS watched; the rank stopped there, as an allocator fails)"
        ),
        "peak": rss_peak(peak_bytes),
    }


def _watch(budget_bytes: int, rank: int, out_dir: Path, done: threading.Event) -> None:
    while (peak := peak_rss_bytes()) <= budget_bytes:
        if done.wait(WATCH_SECONDS):
            return
    if done.is_set():  # ended while it read: that peak may be from after the rounds it watches
        return
    result = over_budget_result(peak, budget_bytes)
    write_result(out_dir, rank, result)
    print(f"rank {rank}: out of memory: {result['message']}", file=sys.stderr, flush=True)
    os._exit(OOM_EXIT_CODE)  # at once, from this thread: the step in flight is what would have failed
