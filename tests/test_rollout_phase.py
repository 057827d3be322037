"""The rollout phase in the memory verdict: vLLM's pool beside the training states left on the GPU, the
step's peak the larger of it and the training phases, and the rollout's own first aid (issue 45's 7B full
parameter GRPO job on 2 × 80 GiB with a share of 0.6, reported out of memory, was judged `tight`)."""

from __future__ import annotations

from pathlib import Path

from autotune.check import CheckOptions, check
from autotune.formats.rollout import RolloutEngine
from autotune.formats.target import Target
from autotune.memory.budget import Budget
from autotune.memory.rollout_phase import rollout_fix, rollout_phase
from autotune.units import GIB

DATA = Path(__file__).resolve().parent / "data"
FULL_7B = """\
algorithm.adv_estimator=grpo
data.train_batch_size=64
data.max_prompt_length=512
data.max_response_length=1024
actor_rollout_ref.model.path=qwen2.5-7b
actor_rollout_ref.actor.ppo_mini_batch_size=16
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
actor_rollout_ref.actor.use_kl_loss=true
actor_rollout_ref.rollout.n=4
actor_rollout_ref.rollout.tensor_model_parallel_size=2
actor_rollout_ref.rollout.gpu_memory_utilization=0.6
trainer.n_gpus_per_node=2
trainer.nnodes=1
"""


def _target(share: float | None) -> Target:
    return Target(kind="verl overrides", config=None, engine=RolloutEngine(gpu_memory_utilization=share))


def test_the_pool_sits_beside_the_resident_states():
    phase = rollout_phase(_target(0.6), 80 * GIB, 43 * GIB)
    assert phase is not None and phase.peak == int(43 * GIB + 0.6 * 80 * GIB)
    default = rollout_phase(_target(None), 80 * GIB, 43 * GIB)  # no share named: verl's default
    assert default is not None and default.assumed and default.share == 0.5
    assert rollout_phase(Target(kind="TRL config", config=None), 80 * GIB, 43 * GIB) is None  # no engine


def test_the_rollout_fix_is_the_largest_share_that_fits_when_training_fits():
    card = Budget(int(80 * GIB), 0.10)  # the rollout's limit: 80 - 0.1 × (80 - 43) = 76.3 GiB
    phase = rollout_phase(_target(0.6), 80 * GIB, 43 * GIB)
    fix = rollout_fix(phase, card, training_peak=60 * GIB)
    assert fix.startswith("fits with any one of: 1) rollout.gpu_memory_utilization 0.6→0.40: 75.0 GiB")
    assert 43 + 0.40 * 80 <= 76.3 < 43 + 0.45 * 80
    assert rollout_fix(phase, card, training_peak=75 * GIB).startswith("nothing the rollout")
    offloaded = rollout_fix(phase, card, training_peak=75 * GIB, offloaded=(70 * GIB, 49 * GIB))
    assert offloaded.startswith("fits with any one of: 1) param_offload: true and optimizer_offload: true")


def test_a_share_that_cannot_start_beside_the_states_is_over_with_the_rollout_phase_named(tmp_path: Path):
    path = tmp_path / "full_7b.txt"
    path.write_text(FULL_7B)
    result = check(CheckOptions(path=path, gpu="a100-80g", cores=64))
    memory = result.memory
    assert memory["verdict"] == "over" and memory["decided_by_phase"] == "rollout"
    assert memory["rollout_peak_gib"] > 80 > memory["predicted_peak_gib"]  # the training phases fit the card
    assert memory["phases_gib"]["rollout"] == 48.0  # the pool: 0.6 × 80 GiB
    (problem,) = [f for f in result.problems if f.check == "memory"]
    assert "in the rollout phase" in problem.problem
    # the training phases (73.1 GiB) are over the 72 GiB limit too: their first aid, then the rollout's
    assert problem.fix.startswith("fits with any one of: 1) use_lora: true")
    assert "; the rollout phase too: nothing the rollout's settings alone can change fits" in problem.fix


def test_a_config_with_room_gets_the_system_knobs_that_fit_in_text_and_json():
    """The seed article's §5.3 on an RTX 3090 peaks near 6 GiB of 24: checkpointing off and larger micro
    batches fit, each said with its predicted peak; never a recipe change."""
    result = check(CheckOptions(path=DATA / "seed_scenario_3.yaml", gpu="rtx3090", cores=8))
    room = result.memory["room"]
    changes = [entry["change"] for entry in room]
    assert "gradient_checkpointing: false" in changes
    assert all(entry["predicted_peak_gib"] <= result.memory["limit_gib"] for entry in room)
    assert not any(name in " ".join(changes) for name in ("train_batch_size", "max_", "lora", "mini_batch"))
    (note,) = [f for f in result.findings if f.key == "room"]
    assert note.severity == "note" and "autotune run --from" in note.problem


def test_a_config_without_room_gets_no_room_note():
    result = check(CheckOptions(path=DATA / "seed_scenario_2.yaml", gpus=4, gpu="a100-40g", cores=8))
    assert result.memory["verdict"] == "over" and "room" not in result.memory
