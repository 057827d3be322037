"""The memory model against the committed traces at 7B-13B (bench/results/trace.jsonl, `bench.trace collect`).

The traces are measurements: tensor bytes seen by torch's memory trackers on fake tensors, per pass, at real
sizes. The analytic side is recomputed by today's model, so a change to the model that moves a phase peak away
from what was traced fails here, without tracing again. No probes, no traces run: a few seconds.
"""

import json
import statistics

import pytest

from bench.trace import OUT, PEAKS, rows_of


def _peak_errors() -> dict[str, dict[str, float]]:
    """{config name: {phase peak: (analytic - traced) / traced}} for every traced configuration."""
    errors = {}
    for line in OUT.read_text().splitlines():
        record = json.loads(line)
        if "trace" in record:
            rows = rows_of(record)
            errors[record["name"]] = {
                r.term: r.error for r in rows if r.term in PEAKS and r.error is not None
            }
    return errors


@pytest.fixture(scope="module")
def peak_errors() -> dict[str, dict[str, float]]:
    return _peak_errors()


def test_every_traced_configuration_is_compared(peak_errors):
    assert len(peak_errors) >= 39
    assert all(set(PEAKS) <= set(errors) for errors in peak_errors.values())


@pytest.mark.parametrize("phase", PEAKS)
def test_no_phase_peak_is_priced_under_its_trace(peak_errors, phase):
    """Under the trace is where a verdict says "fits" and the job runs out of memory: at most 2% under (the
    trace's bytes are exact; the analytic model stays on the high side until a GPU measures which is right).
    With one micro batch per step (m16) backward ends with every gradient back: priced at its first layer."""
    under = {name: round(e[phase], 3) for name, e in peak_errors.items() if e[phase] < -0.02}
    assert under == {}


@pytest.mark.parametrize("phase", PEAKS)
def test_phase_peaks_agree_with_the_traces(peak_errors, phase):
    """Median within 2%; no more than two configurations over 10% (the ones BENCHMARKS.md explains: LoRA on
    Qwen2's 152k vocabulary in scoring, Qwen2 over 8 ranks). A checkpointed backward holds one recomputed
    layer and its MLP's gradients beside the layers' inputs (the trace: 1.3-1.5 layers), not two layers."""
    errors = [e[phase] for e in peak_errors.values()]
    assert abs(statistics.median(errors)) <= 0.02
    assert sum(error > 0.10 for error in errors) <= 2
