"""The job's lengths and the tokens each pass's largest micro batch holds (autotune.config.job_lengths), and a
verl log read for its response lengths (autotune.probe.verl.run_log)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from autotune.config.job_lengths import JobLengths, PassTokens, micro_batch_tokens, pass_tokens
from autotune.config.knobs import ProbeConfig
from autotune.errors import UserError
from autotune.probe.verl.run_log import counts_from_stats, job_lengths, read_run_log

# PPO on 2 GPUs: train 64, micro 4 × 2 accumulation (8 samples per GPU per step), limits 100/200
PPO = ProbeConfig(
    rollout_batch_size=64,
    train_batch_size=64,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    max_prompt_length=100,
    max_response_length=200,
)
DYNAMIC = dataclasses.replace(PPO, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=700)
DATA = JobLengths.from_counts(list(range(20, 60)), list(range(40, 120)))  # prompts 20-59, responses 40-119


def test_at_the_limits_a_micro_batch_is_k_full_sequences():
    tokens = pass_tokens(PPO, JobLengths(), gpus=2)
    assert tokens == PassTokens(
        update=4 * 300, forward=4 * 300, critic_update=4 * 300, critic_forward=4 * 300
    )


def test_on_the_data_a_fixed_micro_batch_is_the_p99_of_k_samples():
    tokens = micro_batch_tokens(PPO, DATA, 4)
    # four samples of at most 59 + 119 tokens; the mean sum is 4 × (39.5 + 79.5) = 476
    assert 476 < tokens < 4 * (59 + 119)
    assert micro_batch_tokens(PPO, DATA, 4) == tokens  # seeded: the same every time


def test_a_budget_is_filled_on_the_data_and_takes_whole_sequences_at_the_limits():
    assert pass_tokens(DYNAMIC, DATA, gpus=2).update == 700
    at_limits = pass_tokens(DYNAMIC, JobLengths(), gpus=2)
    assert at_limits.update == 2 * 300  # 700 holds two sequences of 300
    # a budget larger than a GPU's whole mini batch: the mini batch is the micro batch
    large = dataclasses.replace(DYNAMIC, ppo_max_token_len_per_gpu=100_000)
    assert pass_tokens(large, JobLengths(), gpus=2).update == 8 * 300
    # the forward passes take their own budget; the critic follows the actor's where unset
    both = dataclasses.replace(DYNAMIC, log_prob_max_token_len_per_gpu=1500)
    tokens = pass_tokens(both, JobLengths(), gpus=2)
    assert (tokens.forward, tokens.critic_update) == (5 * 300, 2 * 300)


def test_grpo_has_no_critic_pass():
    grpo = dataclasses.replace(PPO, algorithm="grpo", rollout_n=4)
    tokens = pass_tokens(grpo, DATA, gpus=2)
    assert tokens.critic_update == tokens.critic_forward == 0 and tokens.update > 0


def test_lengths_say_where_they_come_from_and_round_trip():
    assert JobLengths().describe(100, 200) == "prompts at the limit 100, responses at the limit 200"
    said = DATA.describe(100, 200)
    assert said.startswith("prompts from the data (median 39, max 59 tokens)")
    assert said.endswith("responses from the data (median 79, max 119 tokens)")
    assert JobLengths.from_dict(json.loads(json.dumps(DATA.to_dict()))) == DATA
    assert DATA.label == "data" and JobLengths().label == "max"
    # counts over a limit are cut to it where used
    assert DATA.response_lengths(100).max() == 100
    with pytest.raises(ValueError, match="source"):
        JobLengths(prompts=(1,), prompt_source="max")


def test_counts_from_a_logs_statistics_keep_its_mean_max_and_clip_ratio():
    counts = np.array(counts_from_stats(minimum=50, mean=400, maximum=1024, clipped=0.1))
    assert counts.min() >= 50 and counts.max() == 1024
    assert (counts == 1024).mean() == pytest.approx(0.1, abs=0.01)
    assert counts.mean() == pytest.approx(400, rel=0.02)


def _log(tmp_path: Path, steps: list[dict]) -> Path:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": i + 1, "data": m}) + "\n" for i, m in enumerate(steps)))
    return path


def test_a_verl_log_gives_the_last_steps_response_lengths_and_generations_share(tmp_path):
    first = {"response_length/min": 10, "response_length/mean": 100, "response_length/max": 300,
             "response_length/clip_ratio": 0.0, "timing_s/gen": 9.0, "timing_s/step": 10.0}  # fmt: skip
    last = {**first, "response_length/mean": 500, "response_length/max": 1024, "timing_s/gen": 6.0}
    log = read_run_log(_log(tmp_path, [first, last]))
    assert log.step == 2 and log.lengths.response_source == "verl log"
    assert np.mean(log.lengths.responses) == pytest.approx(500, rel=0.02)
    assert log.generation_share == pytest.approx(0.6)  # the steps after the first
    lengths, said = job_lengths(None, _log(tmp_path, [first, last]))
    assert lengths.responses == log.lengths.responses and lengths.prompt_source == "max"
    assert "its response lengths" in said[0]


def test_a_log_without_lengths_is_one_line(tmp_path):
    with pytest.raises(UserError, match="none with response_length"):
        read_run_log(_log(tmp_path, [{"timing_s/step": 10.0}]))
    with pytest.raises(UserError, match="does not exist"):
        read_run_log(tmp_path / "missing.jsonl")
