"""The traced estimate beside the analytic model's, term by term and phase by phase.

    rows = compare(trace, predict_components(arch, config, world_size, "cuda"))
    for row in rows: print(row.term, row.analytic, row.traced, row.error)

Both sides are per-rank tensor bytes, with no runtime constant and no allocator factor: the analytic side is
`predict_components` (the model's raw terms), the traced side `autotune.memory.trace`. A row's `error` is
(analytic − traced) / traced: positive when the analytic model says more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.memory.model import MemoryBreakdown
from autotune.units import GIB

if TYPE_CHECKING:  # the trace imports torch: only when one runs
    from autotune.config.knobs import ProbeConfig
    from autotune.memory.trace import MemoryTrace, PhasePeak
    from autotune.models.registry import ModelSpec

__all__ = ["TraceRow", "compare", "format_rows"]

DISAGREES = 0.10  # a term whose two estimates differ by more than this is worth a look...
NOTICEABLE = 64 * 1024**2  # ...when the difference is large enough to matter on a card


@dataclass(frozen=True)
class TraceRow:
    term: str
    analytic: int
    traced: int

    @property
    def error(self) -> float | None:
        if self.traced <= 0:
            return None if self.analytic <= 0 else float("inf")
        return (self.analytic - self.traced) / self.traced

    @property
    def disagrees(self) -> bool:
        large = abs(self.analytic - self.traced) > NOTICEABLE
        return large and self.error is not None and abs(self.error) > DISAGREES

    def to_dict(self) -> dict:
        return {"term": self.term, "analytic": self.analytic, "traced": self.traced, "error": self.error}


def _dynamic(peak: PhasePeak) -> int:
    return peak.parts.get("activations", 0) + peak.parts.get("temporaries", 0)


def _largest(passes: list[PhasePeak], term: str) -> int:
    """A term's largest value over the passes of a phase, each taken at its pass's peak (the analytic model
    sizes each term by its largest pass too)."""
    if term == "dynamic":
        return max((_dynamic(p) for p in passes), default=0)
    if term == "peak":
        return max((p.peak for p in passes), default=0)
    return max((p.parts.get(term, 0) for p in passes), default=0)


def _state_rows(trace: MemoryTrace, b: MemoryBreakdown) -> list[TraceRow]:
    s = trace.states
    return [
        TraceRow("weights", b.weights, s.get("weights", 0)),
        TraceRow("gradients", b.gradients, s.get("gradients", 0)),
        TraceRow("optimizer states", b.optimizer, s.get("optimizer", 0)),
        TraceRow("rollout buffer", b.rollout_buffer, s.get("rollout_buffer", 0)),
    ]


def _scoring_rows(trace: MemoryTrace, b: MemoryBreakdown) -> list[TraceRow]:
    passes = [p for p in trace.phases if p.analytic_phase == "scoring"]
    if not passes or "scoring" not in b.phases:
        return []
    autocast = b.phase_states.get("scoring", 0) - b.gathered_scoring
    return [
        TraceRow("scoring: gathered weights", b.gathered_scoring, _largest(passes, "gathered")),
        TraceRow("scoring: activations", autocast + b.phases["scoring"], _largest(passes, "dynamic")),
        TraceRow("scoring: peak", b.static + int(b.phase_total("scoring")), _largest(passes, "peak")),
    ]


def _update_rows(trace: MemoryTrace, b: MemoryBreakdown) -> list[TraceRow]:
    backward = [p for p in trace.phases if p.name.endswith("backward")]
    update = trace.peak("update")
    if not backward or update is None:
        return []
    dynamic = b.update_autocast_weights + b.activations + max(b.logits, b.backward_workspace)
    rows = [
        TraceRow("backward: gathered weights", b.gathered_update, _largest(backward, "gathered")),
        TraceRow("backward: reduce-scatter", b.reduce_scatter, _largest(backward, "reduce_scatter")),
        TraceRow("backward: activations", dynamic, _largest(backward, "dynamic")),
        TraceRow("backward: peak", b.static + b.backward_peak, max(p.peak for p in backward)),
    ]
    step = update.parts.get("optimizer_step", 0)
    if step > 0:  # the step is the update's peak: its temporaries are seen at that moment
        rows.append(TraceRow("optimizer step", b.optimizer_step, step))
    rows.append(TraceRow("update: peak", b.static + int(b.phase_total("update")), update.peak))
    return rows


def compare(trace: MemoryTrace, b: MemoryBreakdown) -> list[TraceRow]:
    """The rows both sides have: the resident states, then each traced phase's parts and peak."""
    return _state_rows(trace, b) + _scoring_rows(trace, b) + _update_rows(trace, b)


def _gib(value: int) -> str:
    return f"{value / GIB:.2f}"


def format_rows(rows: list[TraceRow]) -> list[str]:
    """Aligned lines: term, analytic GiB, traced GiB, the difference (marked where over 10%)."""
    width = max((len(r.term) for r in rows), default=4)
    lines = [f"{'per rank, GiB':<{width}}  {'analytic':>9}  {'traced':>9}  differs"]
    for row in rows:
        error = row.error
        said = "—" if error is None else ("new" if error == float("inf") else f"{error:+.0%}")
        mark = "  ←" if row.disagrees else ""
        lines.append(f"{row.term:<{width}}  {_gib(row.analytic):>9}  {_gib(row.traced):>9}  {said}{mark}")
    return lines


@dataclass(frozen=True)
class TracedCheck:
    """What `autotune check --trace` shows: the rows, the trace's notes and how long it took; or why not."""

    rows: list[TraceRow]
    notes: list[str]
    seconds: float
    world_size: int
    layout: str
    failed: str | None = None

    def lines(self) -> list[str]:
        if self.failed:
            return [f"traced memory: not run: {self.failed}; the analytic model stands"]
        layout = "a GPU run's layout, bf16 mixed" if self.layout == "cuda" else "the CPU probe's layout, fp32"
        head = (
            f"traced memory ({self.world_size} rank(s), {layout}, FakeTensorMode, "
            f"{self.seconds:.0f} s); analytic = the memory model's terms, without its runtime constant and "
            f"allocator factor:"
        )
        return [head, *(f"  {line}" for line in format_rows(self.rows)), *(f"  · {n}" for n in self.notes)]

    def to_dict(self) -> dict:
        return {
            "rows": [r.to_dict() for r in self.rows],
            "notes": self.notes,
            "seconds": self.seconds,
            "world_size": self.world_size,
            "layout": self.layout,
            "failed": self.failed,
        }


def traced_check(
    actor_spec: ModelSpec, reward_spec: ModelSpec | None, config: ProbeConfig, world_size: int, layout: str
) -> TracedCheck:
    """Trace `config` and set it beside the analytic terms; a trace that cannot run says why in one line."""
    from autotune.memory.model import Architecture, predict_components
    from autotune.memory.trace import TraceUnavailable, trace_memory

    try:
        trace = trace_memory(actor_spec, reward_spec, config, world_size, layout)
    except TraceUnavailable as error:
        return TracedCheck([], [], 0.0, world_size, layout, failed=str(error))
    arch = Architecture.from_specs(actor_spec, reward_spec)
    rows = compare(trace, predict_components(arch, config, world_size, layout))
    return TracedCheck(rows, trace.notes, trace.seconds, world_size, layout)
