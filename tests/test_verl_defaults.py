"""The export against verl's defaults: the rollout share from the resident training states, the tensor
parallel size from that share, worker counts at verl's defaults, no_sync as the probe reduced, and the
table of exported keys beside verl's defaults (formats/rollout.py, formats/verl_defaults.py)."""

from __future__ import annotations

import dataclasses

from autotune.config.knobs import ProbeConfig
from autotune.formats.rollout import VERL_DEFAULT_WORKERS, recorded_resident_bytes, rollout_engine
from autotune.formats.verl import verl_overrides
from autotune.formats.verl_defaults import exported_knobs
from autotune.formats.verl_route import AR
from autotune.formats.verl_schema import export_default
from autotune.units import GIB

BASE = ProbeConfig()
SHARE, TP = f"{AR}.rollout.gpu_memory_utilization", f"{AR}.rollout.tensor_model_parallel_size"
NO_SYNC = f"{AR}.actor.fsdp_config.use_no_sync_for_gradient_accumulation"


def test_the_share_comes_from_the_resident_states_and_is_above_verls_default_when_they_leave_room():
    engine = rollout_engine(BASE, 1, "vllm", 80 * GIB, 16 * GIB, 7_000_000_000)
    assert engine.gpu_memory_utilization == 0.7  # 64 GiB free × 0.9 = 57.6 GiB of 80: 0.72, down to 0.05
    assert engine.why("gpu_memory_utilization") == "memory" and engine.notes == ()


def test_the_share_is_below_verls_default_only_when_the_states_leave_less_and_says_so():
    engine = rollout_engine(BASE, 1, "vllm", 80 * GIB, 50 * GIB)
    assert engine.gpu_memory_utilization == 0.3  # 30 GiB free × 0.9 = 27 GiB: 0.3375
    assert any("below verl's default 0.5" in note for note in engine.notes)


def test_without_a_card_or_states_the_share_is_verls_default():
    engine = rollout_engine(BASE, 1, "vllm", None, None)
    assert engine.gpu_memory_utilization == 0.5 and engine.why("gpu_memory_utilization") == "verl's default"


def test_the_tensor_parallel_size_stays_1_while_the_weights_fit_the_share():
    # 7B on 8 × 80 GiB beside 30 GiB of states: a 0.55 share, 13 GiB of bf16 weights fit one GPU's pool
    engine = rollout_engine(BASE, 8, "vllm", 80 * GIB, 30 * GIB, 7_000_000_000, attention_heads=28)
    assert engine.tensor_model_parallel_size == 1 and engine.why("tensor_model_parallel_size") == "rule"
    # 70B: 130 GiB of weights need 4 GPUs' pools of 44 GiB
    big = rollout_engine(BASE, 8, "vllm", 80 * GIB, 30 * GIB, 70_000_000_000, attention_heads=64)
    assert big.tensor_model_parallel_size == 4 and big.why("tensor_model_parallel_size") == "memory"


def test_a_configuration_that_sets_verls_knobs_keeps_them_as_measured():
    config = dataclasses.replace(BASE, gpu_memory_utilization=0.6, tensor_model_parallel_size=1)
    engine = rollout_engine(config, 2, "vllm", 80 * GIB, 70 * GIB)
    assert engine.gpu_memory_utilization == 0.6 and engine.why("gpu_memory_utilization") == "measured"


def test_the_resident_states_are_weights_and_optimizer_of_the_most_loaded_rank():
    result = {
        "rank_peaks": [
            {"bytes": 9, "state_bytes": {"weights": 100, "gradients": 50, "optimizer": 200}},
            {"bytes": 9, "state_bytes": {"weights": 120, "gradients": 60, "optimizer": 240}},
        ]
    }
    assert recorded_resident_bytes(result) == 360  # verl frees the gradients when a train step ends
    assert recorded_resident_bytes({"rank_peaks": [{"bytes": 9}]}) is None
    assert recorded_resident_bytes(None) is None


def test_worker_keys_at_verls_defaults_unless_the_configuration_is_measured_by_verl():
    config = dataclasses.replace(BASE, num_rollout_workers=1, train_batch_size=64, rollout_batch_size=64)
    probed = verl_overrides(config, 1).values  # --engine verl: the configuration's own
    assert probed["data.dataloader_num_workers"] == 1 and probed[f"{AR}.rollout.agent.num_workers"] == 1
    exported = verl_overrides(config, 1, workers=VERL_DEFAULT_WORKERS).values
    assert exported["data.dataloader_num_workers"] == export_default("data.dataloader_num_workers") == 8
    assert exported[f"{AR}.rollout.agent.num_workers"] == export_default(f"{AR}.rollout.agent.num_workers")
    odd = dataclasses.replace(
        config, train_batch_size=12, rollout_batch_size=12, gradient_accumulation_steps=1
    )
    lowered = verl_overrides(odd, 1, workers=VERL_DEFAULT_WORKERS)
    assert lowered.values[f"{AR}.rollout.agent.num_workers"] == 6  # verl splits the 12 samples evenly


def test_no_sync_follows_how_the_probe_reduced_the_gradients():
    assert verl_overrides(BASE, 2).values[NO_SYNC] is True  # DDP: all-reduce on the last micro batch only
    sharded = dataclasses.replace(BASE, sharding="full_shard")
    assert verl_overrides(sharded, 2).values[NO_SYNC] is False  # FSDP: every micro batch


def test_every_exported_key_has_verls_default_and_a_reason():
    config = dataclasses.replace(BASE, num_rollout_workers=1)
    engine = rollout_engine(config, 2, "vllm", 80 * GIB, 16 * GIB, 500_000_000)
    values = verl_overrides(config, 2, "Qwen/Qwen2.5-0.5B", engine, VERL_DEFAULT_WORKERS).values
    knobs = {k.key: k for k in exported_knobs(values, engine)}
    assert set(knobs) == set(values)
    assert knobs[SHARE].default == 0.5 and knobs[SHARE].why.startswith("memory")
    assert knobs[TP].default == 2 and knobs[TP].value == 1 and knobs[TP].why.startswith("rule")
    assert knobs["data.dataloader_num_workers"].why.startswith("verl's default")
    assert knobs[NO_SYNC].differs and knobs[NO_SYNC].why.startswith("measured")
    assert knobs["trainer.n_gpus_per_node"].why == "the job"
    by_verl = {k.key: k for k in exported_knobs(values, engine, measured_by_verl=True)}
    assert by_verl[SHARE].why.startswith("measured")
