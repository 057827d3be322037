"""The rollout phase in the memory verdict: vLLM's pool beside the training states left on the GPU, the
step's peak the larger of it and the training phases, and the rollout's own first aid (issue 45's 7B full
parameter GRPO job on 2 × 80 GiB with a share of 0.6, reported out of memory, was judged `tight`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


def _job(model: str, gpus: int, share: float, lora: bool = False, offload: bool = False) -> str:
    """FULL_7B's recipe for another model, GPU count, rollout share, LoRA and offload."""
    lines = [
        line
        for line in FULL_7B.splitlines()
        if not line.startswith(("actor_rollout_ref.model", "trainer.n_"))
    ]
    lines += [
        f"actor_rollout_ref.model.path={model}",
        f"trainer.n_gpus_per_node={gpus}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={share}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={min(gpus, 2)}",
    ]
    if lora:
        lines += ["actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.model.lora_alpha=32"]
    if offload:
        lines += [f"actor_rollout_ref.actor.fsdp_config.{key}_offload=true" for key in ("param", "optimizer")]
    return "\n".join(lines) + "\n"


FIX_PEAKS = re.compile(r"\d\) [^;]*?: ([\d.]+) GiB")


@pytest.mark.parametrize(
    ("shape", "job"),
    [
        ("LoRA 7B on 1 GPU, share 0.9", _job("qwen2.5-7b", 1, 0.9, lora=True)),
        ("full 3B on 8 GPUs, share 0.95", _job("qwen2.5-3b", 8, 0.95)),
        ("LoRA 7B on 2 GPUs, share 0.95", _job("qwen2.5-7b", 2, 0.95, lora=True)),
    ],
)
def test_a_share_that_cannot_start_gets_the_rollouts_fix_and_each_fix_fits(
    tmp_path: Path, shape: str, job: str
):
    path = tmp_path / "job.txt"
    path.write_text(job)
    result = check(CheckOptions(path=path, gpu="a100-80g", cores=64))
    memory = result.memory
    assert memory["verdict"] == "over" and memory["decided_by_phase"] == "rollout", (shape, memory)
    assert memory["predicted_peak_gib"] < memory["limit_gib"]  # the training phases alone fit
    (problem,) = [f for f in result.problems if f.check == "memory"]
    assert problem.fix.startswith("fits with any one of: 1) rollout.gpu_memory_utilization"), problem.fix
    resident = memory["rollout_peak_gib"] - memory["phases_gib"]["rollout"]
    rollout_limit = 80 - 0.10 * (80 - resident)  # the card less the headroom of what the states leave free
    peaks = [float(peak) for peak in FIX_PEAKS.findall(problem.fix)]
    assert peaks and all(peak <= rollout_limit + 0.05 for peak in peaks), (problem.fix, rollout_limit)


def test_offload_lets_the_same_share_start_beside_the_states(tmp_path: Path):
    """Full 3B over 8 GPUs at a share of 0.95: over with its states on the GPU; offloaded (verl moves them
    to the host while vLLM generates) the pool starts: within the headroom, no longer over."""
    verdicts = {}
    for offload in (False, True):
        path = tmp_path / f"offload_{offload}.txt"
        path.write_text(_job("qwen2.5-3b", 8, 0.95, offload=offload))
        verdicts[offload] = check(CheckOptions(path=path, gpu="a100-80g", cores=64)).memory
    assert verdicts[False]["verdict"] == "over"
    assert verdicts[True]["verdict"] == "tight" and verdicts[True]["decided_by_phase"] == "rollout"
    assert verdicts[True]["rollout_peak_gib"] < verdicts[False]["rollout_peak_gib"] - 4  # 3B's states / 8


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


@pytest.mark.parametrize(("card_gib", "resident_gib"), [(80, 43), (80, 5), (40, 12.5), (24, 15.8), (141, 70)])
def test_the_share_autotune_exports_fits_the_rollout_phase_it_is_judged_by(card_gib, resident_gib):
    """One arithmetic for both: the exported share beside the resident states is within the rollout phase's
    limit, and the rollout fix offers that same share."""
    from autotune.formats.rollout import MARGIN, largest_share

    card = Budget(int(card_gib * GIB), MARGIN)
    share = largest_share(card.bytes, resident_gib * GIB)
    phase = rollout_phase(_target(share), card.bytes, int(resident_gib * GIB))
    assert phase is not None and phase.verdict(card) == "fits"
    over = rollout_phase(_target(min(1.0, share + 0.2)), card.bytes, int(resident_gib * GIB))
    assert over is not None and over.verdict(card) != "fits"
    fix = rollout_fix(over, card, training_peak=0.0)
    assert f"→{share:.2f}:" in fix or share < 0.10


def test_room_names_a_larger_rollout_share_when_the_states_leave_it(tmp_path: Path):
    """LoRA 3B over 8 GPUs at a share of 0.3: the states take little, so the room note offers the largest
    share that fits beside them (a larger KV cache), with its peak, the rule the export uses."""
    path = tmp_path / "small_share.txt"
    path.write_text(_job("qwen2.5-3b", 8, 0.3, lora=True))
    memory = check(CheckOptions(path=path, gpu="a100-80g", cores=64)).memory
    (larger,) = [e for e in memory["room"] if e["change"].startswith("rollout.gpu_memory_utilization 0.3→")]
    assert larger["predicted_peak_gib"] <= memory["limit_gib"] + 80 * 0.1  # within the rollout's own limit
    assert float(larger["change"].split("→")[1].split()[0]) >= 0.8
