"""The traced memory estimate (autotune.probe.rank.trace): exact states against a real build, 1/W sharding,
the comparison with the analytic model, and `autotune check --trace`."""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.config.job_lengths import JobLengths, pass_tokens
from autotune.config.knobs import ProbeConfig
from autotune.memory.architecture import Architecture
from autotune.memory.breakdown import predict_components
from autotune.models.catalog import build_causal_lm, build_critic, resolve_model
from autotune.probe.rank.measure import state_bytes
from autotune.probe.rank.model_build import build_models
from autotune.probe.rank.pass_math import AUTOTUNE
from autotune.probe.rank.trace import trace_memory, warm_up
from autotune.probe.traced import MemoryTrace, TraceJob, TraceUnavailable, compare, traced_check

TINY = ProbeConfig(
    train_batch_size=8,
    rollout_batch_size=8,
    micro_batch_size=2,
    gradient_accumulation_steps=2,
    max_prompt_length=16,
    max_response_length=16,
    sharding="replicate",
    algorithm="ppo",
    kl_coef=0.05,
)
STATES = ("weights", "gradients", "optimizer")


@pytest.fixture(scope="module")
def tiny():
    return resolve_model("tiny-llama")


@functools.cache
def traced(
    config: ProbeConfig, world_size: int = 1, layout: str = "cpu", lengths: JobLengths | None = None
) -> MemoryTrace:
    """tiny-llama's trace of `config`, made once per test run: several tests read the same one, none
    changes it (a trace is a pure function of the model, the config and the lengths)."""
    spec = resolve_model("tiny-llama")
    return trace_memory(spec, None, config, world_size=world_size, layout=layout, lengths=lengths)


def _real_states(spec, config: ProbeConfig) -> dict[str, int]:
    """The CPU probe's models built for real, stepped once: what a probe rank holds between iterations."""
    models = build_models(spec, None, config, torch.device("cpu"), 1)
    warm_up(models, "cpu")
    return state_bytes(models, "cpu")


@pytest.mark.parametrize("knobs", [{}, {"use_lora": True}, {"algorithm": "grpo", "rollout_n": 2}])
def test_traced_states_are_the_real_builds_bytes(tiny, knobs):
    config = dataclasses.replace(TINY, **knobs)
    trace = traced(config)
    real = _real_states(tiny, config)
    assert {k: trace.states[k] for k in STATES} == real


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_fake_world_of_w_shards_every_state_by_exactly_1_over_w(tiny, world_size):
    # GRPO: no critic, whose one-row value head FSDP pads to a row per rank (dim 0 is what it splits)
    config = dataclasses.replace(TINY, sharding="full_shard", algorithm="grpo", rollout_n=2)
    whole = traced(config, layout="cuda").states
    # the batch shrinks with W too: train_batch_size 8 over 1, 2 or 4 ranks
    part = traced(config, world_size, "cuda").states
    for key in ("weights", "gradients"):
        assert part[key] * world_size == whole[key], key
    # Adam's moments are sharded; its step counter (one fp32 scalar per parameter tensor) is not
    tensors = sum(1 for _ in build_causal_lm(tiny, device="meta").parameters())
    assert part["optimizer"] * world_size - whole["optimizer"] == (world_size - 1) * 4 * tensors


def test_the_trace_has_every_training_pass_and_peaks_above_its_states(tiny):
    trace = traced(TINY)
    names = [p.name for p in trace.phases]
    assert names == [
        "log-prob",
        "reference",
        "values",
        "critic backward",
        "critic update",
        "actor backward",
        "actor update",
    ]
    resident = sum(trace.states.values())
    for phase in trace.phases:
        assert phase.peak == sum(phase.parts.values())
        assert phase.peak > resident, phase.name
    assert any("rollout" in note for note in trace.notes)
    assert trace.functions == AUTOTUNE.functions  # autotune's per-token math unless verl's is asked for


def test_traced_states_match_the_analytic_states_exactly_at_tiny_size(tiny):
    trace = traced(TINY)
    analytic = predict_components(Architecture.from_specs(tiny), TINY, 1, "cpu")
    rows = {r.term: r for r in compare(trace, analytic)}
    for term in ("weights", "gradients", "rollout buffer"):
        assert rows[term].analytic == rows[term].traced, term
    # AdamW's step counters (one fp32 scalar per trained tensor): the analytic model leaves these bytes out
    tensors = sum(1 for _ in build_causal_lm(tiny, device="meta").parameters())
    tensors += sum(1 for _ in build_critic(tiny, device="meta").parameters())
    optimizer = rows["optimizer states"]
    assert optimizer.traced - optimizer.analytic == 4 * tensors


SHARDED = dataclasses.replace(TINY, sharding="full_shard")
OFFLOADS = [
    {"param_offload": True},
    {"optimizer_offload": True},
    {"param_offload": True, "optimizer_offload": True},
    {"offload_policy": True},
]


@pytest.mark.parametrize("offload", OFFLOADS)
def test_offload_moves_what_the_analytic_model_moves(tiny, offload):
    """Offloaded, each phase's traced peak drops by the bytes the analytic model says offload keeps on the
    host during it (the states between phases too): the two agree on what offload moves, to Adam's step
    counters (a few bytes per trained tensor, which the analytic model leaves out)."""
    config = dataclasses.replace(SHARDED, **offload)
    arch = Architecture.from_specs(tiny)
    rows = {
        r.term: r for r in compare(traced(config, 2, "cuda"), predict_components(arch, config, 2, "cuda"))
    }
    held = {
        r.term: r for r in compare(traced(SHARDED, 2, "cuda"), predict_components(arch, SHARDED, 2, "cuda"))
    }
    for term in (
        "weights",
        "gradients",
        "optimizer states",
        "scoring: peak",
        "backward: peak",
        "update: peak",
    ):
        traced_drop = held[term].traced - rows[term].traced
        analytic_drop = held[term].analytic - rows[term].analytic
        assert traced_drop == pytest.approx(analytic_drop, rel=1e-4, abs=1024), term
    states = ("weights", "gradients", "optimizer states")
    assert sum(held[t].traced for t in states) > sum(rows[t].traced for t in states)
    assert held["update: peak"].traced > rows["update: peak"].traced  # the critic's stay away meanwhile


def test_offload_outside_fsdp_on_a_gpu_is_refused_in_one_line(tiny):
    config = dataclasses.replace(SHARDED, param_offload=True)
    with pytest.raises(TraceUnavailable, match="offload is verl's FSDP move on a GPU"):
        trace_memory(tiny, None, config, world_size=2, layout="cpu")


@pytest.mark.e2e
def test_a_config_the_tracer_cannot_run_says_so_in_one_line(tiny):
    config = dataclasses.replace(SHARDED, param_offload=True)
    said = traced_check(TraceJob(tiny, None, config, 2, "cpu"))
    assert said.failed and "offload is verl's FSDP move on a GPU" in said.failed
    assert len(said.lines()) == 1 and "the analytic model stands" in said.lines()[0]


@pytest.mark.e2e
def test_the_trace_process_gives_what_the_trace_gives(tiny):
    in_process = traced(TINY)
    said = traced_check(TraceJob(tiny, None, TINY, 1, "cpu"))
    assert said.failed is None
    rows = {r.term: r.traced for r in said.rows}
    assert rows["weights"] == in_process.states["weights"]
    assert rows["update: peak"] == in_process.peak("update").peak


def test_replicate_over_two_ranks_takes_ddp_buckets_from_the_analytic_model(tiny):
    trace = traced(TINY, 2)
    buckets = predict_components(Architecture.from_specs(tiny), TINY, 2, "cpu").ddp_buckets
    assert trace.states["ddp_buckets"] == buckets > 0
    assert any("DDP" in note for note in trace.notes)


@pytest.mark.e2e
def test_check_trace_prints_both_estimates_per_phase(tmp_path: Path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "rollout_batch_size: 8\ntrain_batch_size: 8\nmicro_batch_size: 2\ngradient_accumulation_steps: 2\n"
        "max_prompt_length: 16\nmax_response_length: 16\n"
        "actor_model_config:\n  model_name_or_path: tiny-llama\n"
    )
    run = [sys.executable, "-m", "autotune", "check", str(config), "--gpus", "2", "--trace"]
    shown = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert shown.returncode in (0, 1), shown.stderr
    assert "traced memory at the limits (2 rank(s)" in shown.stdout  # no data: the limits, as the verdict
    for term in ("scoring: peak", "backward: peak", "update: peak", "weights"):
        assert term in shown.stdout, term
    assert "Traceback" not in shown.stderr
    # progress on stderr while it runs: the estimate first, then each pass as it is traced
    progress = shown.stderr.splitlines()
    assert progress[0].startswith("tracing 5 passes of tiny-llama (2 layers) over 2 rank(s)"), progress
    assert "about " in progress[0] and progress[1].startswith("  models built: ")
    assert any(line.startswith("  traced actor update: ") for line in progress)
    as_json = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=300)
    trace = json.loads(as_json.stdout)["trace"]
    assert {r["term"] for r in trace["rows"]} >= {"weights", "update: peak"}
    assert trace["estimate_seconds"] is not None and "actor update" in trace["pass_seconds"]


@pytest.mark.e2e
def test_the_traced_peaks_of_a_tiny_model_are_what_its_real_tensors_hold():
    """bench.trace_measured runs GRPO's passes on tiny-llama for real, its real tensors under torch's tracker:
    the fake-tensor trace must count what the tracker counts of the real tensors, to 1 MiB a pass, and the
    states byte for byte. (The RSS comparison lives in the benchmark, BENCHMARKS.md "Traced memory": in the
    full suite the child's RSS peak came out twice its value in a fresh shell, 522 vs 270 MB.)"""
    root = Path(__file__).resolve().parents[1]

    def run(mode: str) -> dict:
        argv = [sys.executable, "-m", "bench.trace_measured", mode, "grpo"]
        done = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=300, check=True)
        return json.loads(done.stdout.splitlines()[-1])

    traced, measured = run("--trace"), run("--measure")
    assert measured["states"] == traced["states"]  # byte for byte
    assert set(measured["tracked"]) == set(traced["added"])
    for phase, tracked in measured["tracked"].items():
        assert abs(traced["added"][phase] - tracked) <= 2**20, phase


def test_check_trace_on_a_file_without_batch_sizes_says_why_in_one_line(tmp_path: Path):
    from autotune.check import CheckOptions, check

    overrides = tmp_path / "overrides.txt"
    overrides.write_text("actor_rollout_ref.model.path=meta-llama/Llama-2-7b-hf\n")
    result = check(CheckOptions(path=overrides, trace=True))
    assert result.traced is not None and "batch sizes" in (result.traced.failed or "")
    assert result.traced.lines() == [
        "traced memory: not run: the file lacks the batch sizes the trace needs; the analytic model stands"
    ]
    assert result.to_dict()["trace"]["failed"] == result.traced.failed


# --- on the job's lengths (`check --trace` on the data the verdict judged) --------------------------------

SHORT = JobLengths.from_counts([3, 4, 5, 6], [2, 3, 4, 5])  # well under TINY's limits of 16 + 16
DATA_CONFIG = (  # limits far above gsm8k_like's samples (prompts ~82 tokens, responses ~120)
    "rollout_batch_size: 4\ntrain_batch_size: 4\nmicro_batch_size: 2\ngradient_accumulation_steps: 1\n"
    "max_prompt_length: 256\nmax_response_length: 512\nalgorithm: grpo\nrollout_n: 2\n"
    "actor_model_config:\n  model_name_or_path: tiny-llama\n"
)
GSM8K_LIKE = Path(__file__).resolve().parent / "data" / "gsm8k_like.jsonl"


def test_a_micro_batch_on_the_data_has_the_datas_samples_within_the_limits():
    from autotune.probe.rank.trace_passes import micro_batch

    micro = micro_batch(TINY, 20, SHORT)  # the data's mean sequence is 4.5 + 3.5 = 8 tokens
    assert sum(micro.lengths) == 20 and len(micro) == 2
    assert [len(p) for p in micro.prompts] == [6, 6]  # the data's share: 4.5 / 8 of each sample
    at_limits = micro_batch(TINY, 64, JobLengths())
    assert at_limits.lengths == [32, 32] and [len(p) for p in at_limits.prompts] == [16, 16]
    long = JobLengths.from_counts([16], [16])  # one sample and a quarter of the mean: two within Lp + Lr
    assert micro_batch(TINY, 40, long).lengths == [20, 20]


def test_the_trace_packs_each_pass_from_the_jobs_lengths_as_the_analytic_model_prices(tiny):
    on_data, at_limits = traced(TINY, lengths=SHORT), traced(TINY)
    assert (on_data.lengths, at_limits.lengths) == ("data", "max")
    priced = predict_components(Architecture.from_specs(tiny), TINY, 1, "cpu", SHORT).tokens
    assert on_data.tokens == priced == pass_tokens(TINY, SHORT, 1).to_dict()
    assert at_limits.tokens == pass_tokens(TINY, JobLengths(), 1).to_dict()
    for kind, tokens in on_data.tokens.items():  # a trace that ignored the data would pack the limits'
        assert 0 < tokens < at_limits.tokens[kind], kind
    for phase in ("scoring", "update"):
        assert on_data.peak(phase).peak < at_limits.peak(phase).peak, phase


def test_the_traced_check_says_which_lengths_it_traced():
    from autotune.probe.traced import TracedCheck

    used = "prompts from the data (median 4, max 6 tokens), responses from the data (median 3, max 5 tokens)"
    tokens = {"update": 10, "forward": 12, "critic_update": 0}
    said = TracedCheck([], [], 1.0, 1, "cpu", lengths="data", lengths_used=used, tokens=tokens, priced=tokens)
    assert said.lines()[0].startswith(f"traced memory on {used} (1 rank(s)")
    assert "  · micro batches traced, tokens per GPU: update 10, forward 12" in said.lines()
    assert said.to_dict()["lengths"] == "data" and said.to_dict()["priced_tokens"] == tokens
    other = dataclasses.replace(said, priced={**tokens, "forward": 13})
    assert other.lines()[-1].endswith("forward 12 (the analytic model prices forward 13)")
    at_limits = TracedCheck([], [], 1.0, 1, "cpu")
    assert at_limits.lines()[0].startswith("traced memory at the limits (1 rank(s)")
    assert at_limits.to_dict()["lengths"] == "max"


def _traced_on(monkeypatch, tmp_path: Path, text: str = DATA_CONFIG, **options):
    """check() on a config (DATA_CONFIG) with the trace replaced by a stand-in: the lengths it was asked to
    trace."""
    from autotune.check import CheckOptions, check
    from autotune.probe import traced as traced_module
    from autotune.probe.traced import TracedCheck

    asked: list[JobLengths] = []

    def stand_in(job, on_pass=None):
        asked.append(job.lengths)
        return TracedCheck([], [], 0.0, job.world_size, job.layout, lengths=job.lengths.label)

    monkeypatch.setattr(traced_module, "traced_check", stand_in)
    config = tmp_path / ("trl_config.yaml" if "num_generations" in text else "config.yaml")
    config.write_text(text)
    result = check(CheckOptions(path=config, gpu="a100-80g", trace=True, **options))
    (lengths,) = asked
    return result, lengths


def test_check_traces_on_the_lengths_of_its_verdict(monkeypatch, tmp_path: Path):
    result, lengths = _traced_on(monkeypatch, tmp_path, data=GSM8K_LIKE)
    assert result.memory["lengths"] == "data" and lengths.on_data
    assert lengths.describe(256, 512) == result.memory["lengths_used"]
    worst = result.memory["at_max_lengths"]["predicted_peak_gib"]
    assert (
        f"the worst case at the limits (256+512 tokens a sample) is not traced: the memory model puts "
        f"it at {worst:g} GiB" in result.traced.notes[0]
    )
    # asked for the worst case: the limits, and the note says the verdict is on the data
    result, lengths = _traced_on(monkeypatch, tmp_path, data=GSM8K_LIKE, trace_lengths="max")
    assert not lengths.on_data and result.memory["lengths"] == "data"
    assert "the memory verdict is on the data's lengths" in result.traced.notes[0]
    result, lengths = _traced_on(monkeypatch, tmp_path)  # no data: the limits, as the verdict
    assert not lengths.on_data and result.memory["lengths"] == "max"
    assert (
        result.traced.notes[0]
        == "traced at the limits (256+512 tokens a sample), the worst case; as the verdict"
    )


def test_check_traces_a_trl_file_at_the_limits_it_pads_to(monkeypatch, tmp_path: Path):
    """TRL pads every batch to its longest prompt and the completion limit: its verdict prices the limits,
    whatever the data, and so does the trace."""
    trl = "generation_batch_size: 8\nnum_generations: 4\nmax_completion_length: 64\n"
    result, lengths = _traced_on(monkeypatch, tmp_path, trl, data=GSM8K_LIKE, model="tiny-llama")
    assert not lengths.on_data and result.memory["tokens"] == {}  # padded rows, not packed tokens
    assert result.memory["lengths"] == "max"  # as its verdict says, whatever the data


def test_trace_lengths_without_trace_or_without_data_is_one_line(cli_here, tmp_path: Path):
    config = tmp_path / "config.yaml"
    config.write_text(DATA_CONFIG)
    for args, said in (
        (["--trace-lengths", "max"], "add --trace"),
        (["--trace", "--trace-lengths", "data"], "pass --data FILE or --verl-log FILE"),
        (["--trace", "--trace-lengths", "min"], "invalid choice"),
    ):
        done = cli_here("check", str(config), *args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, done.stderr


@pytest.mark.e2e
def test_check_trace_on_data_traces_the_datas_micro_batches(tmp_path: Path):
    config = tmp_path / "config.yaml"
    config.write_text(DATA_CONFIG)
    run = [sys.executable, "-m", "autotune", "check", str(config), "--gpu", "a100-80g", "--trace"]
    shown = subprocess.run(
        [*run, "--data", str(GSM8K_LIKE), "--json"], capture_output=True, text=True, timeout=300
    )
    assert shown.returncode in (0, 1), shown.stderr
    report = json.loads(shown.stdout)
    memory, trace = report["memory"], report["trace"]
    assert trace["failed"] is None and trace["lengths"] == memory["lengths"] == "data"
    assert trace["lengths_used"] == memory["lengths_used"]
    priced = {kind: tokens for kind, tokens in memory["tokens"].items() if tokens}  # GRPO: no critic
    assert trace["tokens"] == priced and trace["priced_tokens"] == memory["tokens"]
    assert trace["tokens"]["update"] < memory["at_max_lengths"]["tokens"]["update"] == 2 * 768
    rows = {r["term"]: r for r in trace["rows"]}
    assert abs(rows["scoring: peak"]["error"]) < 0.10  # the analytic model on the same lengths
