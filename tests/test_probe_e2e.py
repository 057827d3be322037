"""The real probe through the real CLI, on tiny models on CPU (several ranks through gloo)."""

import pytest

from tests.conftest import ISSUE_EXAMPLE, probe_json

pytestmark = pytest.mark.e2e


def _assert_measured(result: dict) -> None:
    assert result["status"] == "ok", result
    assert result["samples_per_sec"] > 0 and result["tokens_per_sec"] > 0
    assert result["peak_memory_bytes"] > 0 and result["peak_memory_source"] == "rss"
    phases = result["phase_seconds"]
    assert set(phases) == {"rollout", "scoring", "advantages", "update"}
    # verl's passes: the iteration is the training phases (the synthetic rollout is timed apart), timed
    # between synchronisations inside it, so they add up to it within 10%
    training = phases["scoring"] + phases["advantages"] + phases["update"]
    assert training == pytest.approx(result["iteration_seconds"], rel=0.10)
    assert result["environment"]["torch"] and result["config"]["train_batch_size"] == 16
    # each pass's micro batches, packed: 16 samples per rank over micro batches of 4 (update) or the
    # log-prob micro batch, every sample once per pass
    packing = result["packing"]
    assert {"forward", "update"} <= set(packing)
    assert packing["update"]["micro_batches"] == 16 // 4 // result["world_size"]


def test_issue_example_single_rank():
    code, result = probe_json("--model", "tiny-llama", *ISSUE_EXAMPLE, own_process=True)  # as typed
    assert code == 0
    _assert_measured(result)
    assert result["world_size"] == 1


def test_two_gloo_ranks_report_the_largest_peak_and_budget_is_emulated():
    code, result = probe_json("--model", "tiny-llama", "--gpus", "2", *ISSUE_EXAMPLE)
    assert code == 0
    _assert_measured(result)
    peaks = [rank["bytes"] for rank in result["rank_peaks"]]
    assert len(peaks) == 2 and result["peak_memory_bytes"] == max(peaks)

    budget_gib = result["peak_memory_bytes"] / 1024**3 / 4  # well below the peak just measured
    code, over = probe_json(
        "--model", "tiny-llama", "--gpus", "2", "--memory-budget", f"{budget_gib:.4f}", *ISSUE_EXAMPLE
    )
    assert code == 1
    assert over["status"] == "oom" and over["oom_kind"] == "emulated" and "emulated" in over["message"]


def test_dynamic_batch_size_packs_every_micro_batch_under_its_budget():
    """use_dynamic_bsz with budgets of 3 and 6 sequences (update, forward passes) at the limits (every
    sample 32 + 16 tokens): the update cuts each mini batch of 8 into ceil(8·48 / 144) = 3 micro batches,
    the forward passes the 16 samples into ceil(16·48 / 288) = 3; none above its budget."""
    code, result = probe_json(
        "--model", "tiny-llama", *ISSUE_EXAMPLE, "--set", "use_dynamic_bsz=true",
        "--set", "ppo_max_token_len_per_gpu=144", "--set", "log_prob_max_token_len_per_gpu=288",
    )  # fmt: skip
    assert code == 0, result
    packing, length = result["packing"], 32 + 16
    assert result["config"]["max_prompt_length"] + result["config"]["max_response_length"] == length
    assert packing["update"]["micro_batches"] == 2 * 3 and packing["update"]["max_tokens"] == 144
    assert packing["forward"]["micro_batches"] == 3 and packing["forward"]["max_tokens"] <= 288
    assert packing["forward"]["tokens"] == 16 * length  # every sample once, nothing padded


@pytest.mark.cores(2)  # two DataLoader workers: a probe refuses more workers than its cores
def test_grpo_with_lora_and_a_reward_model():
    code, result = probe_json(
        "--model",
        "tiny-qwen2",
        "--reward-model",
        "tiny-deberta",
        "--set",
        "algorithm=grpo",
        "--set",
        "rollout_n=2",
        "--set",
        "use_lora=true",
        "--set",
        "lora_r=4",
        "--set",
        "num_rollout_workers=2",
        "--set",
        "gradient_checkpointing=true",
        "--set",
        "max_prompt_length=16",
        "--set",
        "max_response_length=8",
        "--iterations",
        "1",
    )
    assert code == 0, result
    assert result["status"] == "ok" and result["samples_per_sec"] > 0
