"""What verl 0.9.1 writes per training step, read back into the figures a `ProbeResult` needs.

Two sources carry the same `metrics` dict of one `Tracking.log(data=metrics, step=N)` call
(verl/trainer/ppo/v1/trainer_base.py:514):
- the `file` logger's JSON lines, `{"step": N, "data": {...}}`, written by orjson with
  OPT_SERIALIZE_NUMPY, so NaN and ±inf become `null` (verl/utils/tracking.py:543-545);
- the `console` logger's line `step:N - key:value - ...`, each value its `pprint.pformat` repr, so numpy
  scalars read `np.float64(1.5)` (verl/utils/logger/aggregate_logger.py:26-32,49-51). It is printed inside
  the TaskRunnerV1 Ray actor, so on the driver it carries Ray's `(TaskRunnerV1 pid=N)` prefix, in ANSI
  colour unless RAY_COLOR_PREFIX=0 (ray/_private/worker.py:2389-2406).

Pure functions on text: nothing here imports verl, which lives in its own environment.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from autotune.units import GIB

__all__ = [
    "PHASES",
    "Metrics",
    "VerlSteps",
    "clean_line",
    "merge_steps",
    "parse_console",
    "parse_file_log",
    "phase_of",
    "summarise",
]

Metrics = dict[str, float | None]  # one step's numeric metrics; None where verl logged NaN or ±inf

# verl's timers (`timing_s/<name>`, verl/trainer/ppo/metric_utils.py:611-652; the timers at
# verl/trainer/ppo/v1/trainer_base.py:565-609) folded into autotune's phases. Any other timer
# (update_weights, save_checkpoint, testing, ...) keeps its own name.
PHASES: dict[str, str] = {
    "gen": "rollout",
    "old_log_prob": "scoring",
    "ref": "scoring",
    "values": "scoring",
    "reward": "scoring",
    "adv": "advantages",
    "update_actor": "update",
    "update_critic": "update",
}
STEP_TIMER = "timing_s/step"  # the whole step (trainer_base.py:473), validation and metrics excluded
TIMING_PREFIX = "timing_s/"
TOKENS = "perf/total_num_tokens"  # prompt + response tokens of the whole batch (metric_utils.py:679-686)
# Rank 0's allocator figures, role-prefixed by the trainer (verl/workers/engine_workers.py:219-220;
# verl/trainer/ppo/v1/trainer_base.py:1820,1861).
ROLES = ("actor", "critic")
ALLOCATED = "perf/max_memory_allocated_gb"
RESERVED = "perf/max_memory_reserved_gb"

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Ray's forwarded-output prefix: "(<actor or task name> pid=<pid>[, ip=<ip>]) " (ray/_private/worker.py:
# 2320-2330, 2383, 2404); "pid=" alone for a nameless worker.
RAY_PREFIX = re.compile(r"^\((?:[^()]*? )?pid=[^,)\s]+(?:, ip=[^)]*)?\) ?")
RAY_REPEATED = re.compile(r" \[repeated \d+x across cluster\].*$")  # ray/_private/ray_logging/__init__.py:234
STEP_LINE = re.compile(r"^step:(\d+)(?: - (.*))?$")
NUMPY_REPR = re.compile(r"^np\.\w+\((.*)\)$")  # numpy >= 2 scalar reprs: np.float64(1.5), np.int64(3)


def clean_line(line: str) -> str:
    """A forwarded output line as the actor printed it: colour codes, an earlier carriage-return overwrite
    (a progress bar), Ray's prefixes and its dedup suffix removed."""
    line = ANSI.sub("", line).rstrip("\r\n")
    line = line.rsplit("\r", 1)[-1].lstrip()
    # Prefixes nest: vLLM's EngineCore process tags its lines "(EngineCore_DP0 pid=N)" the same way.
    while (stripped := RAY_PREFIX.sub("", line)) != line:
        line = stripped
    return RAY_REPEATED.sub("", line).strip()


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _console_value(text: str) -> tuple[bool, float | None]:
    """(parsed?, value) of one `pprint.pformat` repr; nan/inf read as None, as the file logger writes them."""
    inner = NUMPY_REPR.match(text)
    text = (inner.group(1) if inner else text).strip("'\"")
    if text in ("True", "False"):
        return True, float(text == "True")
    try:
        return True, _finite(float(text))
    except ValueError:
        return False, None  # a Number verl may print but we cannot read (complex, Fraction): left out


def _parse_pairs(body: str) -> Metrics:
    # Values never contain " - " (a negative number follows ":" directly), and keys never contain ":".
    metrics: Metrics = {}
    for pair in body.split(" - "):
        key, colon, text = pair.rpartition(":")
        if not colon or not key:
            continue
        parsed, value = _console_value(text.strip())
        if parsed:
            metrics[key.strip()] = value
    return metrics


def parse_console(text: str) -> dict[int, Metrics]:
    """Every `step:N - key:value - ...` line of verl's console logger in `text` (the run's output), by
    step."""
    steps: dict[int, Metrics] = {}
    for line in text.splitlines():
        match = STEP_LINE.match(clean_line(line))
        if match:
            steps[int(match.group(1))] = _parse_pairs(match.group(2) or "")
    return steps


def _json_value(value: object) -> tuple[bool, float | None]:
    if value is None:
        return True, None  # orjson's NaN/inf
    if isinstance(value, bool | int | float):
        return True, _finite(float(value))
    return False, None  # strings, lists: not a figure


def parse_file_log(text: str) -> dict[int, Metrics]:
    """verl's file logger (`{"step": N, "data": {...}}` per line), by step. A line that is not such an object
    (one cut short by a kill) is skipped: the steps before it stand."""
    steps: dict[int, Metrics] = {}
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
            continue
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            continue
        metrics: Metrics = {}
        for key, raw in record["data"].items():
            parsed, value = _json_value(raw)
            if parsed:
                metrics[key] = value
        steps[step] = metrics
    return steps


def merge_steps(*sources: dict[int, Metrics]) -> dict[int, Metrics]:
    """Steps from several sources of the same log calls (file logger first, console second): per step the
    first source that has it wins."""
    merged: dict[int, Metrics] = {}
    for source in sources:
        for step, metrics in source.items():
            merged.setdefault(step, metrics)
    return dict(sorted(merged.items()))


def phase_of(timing_key: str) -> str | None:
    """autotune's phase for a `timing_s/<name>` key; None for the whole step and for non-timing keys."""
    if not timing_key.startswith(TIMING_PREFIX) or timing_key == STEP_TIMER:
        return None
    name = timing_key[len(TIMING_PREFIX) :]
    return PHASES.get(name, name)


@dataclass(frozen=True)
class VerlSteps:
    """A verl run's steps, summarised like the built-in probe's iterations.

    `allocated_peak_bytes` / `reserved_peak_bytes` are rank 0's lifetime allocator peak of the training
    worker process (`torch.cuda.max_memory_allocated/reserved()`, verl/workers/engine_workers.py:219-220,
    never reset in training: only the profiler calls reset_peak_memory_stats, verl/utils/memory_utils.py:82,
    241), the largest over the steps and the actor/critic roles. They are DP rank 0's only: the collected
    metrics of a batch-less TensorDict are the first rank's (verl/utils/tensordict_utils.py:241-244). vLLM's
    weights and KV cache live in other processes and are not in them, nor are the CUDA context and NCCL
    buffers. None when verl logged no such figure.
    """

    steps: dict[int, Metrics]
    expected: int
    warmup: int
    step_seconds: list[float]  # timing_s/step of each measured step (after the warm-up), in step order
    warmup_seconds: float
    phase_seconds: dict[str, float]  # mean seconds per measured step
    samples_per_sec: float
    tokens_per_sec: float
    allocated_peak_bytes: int | None
    reserved_peak_bytes: int | None
    missing: list[int] = field(default_factory=list)  # steps 1..expected that never appeared

    @property
    def iteration_seconds(self) -> float:
        return sum(self.step_seconds) / len(self.step_seconds) if self.step_seconds else 0.0

    @property
    def measured_seconds(self) -> float:
        return sum(self.step_seconds)


def _phase_means(measured: list[Metrics]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for metrics in measured:
        for key, value in metrics.items():
            phase = phase_of(key)
            if phase is not None and value is not None:
                totals[phase] = totals.get(phase, 0.0) + value
    # A timer absent from a step (e.g. update_actor during critic warm-up) counts as 0 s there.
    return {phase: total / len(measured) for phase, total in totals.items()}


def _peak_bytes(steps: Iterable[Metrics], key: str) -> int | None:
    values = [m.get(f"{role}/{key}") for m in steps for role in ROLES]
    found = [v for v in values if v is not None]
    return round(max(found) * GIB) if found else None  # verl's "gb" is GiB: bytes / 1024**3


def _tokens_per_sec(measured: list[Metrics]) -> float:
    counted = [m for m in measured if m.get(TOKENS) is not None]  # every measured step has its seconds
    seconds = sum(m[STEP_TIMER] or 0.0 for m in counted)
    return sum(m[TOKENS] or 0.0 for m in counted) / seconds if seconds > 0 else 0.0


def summarise(steps: dict[int, Metrics], expected: int, batch_samples: int, warmup: int = 1) -> VerlSteps:
    """Summarise steps 1..`expected` of a run: the first `warmup` steps are warm-up (vLLM's CUDA graphs, the
    allocator's first growth), the rest are measured. `batch_samples` is T = data.train_batch_size ×
    rollout.n, the samples one step trains on; samples/sec = T / mean measured step seconds.

    A measured step whose `timing_s/step` is missing or not finite is left out of the means."""
    wanted = range(1, expected + 1)
    missing = [step for step in wanted if step not in steps]
    timed = {s: steps[s] for s in wanted if s in steps and steps[s].get(STEP_TIMER) is not None}
    measured = [metrics for step, metrics in timed.items() if step > warmup]
    step_seconds = [float(m[STEP_TIMER] or 0.0) for m in measured]
    mean = sum(step_seconds) / len(step_seconds) if step_seconds else 0.0
    in_range = [steps[s] for s in wanted if s in steps]
    return VerlSteps(
        steps=dict(sorted(steps.items())),
        expected=expected,
        warmup=warmup,
        step_seconds=step_seconds,
        warmup_seconds=sum(float(m[STEP_TIMER] or 0.0) for s, m in timed.items() if s <= warmup),
        phase_seconds=_phase_means(measured) if measured else {},
        samples_per_sec=batch_samples / mean if mean > 0 else 0.0,
        tokens_per_sec=_tokens_per_sec(measured),
        allocated_peak_bytes=_peak_bytes(in_range, ALLOCATED),
        reserved_peak_bytes=_peak_bytes(in_range, RESERVED),
        missing=missing,
    )
