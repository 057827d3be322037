"""A previous verl run's log, read for what the next job will see: its lengths and its generation's share.

    log = read_run_log(Path("verl_metrics.jsonl"))     # the file logger's JSON lines, or the console output
    log.lengths            # JobLengths from the last step's prompt_length/* and response_length/*
    log.generation_share   # timing_s/gen / timing_s/step over the steps after the first

verl logs, per step, the batch's response lengths as min, mean, max and the share that hit the limit
(`response_length/min`, `/mean`, `/max`, `/clip_ratio`; verl/trainer/ppo/metric_utils.py
`compute_data_metrics`), and the prompts' alike. That is not a distribution: the counts made from it put the
clipped share at the max and spread the rest evenly from the min, with the mean the log says (an assumption,
said where the lengths are shown). Responses grow during RL training, so the last step is the one used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from autotune.config.job_lengths import JobLengths
from autotune.errors import UserError
from autotune.probe.verl.metrics import STEP_TIMER, Metrics, merge_steps, parse_console, parse_file_log

if TYPE_CHECKING:
    from autotune.data.lengths import LengthReport

__all__ = ["RunLog", "counts_from_stats", "job_lengths", "read_run_log"]

SAMPLES = 1000  # counts made from one step's statistics
GENERATION = "timing_s/gen"


@dataclass(frozen=True)
class RunLog:
    path: str
    steps: int  # steps in the log
    step: int  # the step whose lengths are used: the last with response lengths
    lengths: JobLengths
    generation_share: float | None  # None: the log has no timings

    def describe(self) -> str:
        share = "" if self.generation_share is None else f"; generation {self.generation_share:.0%} of a step"
        return f"verl log {self.path}: step {self.step} of {self.steps}{share}"


def counts_from_stats(minimum: float, mean: float, maximum: float, clipped: float) -> list[int]:
    """SAMPLES token counts with these statistics: the clipped share at the max, the rest evenly spread from
    the min up to where their mean makes the overall mean (at most the max)."""
    low, high = max(1.0, minimum), max(1.0, maximum)
    share = min(max(clipped, 0.0), 1.0)
    at_max = round(share * SAMPLES)
    rest = SAMPLES - at_max
    if rest == 0:
        return [round(high)] * SAMPLES
    rest_mean = min(high, max(low, (mean * SAMPLES - at_max * high) / rest))
    top = min(high, 2 * rest_mean - low)
    spread = np.linspace(low, top, rest) if top > low else np.full(rest, rest_mean)
    return [round(high)] * at_max + [round(v) for v in spread]


def _stats(metrics: Metrics, kind: str) -> tuple[float, float, float, float] | None:
    keys = [f"{kind}_length/{name}" for name in ("min", "mean", "max", "clip_ratio")]
    values = [metrics.get(key) for key in keys]
    if any(v is None for v in values[:3]):
        return None
    low, mean, high, clip = (float(v) if v is not None else 0.0 for v in values)
    return low, mean, high, clip


def _generation_share(steps: dict[int, Metrics]) -> float | None:
    """timing_s/gen over timing_s/step, summed over the steps after the first (its CUDA graphs and warm-up
    are not the run's pace); the first alone when it is the only one."""
    timed = [m for m in steps.values() if m.get(GENERATION) and m.get(STEP_TIMER)]
    later = timed[1:] or timed
    step = sum(float(m[STEP_TIMER] or 0.0) for m in later)
    return sum(float(m[GENERATION] or 0.0) for m in later) / step if step > 0 else None


def read_run_log(path: Path) -> RunLog:
    """The run's lengths and generation share; UserError (one line) when the file cannot say them."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--verl-log {path}: " + ("is a directory" if path.is_dir() else "does not exist"))
    text = path.read_text(encoding="utf-8", errors="replace")
    steps = merge_steps(parse_file_log(text), parse_console(text))
    if not steps:
        raise UserError(
            f"--verl-log {path}: no verl step in it: give the file logger's JSON lines "
            f"(trainer.logger=[console,file], VERL_FILE_LOGGER_PATH) or the run's console output"
        )
    with_lengths = [(step, m) for step, m in steps.items() if _stats(m, "response")]
    if not with_lengths:
        raise UserError(
            f"--verl-log {path}: {len(steps)} step(s), none with response_length/min, /mean and /max: "
            f"give a log of a run that logged its data metrics"
        )
    step, metrics = with_lengths[-1]
    response_stats = _stats(metrics, "response")
    assert response_stats is not None  # the steps kept have them
    responses = counts_from_stats(*response_stats)
    prompt_stats = _stats(metrics, "prompt")
    prompts = counts_from_stats(*prompt_stats) if prompt_stats else None
    lengths = JobLengths.from_counts(prompts, responses, response_source="verl log")
    if prompt_stats:  # the prompts' counts are the log's too, not a dataset's
        lengths = JobLengths(lengths.prompts, lengths.responses, "verl log", "verl log")
    return RunLog(str(path), len(steps), step, lengths, _generation_share(steps))


def job_lengths(report: LengthReport | None, verl_log: Path | None) -> tuple[JobLengths, list[str]]:
    """The lengths a verdict or a study is on, and what to say of them: prompts from the data (`--data`),
    responses from a verl log where given (the policy's own, as they were), else from the data's response
    column; the log's prompts without data; none of them: the limits."""
    log = read_run_log(verl_log) if verl_log is not None else None
    said = []
    prompts = list(report.prompts) if report is not None else None
    responses = list(report.responses) if report is not None and report.responses.size else None
    source = "data"
    if log is not None:
        said.append(
            f"{log.describe()}: its response lengths (min, mean, max and clip ratio; evenly spread between, "
            f"an assumption) are the job's"
        )
        responses, source = list(log.lengths.responses), "verl log"
        if prompts is None and log.lengths.prompts:
            return log.lengths, said
    if prompts is None and responses is None:
        return JobLengths(), said
    return JobLengths.from_counts(prompts, responses, response_source=source), said
