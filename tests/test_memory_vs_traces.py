"""The memory model against the committed traces at 7B-13B (bench/results/trace.jsonl, `bench.trace collect`)
and at 32B-72B with offload and token budgets of 16k-24k (bench/results/trace-scale.jsonl, `--grid scale`).

The traces are measurements: tensor bytes seen by torch's memory trackers on fake tensors, per pass, at real
sizes. The analytic side is recomputed by today's model, so a change to the model that moves a phase peak away
from what was traced fails here, without tracing again. No probes, no traces run: a few seconds.
"""

import json
import statistics

import pytest

from bench.common import RESULTS
from bench.trace import OUT, PEAKS, rows_of

SCALE = RESULTS / "trace-scale.jsonl"


def _peak_errors(path=OUT) -> dict[str, dict[str, float]]:
    """{config name: {phase peak: (analytic - traced) / traced}} for every traced configuration."""
    errors = {}
    for line in path.read_text().splitlines():
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


# --- 32B and 72B ------------------------------------------------------------------------------------------


def test_at_32b_and_72b_the_update_is_within_10_percent_of_its_trace():
    """Full-parameter GRPO over 8 and 32 ranks, offloaded or not, at 16k-24k tokens per micro batch: the
    update (and its backward) within 10% of the trace, never under it by more than 2%."""
    errors = _peak_errors(SCALE)
    assert {name.split("/")[1] for name in errors} == {"qwen2.5-32b", "qwen2.5-72b"}
    assert any("offload" in name for name in errors) and any("offload" not in name for name in errors)
    for name, found in errors.items():
        for phase in ("backward: peak", "update: peak"):
            assert -0.02 <= found[phase] <= 0.10, (name, phase, found[phase])


def test_at_32b_and_72b_scoring_is_over_its_trace_by_the_two_gathered_units_at_most():
    """Scoring: the analytic model keeps two gathered units (the LM head's size) beside the logits; at these
    token counts the trace's peak comes after the LM head resharded, with none gathered. That is the whole
    difference (BENCHMARKS.md, Traced memory at scale): never under the trace."""
    for line in SCALE.read_text().splitlines():
        record = json.loads(line)
        rows = {row.term: row for row in rows_of(record)}
        scoring, gathered = rows["scoring: peak"], rows["scoring: gathered weights"]
        excess = scoring.analytic - scoring.traced
        assert -0.02 * scoring.traced <= excess <= gathered.analytic + 0.02 * scoring.traced, record["name"]
