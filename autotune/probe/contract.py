"""What a probe reports, and how the parent decides its status from exit codes and per-rank results.

The child never decides its own fate alone: a rank may write `oom` (it caught the allocator's exception type,
not a string), but timeouts, signals, missing results and emulated budgets are judged here, by the parent.
"""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field
from typing import Any

GIB = 1024**3

# Statuses a probe can end with; the study adds `invalid`, `predicted_oom` and `inferred_oom` (no launch).
OK, OOM, TIMEOUT, CRASHED = "ok", "oom", "timeout", "crashed"
# Exit code a probe rank uses after it caught an out-of-memory exception and wrote its result.
OOM_EXIT_CODE = 3


@dataclass
class ProbeResult:
    status: str
    # How the OOM was established: "cuda" (torch.OutOfMemoryError), "host" (MemoryError on CPU),
    # or "emulated" (peak above --memory-budget, which no hardware enforced).
    oom_kind: str | None = None
    samples_per_sec: float = 0.0
    tokens_per_sec: float = 0.0
    iteration_seconds: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    peak_memory_bytes: int = 0
    peak_memory_source: str = ""
    rank_peaks: list[dict[str, Any]] = field(default_factory=list)
    gpu_utilization: float | None = None
    memory_budget_bytes: int | None = None
    wall_seconds: float = 0.0
    measured_seconds: float = 0.0
    warmup_seconds: float = 0.0
    startup_seconds: float = 0.0
    world_size: int = 1
    device: str = "cpu"
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    stderr_tail: str = ""

    @property
    def peak_memory_gib(self) -> float:
        return self.peak_memory_bytes / GIB

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["peak_memory_gib"] = round(self.peak_memory_gib, 4)
        return data


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
) -> tuple[str, str | None, str]:
    """Decide (status, oom_kind, message) for a finished probe. Pure, so it is tested on its own.

    Order matters: a rank that caught a real OOM explains the others' hang or crash, so it wins over
    `timeout`; a timeout wins over exit codes (we killed the processes ourselves).
    """
    for result in rank_results:
        if result and result.get("status") == OOM:
            kind = result.get("oom_kind", "cuda" if device == "cuda" else "host")
            return OOM, kind, result.get("message", "out of memory")
    if timed_out:
        return TIMEOUT, None, "probe exceeded its wall-clock timeout; the process group was killed"
    for rank, code in enumerate(exit_codes):
        if code != 0:
            return CRASHED, None, f"rank {rank}: {describe_exit(code)}"
    for rank, result in enumerate(rank_results):
        if not result or result.get("status") != OK:
            return CRASHED, None, f"rank {rank}: exited 0 without a readable result"
    if budget_bytes is not None and peak_bytes > budget_bytes and device != "cuda":
        # On CUDA the budget is enforced by the allocator (a per-process memory fraction): only a real
        # OOM counts there. On CPU nothing enforces it, so the peak RSS is compared here, and said so.
        return (
            OOM,
            "emulated",
            (
                f"peak {peak_bytes / GIB:.3f} GiB is above the emulated budget {budget_bytes / GIB:.3f} GiB "
                "(peak RSS compared after the run; no allocator enforced it)"
            ),
        )
    return OK, None, ""
