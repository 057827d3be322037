"""The traced memory estimate, tuner side: run the trace in its own process, set it beside the analytic model.

    said = traced_check(TraceJob(spec, None, config, world_size=2, layout="cuda"))  # `check --trace`
    said = traced_check(TraceJob(spec, None, config, 2, "cuda", lengths=job_lengths))  # the data's lengths
    print("\n".join(said.lines()))
    rows = compare(trace, predict_components(arch, config, world_size, "cuda"))

The trace itself (`autotune.probe.rank.trace`) runs the probe rank's code, so it runs as a rank does: in a
process of its own (`python -m autotune.probe.rank.trace JOB`), which also keeps its fake process group and
fake tensors out of this one. With `verl_python` that process is verl's environment's python and the passes'
per-token math is verl's own (`autotune.probe.rank.verl_math`); the trace names the functions it ran.
Both sides price the same micro batches: the trace packs each pass's from the job's lengths (the data's,
or the limits) as `autotune.config.job_lengths.pass_tokens` sizes it, and the analytic model prices those
tokens.
Both sides are per-rank tensor bytes, with no runtime constant and no allocator factor: the analytic side
is `predict_components` (the model's raw terms). A row's `error` is (analytic − traced) / traced: positive
when the analytic model says more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config.job_lengths import JobLengths, PassTokens
from autotune.memory.breakdown import MemoryBreakdown
from autotune.probe.launcher import runner_path
from autotune.units import GIB

if TYPE_CHECKING:
    from autotune.config.knobs import ProbeConfig
    from autotune.models.catalog import ModelSpec

__all__ = [
    "MathSource",
    "MemoryTrace",
    "PhasePeak",
    "TraceJob",
    "TraceRow",
    "TraceUnavailable",
    "TracedCheck",
    "compare",
    "format_rows",
    "run_trace",
    "traced_check",
    "verl_trace_python",
]

PROGRESS_KEY = "traced"  # the trace process's stderr line {"traced": pass, "seconds": s} (rank/trace.py)
BUILT = "models built"  # the progress line before the passes: the models built under FakeTensorMode
TRACE_TIMEOUT = 900  # seconds: a 13B PPO config with a critic traces in about two minutes here

# which of the analytic model's phases each traced pass belongs to
ANALYTIC_PHASE = {
    "log-prob": "scoring",
    "reference": "scoring",
    "values": "scoring",
    "reward": "scoring",
    "critic backward": "update",  # forward and backward, before the optimizer steps
    "critic update": "update",  # the whole update, the step included
    "actor backward": "update",
    "actor update": "update",
}


class MathSource(StrEnum):
    """Whose per-token functions the trace's passes run: the trace job's "pass_math", stored as the value."""

    AUTOTUNE = "autotune"  # autotune.probe.rank.rl_math's (pass_math.AUTOTUNE), in this environment
    VERL = "verl"  # verl's own (autotune.probe.rank.verl_math), in verl's environment (--verl-python)


class TraceUnavailable(Exception):
    """The trace cannot run for this config or architecture; the message is one line saying why."""


@dataclass(frozen=True)
class PhasePeak:
    """One traced pass: its peak bytes per rank, everything resident included, and what makes it up."""

    name: str
    peak: int
    parts: dict[str, int]

    @property
    def analytic_phase(self) -> str:
        return ANALYTIC_PHASE[self.name]


@dataclass(frozen=True)
class MemoryTrace:
    world_size: int
    layout: str
    states: dict[str, int]  # resident per rank between phases: weights, gradients, optimizer, rollout buffer
    phases: list[PhasePeak]
    seconds: float
    notes: list[str] = field(default_factory=list)
    functions: dict[str, str] = field(default_factory=dict)  # the per-token math traced: entry -> function
    lengths: str = "max"  # what the micro batches were packed from: "data" (the job's lengths) or "max"
    # each pass's micro batch as made (PassTokens' names)
    tokens: dict[str, int] = field(default_factory=dict)

    def peak(self, analytic_phase: str) -> PhasePeak | None:
        """The largest traced pass of one of the analytic model's phases ("scoring", "update")."""
        passes = [p for p in self.phases if p.analytic_phase == analytic_phase]
        return max(passes, key=lambda p: p.peak, default=None)

    @property
    def total(self) -> int:
        return max((p.peak for p in self.phases), default=sum(self.states.values()))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"total": self.total}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryTrace:
        phases = [PhasePeak(**p) for p in data["phases"]]
        functions = data.get("functions", {})  # traces collected before it was recorded ran autotune's
        found = (data["world_size"], data["layout"], data["states"], phases, data["seconds"], data["notes"])
        # traces collected before the lengths were recorded were all at the limits
        return cls(*found, functions, data.get("lengths", "max"), data.get("tokens", {}))


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
    dynamic = b.update_autocast_weights + b.backward_dynamic  # at the analytic model's backward moment
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
    """What `autotune check --trace` shows: the rows, the trace's notes and how long it took; or why not.
    `lengths` says what the micro batches were packed from ("data": the job's lengths, `lengths_used`; "max":
    the limits), as the memory verdict says it; `tokens` are each pass's micro batch as traced, `priced` as
    the analytic model prices it on the same lengths."""

    rows: list[TraceRow]
    notes: list[str]
    seconds: float
    world_size: int
    layout: str
    failed: str | None = None
    functions: dict[str, str] = field(default_factory=dict)  # the per-token math the trace ran
    lengths: str = "max"
    lengths_used: str = ""
    tokens: dict[str, int] = field(default_factory=dict)
    priced: dict[str, int] = field(default_factory=dict)
    estimate_seconds: float | None = None  # said before it started (`trace_estimate`)
    pass_seconds: dict[str, float] = field(default_factory=dict)  # each pass as it was traced, in order

    @classmethod
    def not_run(cls, why: str, world_size: int, layout: str = "cuda", lengths: str = "max") -> TracedCheck:
        return cls([], [], 0.0, world_size, layout, failed=why, lengths=lengths)

    def lines(self) -> list[str]:
        if self.failed:
            return [f"traced memory: not run: {self.failed}; the analytic model stands"]
        layout = "a GPU run's layout, bf16 mixed" if self.layout == "cuda" else "the CPU probe's layout, fp32"
        on = f"on {self.lengths_used}" if self.lengths == "data" else "at the limits"
        head = (
            f"traced memory {on} ({self.world_size} rank(s), {layout}, FakeTensorMode, "
            f"{self.seconds:.0f} s); analytic = the memory model's terms on the same lengths, without its "
            f"runtime constant and allocator factor:"
        )
        rows = [f"  {line}" for line in format_rows(self.rows)]
        said = [*self._tokens_line(), *self.notes, *self._functions_line()]
        return [head, *rows, *(f"  · {n}" for n in said)]

    def _tokens_line(self) -> list[str]:
        """The micro batches traced, and the analytic model's where it prices other tokens."""
        if not self.tokens:
            return []
        line = "micro batches traced, tokens per GPU: " + _passes_tokens(self.tokens)
        differ = {k: v for k, v in self.priced.items() if v and self.tokens.get(k) != v}
        return [line + (f" (the analytic model prices {_passes_tokens(differ)})" if differ else "")]

    def _functions_line(self) -> list[str]:
        if not self.functions:
            return []
        return ["per-token math traced: " + "; ".join(f"{k}: {v}" for k, v in self.functions.items())]

    def to_dict(self) -> dict:
        return {
            "rows": [r.to_dict() for r in self.rows],
            "notes": self.notes,
            "seconds": self.seconds,
            "world_size": self.world_size,
            "layout": self.layout,
            "failed": self.failed,
            "functions": self.functions,
            "lengths": self.lengths,
            "lengths_used": self.lengths_used,
            "tokens": self.tokens,
            "priced_tokens": self.priced,
            "estimate_seconds": self.estimate_seconds,
            "pass_seconds": self.pass_seconds,
        }


def _passes_tokens(tokens: dict[str, int]) -> str:
    """'update 9,415, forward 9,415' (PassTokens' names in its order, underscores as spaces), passes that run
    only."""
    order = [f.name for f in dataclasses.fields(PassTokens)]
    ranked = sorted(tokens.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
    return ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in ranked if v)


def _model_ref(spec: ModelSpec) -> str:
    return str(spec.path) if spec.source == "local" and spec.path else spec.name


@dataclass(frozen=True)
class TraceJob:
    """One trace: the models, the configuration on `world_size` ranks of `layout`'s device, whose per-token
    math its passes run (`verl_python`: verl's, in verl's environment, checked by `verl_trace_python`;
    None: autotune's here) and the lengths its micro batches are packed from (None: the limits)."""

    actor: ModelSpec
    reward: ModelSpec | None
    config: ProbeConfig
    world_size: int
    layout: str
    verl_python: str | None = None
    lengths: JobLengths | None = None


def run_trace(
    job: TraceJob, on_pass: Callable[[str, float], None] = lambda name, seconds: None
) -> MemoryTrace:
    """The trace, in a process of its own; TraceUnavailable (one line) when it cannot run. `on_pass(name,
    seconds)` as each pass is traced."""
    verl_python, lengths = job.verl_python, job.lengths
    request = {
        "model": _model_ref(job.actor),
        "reward": _model_ref(job.reward) if job.reward else None,
        "trust_remote_code": job.actor.trust_remote_code,
        "config": dataclasses.asdict(job.config),
        "world_size": job.world_size,
        "layout": job.layout,
        "pass_math": MathSource.VERL if verl_python else MathSource.AUTOTUNE,
        "lengths": lengths.to_dict() if lengths is not None else None,
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MASTER_ADDR": "", "RANK": "", "WORLD_SIZE": ""}
    with _package_path(env, verl_python is not None):
        command = [verl_python or sys.executable, str(runner_path("memory_trace.py")), json.dumps(request)]
        code, out, err = _run_with_progress(command, env, on_pass)
    lines = out.strip().splitlines()
    if code != 0 or not lines:
        last = (err or ["no output"])[-1]
        raise TraceUnavailable(f"the trace process failed (exit {code}): {last[:200]}")
    data = json.loads(lines[-1])
    if "failed" in data:
        raise TraceUnavailable(data["failed"])
    return MemoryTrace.from_dict(data)


def _run_with_progress(
    command: list[str], env: dict[str, str], on_pass: Callable[[str, float], None]
) -> tuple[int, str, list[str]]:
    """Run the trace process: its progress lines (stderr, PROGRESS_KEY) to `on_pass` as they come, its
    stdout to a file (read at the end: nothing blocks on a full pipe); killed past TRACE_TIMEOUT. Returns
    the exit code, stdout and the other stderr lines."""
    other: list[str] = []
    killed = threading.Event()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE, text=True, env=env)

        def kill() -> None:
            killed.set()
            proc.kill()

        timer = threading.Timer(TRACE_TIMEOUT, kill)
        timer.start()
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                said = _progress(line, PROGRESS_KEY)
                if said is not None:
                    on_pass(*said)
                elif line.strip():
                    other.append(line.rstrip())
            proc.wait()
        finally:
            timer.cancel()
        if killed.is_set():
            raise TraceUnavailable(f"the trace ran over {TRACE_TIMEOUT} s")
        out.seek(0)
        return proc.returncode, out.read(), other[-20:]


def _progress(line: str, key: str) -> tuple[str, float] | None:
    if not line.startswith("{"):
        return None
    with contextlib.suppress(ValueError, TypeError, KeyError):
        data = json.loads(line)
        return str(data[key]), float(data["seconds"])
    return None


@contextlib.contextmanager
def _package_path(env: dict[str, str], other_python: bool) -> Iterator[None]:
    """For another environment's python: a folder holding only autotune's package (a link to it) first on
    PYTHONPATH, so that autotune imports there and everything else is that environment's own (its torch,
    transformers and verl; none of this environment's site-packages)."""
    if not other_python:
        yield
        return
    import autotune

    with tempfile.TemporaryDirectory(prefix="autotune-path-") as folder:
        (Path(folder) / "autotune").symlink_to(Path(autotune.__file__).resolve().parent, True)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH", "")) if p)
        yield


# Run with verl's python: verl's version, and the modules whose functions the trace calls.
VERL_PROBE = (
    "import verl, verl.utils.torch_functional, verl.trainer.ppo.core_algos, verl.workers.config; "
    "print(verl.__version__)"
)


def verl_trace_python(python: str) -> str:
    """verl's version in the environment of `python`; UserError (exit 2) in one line when that python
    cannot run, or verl is not importable there, or is not the version the trace's calls were read in."""
    from autotune.errors import UserError
    from autotune.probe.environment import last_line
    from autotune.probe.verl.install import INSTALL, VERL_VERSION

    path = Path(python).expanduser()
    named = f"--verl-python {python}"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UserError(f"{named}: not an executable file; give the python of verl's environment")
    version = last_line(path, ["-c", VERL_PROBE], named, "`import verl`", f"install it with {INSTALL}")
    if version != VERL_VERSION:
        raise UserError(
            f"{named}: verl {version or '(no version)'} there; the trace calls verl {VERL_VERSION}'s "
            f"functions: install it with {INSTALL}"
        )
    return version


# seconds a trace takes on two cores, fitted on the 45 traces of bench/results (within about 2x):
# SECONDS_PER_LAYER_PASS x layers x passes + SECONDS_PER_LAYER_TOKEN x layers x the passes' micro-batch tokens
SECONDS_PER_LAYER_PASS = 0.25
SECONDS_PER_LAYER_TOKEN = 0.41e-4


def trace_estimate(
    actor_spec: ModelSpec, config: ProbeConfig, world_size: int, lengths: JobLengths | None = None
) -> tuple[float, int]:
    """(about how many seconds the trace takes on two cores, how many passes it traces): the model's layers
    by its passes and by their micro batches' tokens (within about a factor of two)."""
    from autotune.config.job_lengths import pass_tokens

    layers = int(getattr(actor_spec.config, "num_hidden_layers", 0) or 0)
    tokens = pass_tokens(config, lengths or JobLengths(), world_size)
    ppo = config.algorithm == "ppo"
    passes = 2 + bool(config.use_kl) + 2 * ppo  # log-prob, update; reference; values, critic update
    traced = tokens.forward * (1 + bool(config.use_kl)) + tokens.update
    traced += (tokens.critic_forward + tokens.critic_update) if ppo else 0
    seconds = layers * (SECONDS_PER_LAYER_PASS * passes + SECONDS_PER_LAYER_TOKEN * traced)
    return seconds, passes


def traced_check(
    job: TraceJob, on_pass: Callable[[str, float], None] = lambda name, seconds: None
) -> TracedCheck:
    """Trace `job` and set it beside the analytic terms, both on the job's lengths (None: the limits): the
    trace packs each pass's micro batch from them as the analytic model prices it. A trace that cannot run
    says why in one line."""
    from autotune.memory.architecture import Architecture
    from autotune.memory.breakdown import predict_components

    actor_spec, reward_spec, config = job.actor, job.reward, job.config
    world_size, layout = job.world_size, job.layout
    lengths = job.lengths or JobLengths()
    estimate, _ = trace_estimate(actor_spec, config, world_size, lengths)
    passes: dict[str, float] = {}

    def said(name: str, seconds: float) -> None:
        passes[name] = seconds
        on_pass(name, seconds)

    try:
        trace = run_trace(dataclasses.replace(job, lengths=lengths), said)
    except TraceUnavailable as error:
        return TracedCheck.not_run(str(error), world_size, layout, lengths.label)
    arch = Architecture.from_specs(actor_spec, reward_spec)
    analytic = predict_components(arch, config, world_size, layout, lengths)
    return TracedCheck(
        compare(trace, analytic),
        trace.notes,
        trace.seconds,
        world_size,
        layout,
        functions=trace.functions,
        lengths=trace.lengths,
        lengths_used=lengths.describe(config.max_prompt_length, config.max_response_length),
        tokens=trace.tokens,
        priced=analytic.tokens,
        estimate_seconds=round(estimate),
        pass_seconds=passes,
    )
