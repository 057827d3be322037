"""The traced estimate beside the analytic model's, term by term and phase by phase.

    rows = compare(trace, predict_components(arch, config, world_size, "cuda"))
    for row in rows: print(row.term, row.analytic, row.traced, row.error)

Both sides are per-rank tensor bytes, with no runtime constant and no allocator factor: the analytic side is
`predict_components` (the model's raw terms), the traced side `autotune.memory.trace`. A row's `error` is
(analytic − traced) / traced: positive when the analytic model says more.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.memory.model import MemoryBreakdown
from autotune.memory.trace import MemoryTrace, PhasePeak
from autotune.units import GIB

__all__ = ["TraceRow", "compare", "format_rows"]

DISAGREES = 0.10  # a term whose two estimates differ by more than this is worth a look


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
        return self.error is not None and abs(self.error) > DISAGREES

    def to_dict(self) -> dict:
        return {"term": self.term, "analytic": self.analytic, "traced": self.traced, "error": self.error}


def _dynamic(peak: PhasePeak) -> int:
    return peak.parts.get("activations", 0) + peak.parts.get("temporaries", 0)


def _state_rows(trace: MemoryTrace, b: MemoryBreakdown) -> list[TraceRow]:
    s = trace.states
    return [
        TraceRow("weights", b.weights, s.get("weights", 0)),
        TraceRow("gradients", b.gradients, s.get("gradients", 0)),
        TraceRow("optimizer states", b.optimizer, s.get("optimizer", 0)),
        TraceRow("rollout buffer", b.rollout_buffer, s.get("rollout_buffer", 0)),
    ]


def _scoring_rows(trace: MemoryTrace, b: MemoryBreakdown) -> list[TraceRow]:
    peak = trace.peak("scoring")
    if peak is None or "scoring" not in b.phases:
        return []
    autocast = b.phase_states.get("scoring", 0) - b.gathered_scoring
    return [
        TraceRow("scoring: gathered weights", b.gathered_scoring, peak.parts.get("gathered", 0)),
        TraceRow("scoring: activations", autocast + b.phases["scoring"], _dynamic(peak)),
        TraceRow("scoring: peak", b.static + int(b.phase_total("scoring")), peak.peak),
    ]


def _backward(trace: MemoryTrace) -> PhasePeak | None:
    passes = [p for p in trace.phases if p.name.endswith("backward")]
    return max(passes, key=lambda p: p.peak, default=None)


def _update_rows(trace: MemoryTrace, b: MemoryBreakdown) -> list[TraceRow]:
    backward, update = _backward(trace), trace.peak("update")
    if backward is None or update is None:
        return []
    dynamic = b.update_autocast_weights + b.activations + max(b.logits, b.backward_workspace)
    rows = [
        TraceRow("backward: gathered weights", b.gathered_update, backward.parts.get("gathered", 0)),
        TraceRow("backward: reduce-scatter", b.reduce_scatter, backward.parts.get("reduce_scatter", 0)),
        TraceRow("backward: activations", dynamic, _dynamic(backward)),
        TraceRow("backward: peak", b.static + b.backward_peak, backward.peak),
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
