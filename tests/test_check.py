"""`autotune check` on the seed article's three configs (§5), its KL pitfall (train 300 / rollout 128), verl
override files, and bad input."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import numpy as np
import pytest

from autotune.check import (
    CheckOptions,
    check,
    length_findings,
    read_target,
    registry_name,
    rollout_findings,
)
from autotune.cli import main
from autotune.config.knobs import ProbeConfig
from autotune.data.lengths import LengthReport
from autotune.formats.rollout import RolloutEngine
from autotune.formats.verl import format_overrides, verl_overrides
from autotune.memory.architecture import Architecture
from autotune.memory.calibration import MemoryModel
from autotune.memory.gpus import gpu_memory_gib, normalise
from autotune.memory.sharded import estimate_with
from autotune.models.catalog import resolve_model
from autotune.units import GIB

DATA = Path(__file__).resolve().parent / "data"
SCENARIO_1 = DATA / "seed_scenario_1.yaml"  # 2× A100 80G, Llama-2-7B LoRA r=64, DeBERTa reward
SCENARIO_2 = DATA / "seed_scenario_2.yaml"  # 4× A100 40G, Llama-2-13B full fine-tuning, FSDP FULL_SHARD
SCENARIO_3 = DATA / "seed_scenario_3.yaml"  # 1× RTX 3090 24G, TinyLlama 1.1B LoRA r=32
KL_PITFALL = DATA / "seed_scenario_train300_rollout128.yaml"  # scenario 1 with train_batch_size 300


def held_as(config: ProbeConfig, sharding: str = "none", offload: bool = False) -> ProbeConfig:
    """`config` held as the seed article's fsdp_config says: "none" (replicated), "full_shard" or
    "shard_grad_op"; `offload`, FSDP's CPU offload (verl's offload_policy)."""
    layout = "replicate" if sharding == "none" else sharding
    return dataclasses.replace(config, sharding=layout, offload_policy=offload)


def estimate_memory(arch, config: ProbeConfig, gpus: int):
    """Peak bytes per GPU under the memory model with CUDA priors (uncalibrated)."""
    return estimate_with(MemoryModel(arch, gpus, "cuda"), config)


def _check(path: Path, **options) -> tuple[int, dict]:
    result = check(CheckOptions(path=path, **options))
    return result.exit_code, result.to_dict()


def _checks(report: dict) -> list[str]:
    return [p["check"] for p in report["problems"]]


def _error(capsys, *args: str) -> str:
    assert main(["check", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


# --- the article's configs ---------------------------------------------------------------------------


def test_the_articles_configs_parse_as_written():
    for path in (SCENARIO_1, SCENARIO_2, SCENARIO_3, KL_PITFALL):
        target = read_target(path)
        assert target.kind == "seed schema" and not target.findings, path
    s2 = read_target(SCENARIO_2)
    assert (s2.sharding, s2.offload, s2.config.use_lora) == ("full_shard", False, False)
    assert registry_name(s2.model) == "llama-2-13b"
    s1 = read_target(SCENARIO_1)
    assert (
        s1.config.use_lora and s1.config.lora_r == 64 and registry_name(s1.reward_model) == "deberta-v3-large"
    )


@pytest.mark.e2e
def test_scenario_1_through_the_real_cli(cli):
    """2× A100 80G, 7B LoRA at micro 32 × (200+256) tokens, gradient checkpointing on (verl's default; the
    article's config is silent): the batch rules hold and it fits. The article's "≈ 42 GiB per GPU" includes
    generation; verl generates in vLLM's own share, so the training side peaks in the update: 32 × 456 =
    14,592 tokens packed (no data given: every sample at the limits)."""
    proc = cli(
        "check", str(SCENARIO_1), "--gpus", "2", "--gpu", "a100-80g", "--cores", "8", "--json", timeout=120
    )
    assert proc.returncode == 0, proc.stdout
    report = json.loads(proc.stdout)
    assert report["problems"] == []  # 512 = 4×128 rollouts = 2 steps of 32×4×2; 4 workers ≤ 8 cores
    memory = report["memory"]
    assert memory["fits"] and 25 < memory["predicted_peak_gib"] < 35
    assert memory["tokens"]["update"] == 32 * 456 and "at the limit 256" in memory["lengths_used"]


def test_scenario_1_without_checkpointing_does_not_fit(tmp_path):
    """Without gradient checkpointing the probe keeps every layer's activations: 32 × 456 tokens × 32 layers
    × (243,712 + 12·4096 + 2·11008) B (under autocast, with LoRA's fp32 adapter inputs) = 148 GB."""
    text = SCENARIO_1.read_text().replace("use_lora: true", "use_lora: true\n  gradient_checkpointing: false")
    exit_code, report = _check(
        _write(tmp_path, text, "no_checkpointing.yaml"), gpus=2, gpu="a100-80g", cores=8
    )
    assert exit_code == 1 and _checks(report) == ["memory"]
    memory = report["memory"]
    assert memory["predicted_peak_gib"] > 80 and memory["phases_gib"]["update"] > 100
    fix = report["problems"][0]["fix"]
    # checkpointing alone fits: it comes first, before the article's batch steps (and no length is cut)
    assert fix.startswith("fits with any one of: 1) gradient_checkpointing: true alone: 26.0 GiB;")
    assert "2) micro_batch_size 32→8: " in fix  # or the micro batch alone, halved until it fits
    assert "max_prompt_length" not in fix
    assert "gradient_accumulation_steps does not lower the peak" in fix


@pytest.mark.parametrize("length", [-5, -(2**63) - 1])
def test_a_length_that_is_not_a_size_gets_no_memory_verdict(tmp_path, length):
    """A length below 1 is a finding, and no peak is priced on it: -2^63-1 tokens once overflowed numpy in the
    memory model (a traceback, found by test_input_surface's random configs), and -5 gave a peak."""
    text = SCENARIO_3.read_text().replace("max_prompt_length: 96", f"max_prompt_length: {length}")
    assert str(length) in text
    exit_code, report = _check(_write(tmp_path, text), gpu="rtx3090", cores=8)
    assert exit_code == 1 and _checks(report) == ["values"]
    assert report["memory"] is None
    assert "memory not checked: max_prompt_length above must be fixed first" in json.dumps(report)


def test_scenario_2_does_not_fit_four_a100_40g_as_computed_by_hand():
    """13B full fine-tuning (PPO: actor + critic + reference; the config names no reward model), FSDP
    FULL_SHARD over 4× A100 40G, no offload, gradient checkpointing on (verl's default: the config is silent),
    micro 16 × (128+192) = 5,120 tokens packed.

    By hand, per GPU (GiB = 2^30 B):
      parameters: actor 13.016e9 (Llama-2-13b), critic 12.852e9 (the body + a 1-output value head)
      trainable, mixed-precision Adam = 16 B/param (fp32 weights 4 + fp32 grads 4 + two fp32 moments 8):
        (13.016e9 + 12.852e9) × 16 B = 413.9e9 B; ÷ 4 GPUs = 103.5e9 B        = 96.37 GiB
      the bf16 reference's shards live on the host (verl's forward-only engines offload them)
      => states 96.4 GiB: the actor's own 16 B/param alone is 13.016e9 × 16 / 4 = 48.5 GiB > 40 GiB.
      the update phase peaks in AdamW's foreach step: one fp32 temporary of the larger model's local shard,
        13.016e9 × 4 B / 4 = 13.02e9 B                                            = 12.12 GiB (dynamic)
      (the rollout is vLLM's pool, judged by its share: no generate phase on the training side)
      CUDA prior: 0.75 GiB + 96.37 + 1.1 × 12.12 = 110.4 GiB, the factor on the dynamic bytes only.
    Does not fit: 110.4 GiB > 40 GiB, and even the sharded states alone (96.4 GiB) are 2.4× the card.
    """
    exit_code, report = _check(SCENARIO_2, gpus=4, gpu="a100-40g", cores=8)
    assert exit_code == 1 and _checks(report) == ["memory"]
    memory = report["memory"]
    hand_states = (13.016e9 + 12.852e9) * 16 / 4
    hand_step = 13.016e9 * 4 / 4
    hand_peak = 0.75 * GIB + hand_states + 1.1 * hand_step
    assert sum(memory["states_gib"].values()) == pytest.approx(hand_states / GIB, rel=0.01)
    assert set(memory["phases_gib"]) == {"scoring", "update"}
    assert memory["phases_gib"]["update"] == pytest.approx(hand_step / GIB, rel=0.01)
    assert memory["predicted_peak_gib"] == pytest.approx(hand_peak / GIB, rel=0.01)  # 110.4
    assert memory["predicted_peak_gib"] > 40 and memory["fits"] is False
    problem = report["problems"][0]
    assert "FULL_SHARD over 4 GPUs" in problem["problem"] and "÷ 4" in problem["problem"]
    # first aid: a smaller micro batch lowers nothing (the states, 96 GiB, decide): never offered; LoRA or
    # offload, each alone, fits
    assert "micro_batch_size" not in problem["fix"] and "rollout_batch_size" not in problem["fix"]
    assert "1) use_lora: true (r=16): " in problem["fix"] and "offload_policy: true" in problem["fix"]


def test_first_aid_offers_the_knob_of_the_phase_that_decides(tmp_path):
    """Qwen2.5-7B GRPO on 8 × A100-80G, micro batch 16, log-prob micro batch 32, 1024/2048 tokens: the
    scoring phase decides the peak, so halving the micro batch changes nothing and is not offered; the
    log-prob micro batch is, and it fits."""
    overrides = "\n".join(
        [
            "algorithm.adv_estimator=grpo",
            "data.train_batch_size=256",
            "data.max_prompt_length=1024",
            "data.max_response_length=2048",
            "actor_rollout_ref.model.path=qwen2.5-7b",
            "actor_rollout_ref.actor.ppo_mini_batch_size=64",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.rollout.n=5",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "trainer.n_gpus_per_node=8",
            "trainer.nnodes=1",
        ]
    )
    exit_code, report = _check(_write(tmp_path, overrides + "\n", "q7b.txt"), gpu="a100-80g", cores=64)
    memory = next(p for p in report["problems"] if p["check"] == "memory")
    assert exit_code == 1 and "scoring phase" in memory["problem"]
    assert memory["fix"].startswith("fits with any one of: 1) log_prob_micro_batch_size 32→16: ")
    assert "micro_batch_size 16→" not in memory["fix"]


def test_scenario_2_sharding_is_what_makes_the_difference():
    spec, config = resolve_model("llama-2-13b"), read_target(SCENARIO_2).config
    arch = Architecture.from_specs(spec)
    assert config.sharding == "full_shard" and config.gradient_checkpointing
    replicated = estimate_memory(arch, held_as(config, "none"), 4)
    sharded = estimate_memory(arch, config, 4)
    assert replicated.peak == MemoryModel(arch, 4, "cuda").predict(held_as(config, "none"))
    assert sharded.peak < replicated.peak / 2
    # FSDP's CPU offload (the article's cpu_offload, verl's offload_policy): the states live on the host
    offloaded = estimate_memory(arch, held_as(config, "full_shard", offload=True), 4)
    assert sum(offloaded.states.values()) < 1 * GIB
    assert estimate_memory(arch, held_as(config, "full_shard", offload=True), 4).peak < 40 * GIB


def test_scenario_3_is_clean_on_an_rtx_3090():
    exit_code, report = _check(SCENARIO_3, gpus=1, gpu="rtx3090", cores=2)
    assert exit_code == 0 and report["problems"] == []
    assert report["memory"]["fits"] and report["memory"]["predicted_peak_gib"] < 24


def test_train_300_rollout_128_drops_samples(capsys):
    assert main(["check", str(KL_PITFALL), "--gpus", "2", "--memory-budget", "1000", "--cores", "8"]) == 1
    out = capsys.readouterr().out
    assert "train_batch_size=300 is not a multiple of rollout_batch_size=128" in out
    assert "3×128=384 samples and trains on 300, so 84 (22%) are dropped" in out and "KL" in out
    assert "fix: train_batch_size: 512 (4 rollouts) or 256 (2)" in out  # 384 breaks the 256-sample mini batch
    assert "micro_batch_size×gradient_accumulation_steps×gpus=32×4×2=256" in out
    assert "problems found" in out.splitlines()[-1]


def test_workers_are_checked_against_the_cores_given_never_this_machines():
    _, report = _check(SCENARIO_2, gpus=4, cores=4)
    (workers,) = [p for p in report["warnings"] if p["check"] == "workers"]  # advice: exit code unchanged
    assert "num_rollout_workers=6 exceeds the 4 cores given" in workers["problem"]
    assert workers["fix"] == "num_rollout_workers: 4"
    _, report = _check(SCENARIO_3, gpus=1)
    (note,) = [f for f in report["findings"] if f["check"] == "workers"]
    assert note["severity"] == "note" and "pass --cores N" in note["problem"]


def test_a_file_for_an_8_gpu_node_gets_no_warning_about_this_machines_cores(tmp_path):
    """The issue: num_rollout_workers=8 "exceeds the 2 physical cores of this machine" for a file meant for
    an 8-GPU node. Without --cores the file's machine is unknown, and this one is not it."""
    config = dataclasses.replace(ProbeConfig(), rollout_batch_size=16, num_rollout_workers=64)
    text = format_overrides(verl_overrides(config, 1).values)
    _, report = _check(_write(tmp_path, text, "verl_overrides.txt"))
    assert not [w for w in report["warnings"] if w["check"] == "workers"]
    assert [f for f in report["findings"] if f["check"] == "workers" and f["severity"] == "note"]


def test_without_a_card_the_peak_is_a_note_and_gpus_default_to_one():
    exit_code, report = _check(SCENARIO_3, cores=8)
    assert exit_code == 0
    notes = " ".join(n["problem"] for n in report["notes"])
    assert "assuming 1 GPU" in notes and "pass --gpu NAME or --memory-budget GiB" in notes


# --- other rules ---------------------------------------------------------------------------------------


def _write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


BASE = """rollout_batch_size: 128
train_batch_size: 512
micro_batch_size: 4
gradient_accumulation_steps: 4
num_rollout_workers: 2
max_prompt_length: 64
max_response_length: 64
actor_model_config:
  model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
"""


def test_unknown_keys_are_findings_with_the_closest_key(tmp_path):
    path = _write(
        tmp_path, BASE + "kl_coeff: 0.1\nlog_level: DEBUG\nreward_model_config:\n  trainabel: true\n"
    )
    exit_code, report = _check(path, cores=8)
    assert exit_code == 1
    problems = [p["problem"] for p in report["problems"]]
    assert any("unknown key kl_coeff" in p and "'kl_coef'" in p for p in problems)
    assert any("reward_model_config.trainabel" in p and "'trainable'" in p for p in problems)
    assert not any("log_level" in p for p in problems)  # the article's own extra keys are accepted


def test_trainable_reward_model_and_starving_rollout(tmp_path):
    text = BASE.replace("rollout_batch_size: 128", "rollout_batch_size: 32")
    path = _write(tmp_path, text + "reward_model_config:\n  model_name_or_path: x\n  trainable: true\n")
    _, report = _check(path, cores=8)
    assert _checks(report) == ["reward"]
    (rollout,) = [p for p in report["warnings"] if p["check"] == "rollout"]  # a heuristic: a warning
    assert rollout["fix"] == "rollout_batch_size: 64" and rollout["severity"] == "warning"
    # per GPU: 128 over 8 GPUs is 16 each
    config = ProbeConfig(rollout_batch_size=128, train_batch_size=1024)
    assert rollout_findings(config, 8) and not rollout_findings(config, 2)


VERL_EXAMPLES = DATA / "verl_examples"  # verl's own launch scripts, sources named in each file's first line
GSM8K_LIKE = (
    DATA / "gsm8k_like.jsonl"
)  # GSM8K-shaped records (tools/gsm8k_like.py): what those scripts train on


@pytest.mark.parametrize(
    "script",
    [
        "grpo_trainer/run_qwen2-7b.sh",  # Qwen2-7B GRPO, 8 GPUs, micro 40, 512/1024
        "grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh",  # Qwen2.5-3B LoRA GRPO, 2 GPUs, micro 40
        "ppo_trainer/run_deepseek7b_llm.sh",  # deepseek-llm-7b PPO with a critic, 8 GPUs, 512/512
        "ppo_trainer/run_qwen2-7b_seq_balance.sh",  # Qwen2-7B PPO, dynamic batch size, 4096/4096
    ],
)
@pytest.mark.e2e  # bash reads the script
def test_verls_examples_fit_their_stated_hardware_on_gsm8k_like_data(script):
    """verl's example scripts (verl's main branch at b178a3cd5, version 0.8.0.dev: the PPO ones name keys
    verl 0.9.1 no longer has, which is all that is wrong with them) on the 80 GiB cards they ran on, with
    the model and GPUs the file names: each fits on the data, and the limits' worst case is stated beside."""
    exit_code, report = _check(VERL_EXAMPLES / script, gpu="a100-80g", data=GSM8K_LIKE)
    assert all("unknown key" in p["problem"] for p in report["problems"]), report["problems"]
    assert exit_code == (1 if report["problems"] else 0)
    memory = report["memory"]
    assert memory["verdict"] == "fits" and memory["lengths"] == "data", memory
    assert "from the data" in memory["lengths_used"]
    assert memory["at_max_lengths"]["verdict"] in ("fits", "tight")  # never "over": they ran


@pytest.mark.e2e  # bash reads the script
def test_verls_grpo_example_fits_its_stated_hardware_on_its_data():
    """examples/grpo_trainer/run_qwen2-7b.sh: Qwen2-7B GRPO on 8 × 80 GiB,
    micro batch 40, limits 512/1024. verl packs: a micro batch costs its samples' tokens, not 40 × 1536."""
    script = VERL_EXAMPLES / "grpo_trainer" / "run_qwen2-7b.sh"
    exit_code, report = _check(script, gpu="a100-80g", data=GSM8K_LIKE)  # its model, its 8 GPUs
    assert exit_code == 0 and report["problems"] == [], report["problems"]
    memory = report["memory"]
    assert memory["fits"] and memory["predicted_peak_gib"] < 40
    assert (
        "prompts from the data" in memory["lengths_used"]
        and "responses from the data" in memory["lengths_used"]
    )
    assert 40 * 100 < memory["tokens"]["update"] < 40 * 1536  # the p99 of 40 GSM8K-like samples
    # responses grow in RL training: at the limits it is tight, and the fix is a budget that bounds it
    assert memory["at_max_lengths"]["tokens"]["update"] == 40 * 1536
    assert memory["at_max_lengths"]["verdict"] == "tight"
    (grow,) = [w for w in report["warnings"] if "when responses grow" in w["problem"]]
    assert grow["fix"].startswith("use_dynamic_bsz: true with ppo_max_token_len_per_gpu: ")
    # without data every sample is at the limits: tight (a warning), not out of memory
    exit_code, report = _check(script, gpu="a100-80g")
    assert exit_code == 0 and report["memory"]["verdict"] == "tight" and report["memory"]["lengths"] == "max"
    assert report["memory"]["lengths_used"] == "prompts at the limit 512, responses at the limit 1024"


@pytest.mark.e2e  # bash reads the script
def test_verls_dynamic_batch_example_is_bounded_by_its_budgets():
    """examples/ppo_trainer/run_qwen2-7b_seq_balance.sh: PPO with use_dynamic_bsz, budgets 24000 tokens
    (actor, rollout and reference), limits 4096/4096. At the limits a micro batch holds the whole sequences
    the budget takes (two of 8192); its newer keys are verl 0.9.1's unknown keys, nothing else."""
    script = VERL_EXAMPLES / "ppo_trainer" / "run_qwen2-7b_seq_balance.sh"
    exit_code, report = _check(script, gpu="a100-80g", data=GSM8K_LIKE)
    assert exit_code == 1 and report["problems"]
    assert all("unknown key" in p["problem"] for p in report["problems"]), report["problems"]
    memory = report["memory"]
    assert memory["fits"] and memory["at_max_lengths"]["verdict"] == "fits"
    assert memory["tokens"]["forward"] == 24000 and memory["at_max_lengths"]["tokens"]["update"] == 2 * 8192
    assert not [w for w in report["warnings"] if "when responses grow" in w["problem"]]


def test_lengths_against_the_data(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": "the " * i, "response": "the " * i}) + "\n" for i in range(1, 101))
    )
    # prompts 2..101 tokens (p95 96.05 -> 104), responses 2..101 (p90 91.1 -> 96)
    short = _write(tmp_path, BASE.replace("max_prompt_length: 64", "max_prompt_length: 32"), "short.yaml")
    _, report = _check(short, data=data, cores=8)
    (prompt,) = [
        p for p in report["problems"] if p["check"] == "lengths" and "max_prompt_length" in p["problem"]
    ]
    assert (
        "below the data's p95 suggestion 104" in prompt["problem"]
        and prompt["fix"] == "max_prompt_length: 104"
    )
    long = _write(tmp_path, BASE.replace("max_response_length: 64", "max_response_length: 1024"), "long.yaml")
    _, report = _check(long, data=data, cores=8)
    # verl packs the tokens the samples have: a larger limit costs it nothing, so no "memory wasted"
    assert not [p for p in report["problems"] if "memory wasted" in p["problem"]]
    assert "responses from the data (median 52, max 102 tokens)" in report["memory"]["lengths_used"]
    # a trainer that pads to the limits (TRL) reserves memory for tokens the data never has
    counts = np.arange(2, 102)
    lengths = LengthReport(
        str(data), "m", "t", True, "prompt", "response", 100, 0, False, (95,), counts, counts
    )
    found = length_findings(read_target(long).config, lengths, packed=False)
    (wasted,) = [f for f in found if "memory wasted" in f.problem]
    assert wasted.fix == "max_response_length: 96"


def test_fsdp_config_at_the_top_level_reads_the_same(tmp_path):
    nested = read_target(SCENARIO_2)
    text = (
        SCENARIO_2.read_text().replace("  fsdp_config:", "fsdp_config:").replace("    sharding", "  sharding")
    )
    flat = read_target(_write(tmp_path, text.replace("    cpu_offload", "  cpu_offload")))
    assert (flat.sharding, flat.offload, flat.config) == (nested.sharding, nested.offload, nested.config)


def test_verl_override_files_are_checked_with_verls_rules(tmp_path):
    config = ProbeConfig(
        rollout_batch_size=128,
        train_batch_size=512,
        micro_batch_size=8,
        gradient_accumulation_steps=4,
        num_rollout_workers=2,
        max_prompt_length=128,
        max_response_length=128,
        sharding="full_shard",
    )
    engine = RolloutEngine(gpu_memory_utilization=0.25, max_model_len=256)
    values = verl_overrides(config, 2, model_path="Qwen/Qwen2.5-0.5B", engine=engine).values
    good = _write(tmp_path, format_overrides(values), "verl_overrides.txt")
    exit_code, report = _check(good, gpu="rtx4090", cores=8)
    assert (exit_code, report["kind"], report["gpus"]) == (0, "verl overrides", 2), report["problems"]
    assert report["config"]["micro_batch_size"] == 8 and report["sharding"] == "full_shard"
    # a share of 0.9 of the card does not fit beside the training states resident while vLLM generates
    # (about 4 GiB of weights and Adam's states per GPU, sharded over 2, and the runtime)
    values["actor_rollout_ref.rollout.gpu_memory_utilization"] = 0.9
    exit_code, report = _check(
        _write(tmp_path, format_overrides(values), "greedy.txt"), gpu="rtx4090", cores=8
    )
    memory = next(p for p in report["problems"] if p["check"] == "memory")
    assert exit_code == 1 and "in the rollout phase" in memory["problem"]
    assert report["memory"]["decided_by_phase"] == "rollout" and report["memory"]["verdict"] == "over"
    assert memory["fix"].startswith("fits with any one of: 1) rollout.gpu_memory_utilization 0.9→")
    # a file without the rollout engine cannot start verl
    unnamed = {k: v for k, v in values.items() if k != "actor_rollout_ref.rollout.name"}
    exit_code, report = _check(
        _write(tmp_path, format_overrides(unnamed), "unnamed.txt"), gpu="rtx4090", cores=8
    )
    assert any("rollout.name: not set" in p["problem"] for p in report["problems"])
    values["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] = 24
    bad = _write(tmp_path, format_overrides(values), "bad.txt")
    exit_code, report = _check(bad, gpu="rtx4090", cores=8)
    assert exit_code == 1
    assert any(
        "must divide the per-GPU mini batch" in p["problem"]
        for p in report["problems"]
        if p["check"] == "verl"
    )


# --- reading and bad input ---------------------------------------------------------------------------


def test_model_ids_map_to_registry_names():
    assert registry_name("meta-llama/Llama-2-7b-hf") == "llama-2-7b"
    assert registry_name("meta-llama/Llama-2-13b-chat-hf") == "llama-2-13b"
    assert registry_name("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T") == "tinyllama-1.1b"
    assert registry_name("Qwen/Qwen2.5-7B-Instruct") == "qwen2.5-7b"
    assert registry_name("OpenAssistant/reward-model-deberta-v3-large") == "deberta-v3-large"
    assert registry_name("Qwen/Qwen2-7B-Instruct") == "qwen2-7b"  # Qwen2, not Qwen2.5
    assert registry_name("deepseek-ai/deepseek-llm-7b-chat") == "deepseek-llm-7b"
    assert registry_name("Qwen/Qwen2.5-14B") is None and registry_name("mistralai/Mistral-7B") is None


def test_unknown_model_is_a_note_and_model_overrides(tmp_path):
    path = _write(tmp_path, BASE.replace("Qwen/Qwen2.5-0.5B-Instruct", "mistralai/Mistral-7B-v0.1"))
    exit_code, report = _check(path, cores=8, gpu="a100-80g")
    assert exit_code == 0 and report["memory"] is None
    assert any("memory not checked" in n["problem"] for n in report["notes"])
    _, report = _check(path, cores=8, gpu="a100-80g", model="qwen2.5-0.5b")
    assert report["memory"]["predicted_peak_gib"] > 0


def test_gpu_names():
    assert gpu_memory_gib("A100-40GB") == 40.0 and gpu_memory_gib("h200") > 139
    assert normalise("RTX 3090") == "rtx3090" and normalise("a100_80g") == "a100-80g"


def test_unreadable_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert "does not exist" in _error(capsys, str(tmp_path / "missing.yaml"))
    assert "not valid YAML" in _error(capsys, str(_write(tmp_path, "a: [1,\n", "bad.yaml")))
    assert "neither" in _error(capsys, str(_write(tmp_path, "- 1\n- 2\n", "list.yaml")))
    missing = _write(tmp_path, BASE.replace("micro_batch_size: 4\n", ""), "missing.yaml")
    assert "micro_batch_size: missing" in _error(capsys, str(missing))
    typed = _write(tmp_path, BASE.replace("micro_batch_size: 4", 'micro_batch_size: "4"'), "typed.yaml")
    assert "micro_batch_size='4': must be a whole number" in _error(capsys, str(typed))
    assert "unknown GPU 'a100'" in _error(capsys, str(SCENARIO_3), "--gpu", "a100")
    both = _error(capsys, str(SCENARIO_3), "--gpu", "h200", "--memory-budget", "80")
    assert "not allowed with argument" in both


def test_an_unknown_key_in_a_verl_override_file_is_a_finding(tmp_path):
    values = verl_overrides(dataclasses.replace(ProbeConfig(), rollout_batch_size=16), 1).values
    text = format_overrides(values).replace("ppo_micro_batch_size_per_gpu", "ppo_micr_batch_size_per_gpu", 1)
    exit_code, report = _check(_write(tmp_path, text, "verl_overrides.txt"), cores=8)
    (unknown,) = [p for p in report["problems"] if "unknown key" in p["problem"]]
    assert exit_code == 1 and "ppo_micr_batch_size_per_gpu" in unknown["problem"]
    assert unknown["fix"] == "rename it to actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    added = _write(tmp_path, format_overrides(values) + "+trainer.my_note=1\n", "added.txt")
    assert not [p for p in _check(added, cores=8)[1]["problems"] if "unknown key" in p["problem"]]


def test_a_huge_train_batch_is_checked_without_enumerating_it(tmp_path):
    """No rule walks a range up to the batch size: 2^40 samples is checked at once (a hang guard: the alarm
    fails the test after 60 s instead of letting it spin for minutes)."""
    values = verl_overrides(ProbeConfig(), 1).values
    values["data.train_batch_size"] = 2**40
    path = _write(tmp_path, format_overrides(values), "huge.txt")
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("check is still running after 60 s"))
    signal.alarm(60)
    try:
        exit_code, report = _check(path, cores=8)
    finally:
        signal.alarm(0)
    assert exit_code == 1 and any("2147483647" in p["problem"] for p in report["problems"])
