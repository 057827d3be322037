"""Training states held as verl holds them: FSDP2 full_shard / shard_grad_op on two gloo ranks, through the
real CLI on CPU; offload refused on CPU in one line."""

import pytest

from tests.conftest import probe_json, run_cli

pytestmark = pytest.mark.e2e

SMALL = ["--set", "max_prompt_length=16", "--set", "max_response_length=8", "--iterations", "1"]
PPO_FULL = ["--model", "tiny-llama", "--set", "algorithm=ppo"]
GRPO_LORA = [
    "--model",
    "tiny-qwen2",
    "--set",
    "algorithm=grpo",
    "--set",
    "rollout_n=2",
    "--set",
    "use_lora=true",
    "--set",
    "lora_r=4",
]


@pytest.mark.parametrize("sharding", ["full_shard", "shard_grad_op"])
@pytest.mark.parametrize("recipe", [PPO_FULL, GRPO_LORA], ids=["ppo-full", "grpo-lora"])
def test_each_sharding_runs_a_full_iteration_on_two_ranks(sharding, recipe):
    code, result = probe_json("--gpus", "2", *recipe, "--set", f"sharding={sharding}", *SMALL)
    assert code == 0, result
    assert result["status"] == "ok" and result["samples_per_sec"] > 0
    assert result["config"]["sharding"] == sharding
    assert set(result["phase_seconds"]) == {"rollout", "scoring", "advantages", "update"}
    assert len(result["rank_peaks"]) == 2


def test_sharding_on_one_rank_still_runs_fsdp():
    code, result = probe_json("--model", "tiny-llama", "--set", "sharding=full_shard", *SMALL)
    assert code == 0, result
    assert result["status"] == "ok" and result["world_size"] == 1


@pytest.mark.parametrize(
    ("sets", "fragment"),
    [
        (["sharding=full_shard", "param_offload=true"], "param_offload=true on CPU"),
        (["sharding=full_shard", "optimizer_offload=true"], "optimizer_offload=true on CPU"),
        (["optimizer_offload=true"], "offload is FSDP's"),
        (["sharding=zero3"], "sharding=zero3: unknown"),
    ],
)
def test_offload_and_unknown_sharding_are_one_line_on_cpu(sets, fragment):
    args = [item for s in sets for item in ("--set", s)]
    proc = run_cli("probe", "--model", "tiny-llama", "--device", "cpu", *args, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
