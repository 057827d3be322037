"""The memory model: hand-computed terms, monotonicity, calibration, serialisation. No probes."""

import dataclasses
import itertools

import pytest

from autotune.config.knobs import ProbeConfig
from autotune.config.passes import Passes
from autotune.memory.architecture import Architecture
from autotune.memory.breakdown import minimum_bytes, predict_components
from autotune.memory.calibration import PRIORS, MemoryModel, fit_constant_and_factor
from autotune.models.catalog import resolve_model

GB = 10**9
GIB = 1024**3

# Published configs (autotune/models/configs); parameter counts as registry.count_parameters gives them.
LLAMA_7B = Architecture(
    layers=32,
    hidden=4096,
    intermediate=11008,
    heads=32,
    kv_heads=32,
    head_dim=128,
    vocab=32000,
    actor_parameters=6_738_415_616,
    critic_parameters=6_607_347_713,  # no LM head (32000×4096), a 4096→1 value head with bias
)
LLAMA_13B = Architecture(
    layers=40,
    hidden=5120,
    intermediate=13824,
    heads=40,
    kv_heads=40,
    head_dim=128,
    vocab=32000,
    actor_parameters=13_015_864_320,
    critic_parameters=12_852_029_441,
)
TINY = Architecture(
    layers=2,
    hidden=64,
    intermediate=128,
    heads=4,
    kv_heads=4,
    head_dim=16,
    vocab=32000,
    actor_parameters=4_178_240,
    critic_parameters=2_130_305,
)


def test_from_specs_reads_the_registry_config():
    assert Architecture.from_specs(resolve_model("tiny-llama"), None) == TINY


def test_lora_r64_on_llama_2_7b_trains_160m_parameters():
    # per layer r·(d_in+d_out): q,k,v,o 4×(4096+4096) = 32,768; gate,up,down 3×(4096+11008) = 45,312
    # 64 × 78,080 = 4,997,120 per layer × 32 layers = 159,907,840 ≈ 160M (2.4% of 6.74B)
    assert LLAMA_7B.lora_parameters(64) == 159_907_840
    config = ProbeConfig(use_lora=True, lora_r=64, algorithm="grpo", rollout_n=2)
    b = predict_components(LLAMA_7B, config, world_size=1, device="cuda")
    assert b.gradients == 159_907_840 * 4  # fp32 grads: 0.64 GB
    assert b.optimizer == 159_907_840 * 8  # AdamW exp_avg + exp_avg_sq in fp32: 1.28 GB
    # frozen bf16 base 6,738,415,616 × 2 = 13.48 GB, fp32 adapters 0.64 GB, no reference copy
    assert b.weights == 6_738_415_616 * 2 + 159_907_840 * 4


def test_lora_critic_adds_adapters_and_its_value_head():
    config = ProbeConfig(use_lora=True, lora_r=64, algorithm="ppo")
    b = predict_components(LLAMA_7B, config, world_size=1, device="cuda")
    trainable = 2 * 159_907_840 + 4096 + 1  # actor adapters + critic adapters + score (4096 weights, 1 bias)
    assert b.gradients == trainable * 4
    assert b.weights == (6_738_415_616 + 6_607_347_713) * 2 + trainable * 4


def test_full_fine_tuning_of_13b_needs_16_bytes_per_parameter_and_does_not_fit_4x40gb():
    # fp32 weights 4 + fp32 grads 4 + AdamW moments 2×4 = 16 B/param: 13,015,864,320 × 16 = 208.25 GB
    config = ProbeConfig(algorithm="grpo", rollout_n=2)
    b = predict_components(LLAMA_13B, config, world_size=4, device="cuda")
    actor_state = b.weights - 13_015_864_320 * 2 + b.gradients + b.optimizer  # minus the bf16 reference
    assert actor_state == 13_015_864_320 * 16 == 208_253_829_120
    # The probe replicates with DDP (no FSDP sharding): every rank holds all of it, plus the bf16 reference
    # (2 B/param) and DDP's gradient buckets (4 B/param): 22 B/param = 286.35 GB per rank ≫ 40 GB.
    assert minimum_bytes(LLAMA_13B, config, world_size=4, device="cuda") == 13_015_864_320 * 22
    assert minimum_bytes(LLAMA_13B, config, world_size=4, device="cuda") > 40 * GB
    # one rank: no buckets, 18 B/param
    assert minimum_bytes(LLAMA_13B, config, world_size=1, device="cuda") == 13_015_864_320 * 18


def test_ppo_full_fine_tuning_holds_actor_reference_and_critic():
    config = ProbeConfig(algorithm="ppo")
    b = predict_components(LLAMA_7B, config, world_size=1, device="cuda")
    actor, critic = 6_738_415_616, 6_607_347_713
    assert b.weights == (actor + critic) * 4 + actor * 2  # fp32 trainables + bf16 reference
    assert b.optimizer == (actor + critic) * 8
    assert b.ddp_buckets == 0


def test_cpu_keeps_everything_in_fp32():
    config = ProbeConfig(algorithm="grpo", rollout_n=2)
    b = predict_components(TINY, config, world_size=2, device="cpu")
    assert b.weights == 4_178_240 * 4 * 2  # actor + reference, both fp32
    assert b.ddp_buckets == b.gradients == 4_178_240 * 4


def test_kv_cache_of_the_rollout_share():
    # R=64 over W=4: 16 samples × (512+512) tokens × 2 (K,V) × 32 layers × 32 heads × 128 × 2 B (bf16)
    # = 16 × 1024 × 524,288 B = 8 GiB, plus one layer's K,V for DynamicCache's torch.cat (8 GiB / 32)
    config = ProbeConfig(
        rollout_batch_size=64, train_batch_size=64, max_prompt_length=512, max_response_length=512
    )
    b = predict_components(LLAMA_7B, config, world_size=4, device="cuda", passes=Passes.TRL)
    assert b.kv_cache == 8 * GIB + 8 * GIB // 32
    assert b.generation_logits == 16 * 32000 * (2 + 4 + 4)  # bf16 logits, fp32 copy, softmax probs


def test_training_logits_and_activations_of_a_micro_batch():
    config = ProbeConfig(
        micro_batch_size=16, max_prompt_length=32, max_response_length=64, gradient_checkpointing=False
    )
    b = predict_components(TINY, config, world_size=1, device="cpu", passes=Passes.TRL)
    # response logits 16 × 65 × 32000 × 4 B = 133.1 MB; three fp32 copies at once in backward (logits,
    # accumulated grad, next select_backward grad) + two 64 × 32000 × 4 B = 8.2 MB row temporaries
    full, row = 16 * 65 * 32000 * 4, 64 * 32000 * 4
    assert b.logits == 3 * full + 2 * row
    # per token per layer (fp32): norms 2×3×64×4 = 1536, attention 4×(3×64 + 2×64) = 1280, MLP 16×128 = 2048
    tokens = 16 * 96
    per_layer = 1536 + 1280 + 2048
    assert b.activations == 2 * per_layer * tokens + 3 * 64 * 4 * tokens + 16 * 96 * 96
    # scoring at the same micro batch: the logits once + two row temporaries
    assert b.scoring_logits == full + 2 * row


def test_verl_passes_price_the_logits_of_every_packed_token():
    # verl packs 16 samples of 32 + 64 tokens into one row of 1,536 tokens and takes the logits of all of them
    config = ProbeConfig(
        micro_batch_size=16, max_prompt_length=32, max_response_length=64, gradient_checkpointing=False
    )
    b = predict_components(TINY, config, world_size=1, device="cpu")
    tokens = 16 * 96
    assert b.tokens == {
        "update": tokens,
        "forward": tokens,
        "critic_update": tokens,
        "critic_forward": tokens,
    }
    # CPU: three fp32 copies in the update (logits, the accumulating gradient, gather's), one token per row
    assert b.logits == 3 * tokens * 32000 * 4
    # the old log-prob pass computes the entropy: the softmax and one more temporary beside the logits
    assert b.scoring_logits == 3 * tokens * 32000 * 4
    # the packed row's block-diagonal bool mask (CPU: Hugging Face's from the position ids) is tokens²
    per_layer = 1536 + 1280 + 2048
    assert b.activations == 2 * per_layer * tokens + 3 * 64 * 4 * tokens + tokens * tokens
    # no generate phase: the rollout is vLLM's pool
    assert set(b.phases) == {"scoring", "update"} and b.kv_cache == 0
    # GPU: bf16 logits, flash-attn's cross-entropy writes the gradient into them; no mask (varlen kernels)
    gpu = predict_components(TINY, config, world_size=1, device="cuda")
    assert gpu.logits == tokens * 32000 * 2
    assert gpu.scoring_logits == 3 * tokens * 32000 * 2


def test_verl_passes_price_what_the_data_and_the_budgets_hold():
    from autotune.config.job_lengths import JobLengths

    short = JobLengths.from_counts([20] * 64, [30] * 64)  # every sample 50 tokens on the data
    config = ProbeConfig(micro_batch_size=8, max_prompt_length=32, max_response_length=64)
    on_data = predict_components(TINY, config, device="cpu", lengths=short)
    assert on_data.tokens["update"] == 8 * 50  # not 8 × 96 at the limits
    budget = dataclasses.replace(config, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=300)
    assert predict_components(TINY, budget, device="cpu", lengths=short).tokens["update"] == 300
    # at the limits only whole sequences of 96 fit in 300 tokens
    assert predict_components(TINY, budget, device="cpu").tokens["update"] == 3 * 96


def test_gpu_activations_and_autocast_weight_copies_of_7b():
    config = ProbeConfig(
        micro_batch_size=1, max_prompt_length=512, max_response_length=512, gradient_checkpointing=False
    )
    b = predict_components(LLAMA_7B, config, device="cuda", passes=Passes.TRL)
    # per token per layer under autocast: fp32 residual/norms 2×(3×4096×4 + 4096×2 bf16 cast) = 114,688;
    # bf16 attention (3×4096 + 2×4096) × 2 = 40,960 (q, k after RoPE, v, SDPA out, o_proj in); bf16 SwiGLU
    # 4×11008 × 2 = 88,064: 243,712 B ≈ 59·h (Korthikanti's 34·h is GELU with bf16 norms)
    tokens = 1024
    assert b.activations == 32 * 243_712 * tokens + 3 * 4096 * 4 * tokens + 1024 * 1024
    # the bf16 copies autocast caches of the fp32 actor: all but the 32000×4096 input embedding
    assert b.update_autocast_weights == 2 * (6_738_415_616 - 32000 * 4096)
    lora = predict_components(
        LLAMA_7B, dataclasses.replace(config, use_lora=True), device="cuda", passes=Passes.TRL
    )
    assert lora.update_autocast_weights == 0  # the LoRA base is bf16 already


def test_logits_with_a_large_vocabulary_and_on_gpu():
    qwen = dataclasses.replace(TINY, vocab=151936)
    config = ProbeConfig(micro_batch_size=16, max_response_length=64)
    full, row = 16 * 65 * 151936 * 4, 64 * 151936 * 4  # 632 MB; rows of 38.9 MB are mmapped, not kept
    assert predict_components(qwen, config, device="cpu", passes=Passes.TRL).logits == 3 * full + 2 * row
    # GPU: the bf16 logits die with response_log_probs; backward holds three fp32 copies (12 B/element)
    gpu = predict_components(qwen, config, device="cuda", passes=Passes.TRL)
    assert gpu.logits == 3 * full + 2 * row
    assert gpu.scoring_logits == 16 * 65 * 151936 * (2 + 4) + 2 * row  # bf16 logits + their fp32 copy


@pytest.mark.parametrize(
    ("passes", "phases"),
    [(Passes.TRL, {"rollout", "scoring", "update"}), (Passes.VERL, {"scoring", "update"})],
)
def test_peak_is_static_plus_the_largest_phase_not_their_sum(passes, phases):
    b = predict_components(LLAMA_7B, ProbeConfig(), world_size=1, device="cuda", passes=passes)
    assert set(b.phases) == phases
    totals = [b.phase_states[phase] + b.phases[phase] for phase in b.phases]
    assert b.total == b.static + max(totals)
    assert b.total < b.static + sum(totals)
    assert b.to_dict()["total"] == b.total


def _grow(config: ProbeConfig, **changes) -> ProbeConfig:
    return dataclasses.replace(config, **changes)


MONOTONE = [  # knob, values, the terms it grows (verl's passes: no generate, so no KV cache)
    ("micro_batch_size", [1, 2, 4, 8, 16], ("activations", "logits")),
    ("rollout_batch_size", [4, 8, 16, 32, 64], ("kv_cache",)),
    ("max_prompt_length", [8, 32, 128, 512], ("activations", "kv_cache", "scoring_activations")),
    ("max_response_length", [8, 32, 128, 512, 2048], ("logits", "kv_cache", "scoring_logits")),
    ("log_prob_micro_batch_size", [1, 4, 16, 64], ("scoring_activations", "scoring_logits")),
]
ROLLOUT_TERMS = ("kv_cache",)


@pytest.mark.parametrize("arch", [TINY, LLAMA_7B], ids=["tiny", "7b"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("use_lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("sharding", ["replicate", "full_shard", "shard_grad_op"])
@pytest.mark.parametrize(("knob", "values", "terms"), MONOTONE)
@pytest.mark.parametrize("passes", [Passes.VERL, Passes.TRL])
def test_prediction_never_decreases_when_a_memory_knob_grows(
    arch, device, use_lora, sharding, knob, values, terms, passes
):
    # Sequences long enough that every knob's own term shows: at short ones a 7B model's full fine-tuning
    # peaks in AdamW's foreach step (a 27 GB temporary), which no batch knob moves.
    base = ProbeConfig(
        train_batch_size=64,
        max_prompt_length=256,
        max_response_length=256,
        use_lora=use_lora,
        sharding=sharding,
        gradient_checkpointing=False,
    )
    model = MemoryModel(arch, world_size=2, device=device, passes=passes)
    configs = [_grow(base, **{knob: v}) for v in values]
    predictions = [model.predict(c) for c in configs]
    assert predictions == sorted(predictions), (knob, predictions)
    # the knob's own terms grow strictly (the total only where their phase sets the peak)
    for term in terms if passes.padded else [t for t in terms if t not in ROLLOUT_TERMS]:
        values = [getattr(model.breakdown(c), term) for c in configs]
        assert all(a < b for a, b in itertools.pairwise(values)), (knob, term, values)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_gradient_checkpointing_lowers_the_update_peak(device):
    config = ProbeConfig(
        micro_batch_size=8, max_prompt_length=1024, max_response_length=1024, gradient_checkpointing=False
    )
    plain = predict_components(LLAMA_7B, config, device=device)
    checkpointed = predict_components(LLAMA_7B, _grow(config, gradient_checkpointing=True), device=device)
    assert checkpointed.activations < plain.activations / 10
    assert checkpointed.total < plain.total
    # never higher, even where another phase sets the peak
    small = ProbeConfig(micro_batch_size=1, max_response_length=8, gradient_checkpointing=False)
    assert (
        predict_components(TINY, _grow(small, gradient_checkpointing=True), device=device).total
        <= predict_components(TINY, small, device=device).total
    )


def test_prior_prediction_scales_the_dynamic_bytes_not_the_states():
    model = MemoryModel(LLAMA_7B, world_size=2, device="cuda")
    constant, factor = PRIORS["cuda"]
    config = ProbeConfig(micro_batch_size=8, max_prompt_length=512, max_response_length=512)
    b = model.breakdown(config)
    phase = b.peak_phase_at(factor)
    exact, dynamic = model.split(config)
    assert exact == b.static + b.phase_states[phase] and dynamic == b.phases[phase]
    assert model.predict(config) == int(constant + exact + factor * dynamic)
    # the states (here 224 GB: actor, critic, reference, DDP buckets) are not multiplied by 1.1
    assert model.predict(config) < constant + factor * b.total


def test_full_shard_divides_the_states_and_keeps_the_reference_on_the_host():
    config = ProbeConfig(algorithm="ppo", sharding="full_shard")
    actor, critic = 6_738_415_616, 6_607_347_713
    gpu = predict_components(LLAMA_7B, config, world_size=4, device="cuda")
    assert gpu.weights == (actor + critic) * 4 // 4  # the bf16 reference's shards live on the host
    assert gpu.gradients == (actor + critic) * 4 // 4 and gpu.optimizer == (actor + critic) * 8 // 4
    assert gpu.ddp_buckets == 0
    cpu = predict_components(LLAMA_7B, config, world_size=4, device="cpu")
    assert cpu.weights == (actor + critic) * 4 // 4 + actor * 4 // 4
    # rollout gathers the actor whole in bf16 (plus one unit being copied out); training gathers two units
    layer = (actor - 2 * 32000 * 4096) // 32
    assert gpu.gathered_rollout == actor * 2 + layer * 2
    assert gpu.gathered_update == 2 * layer * 2
    assert gpu.reduce_scatter == layer * (2 + 4)  # the unit's bf16 gradient and its fp32 reduce-scatter input
    assert gpu.update_autocast_weights == 0  # FSDP casts the gathered weights itself


def test_shard_grad_op_keeps_what_a_forward_gathered():
    full = predict_components(LLAMA_7B, ProbeConfig(sharding="full_shard"), world_size=4, device="cuda")
    grad_op = predict_components(LLAMA_7B, ProbeConfig(sharding="shard_grad_op"), world_size=4, device="cuda")
    assert grad_op.static == full.static
    actor, critic = 6_738_415_616, 6_607_347_713
    assert grad_op.gathered_scoring == (actor + actor + critic) * 2  # actor, reference, critic in bf16
    assert grad_op.total > full.total


def test_offload_moves_the_states_into_the_phases_that_use_them():
    base = ProbeConfig(sharding="full_shard", micro_batch_size=1)
    kept = predict_components(LLAMA_7B, base, world_size=4, device="cuda")
    params = predict_components(LLAMA_7B, _grow(base, param_offload=True), world_size=4, device="cuda")
    both = predict_components(
        LLAMA_7B, _grow(base, param_offload=True, optimizer_offload=True), world_size=4, device="cuda"
    )
    assert params.weights == 0 and params.gradients == 0 and params.optimizer == kept.optimizer
    assert both.optimizer == 0 and both.static == both.rollout_buffer
    actor = 6_738_415_616
    assert params.loaded_rollout == actor * 4 // 4
    assert both.loaded_update == params.loaded_update + actor * 8 // 4
    assert both.total < params.total < kept.total
    # on CPU there is no device to offload from: the holding is the plain sharded one
    cpu = predict_components(TINY, _grow(base, param_offload=True), world_size=2, device="cpu")
    assert cpu.total == predict_components(TINY, base, world_size=2, device="cpu").total


def test_lora_adapters_save_their_fp32_inputs_under_autocast():
    config = ProbeConfig(use_lora=True, micro_batch_size=2, gradient_checkpointing=False)
    full = _grow(config, use_lora=False)
    tokens, h, i = 2 * config.sequence_length, 4096, 11008
    lora = predict_components(LLAMA_7B, config, device="cuda").activations
    plain = predict_components(LLAMA_7B, full, device="cuda").activations
    adapters = 12 * h + 2 * i
    # the LoRA base is bf16, so is its residual stream: each norm saves 8h bytes instead of 14h
    bf16_norms = 2 * (4 * h + 4 * h) - 2 * (12 * h + 2 * h)
    assert lora - plain == 32 * (adapters + bf16_norms) * tokens
    assert predict_components(TINY, config, device="cpu").activations == (
        predict_components(TINY, full, device="cpu").activations
    )


def test_calibration_recovers_a_known_constant_and_factor():
    truth = MemoryModel(TINY, device="cpu", constant=420 * 2**20, factor=1.23)
    sizes = [(1, 8), (4, 32), (16, 64), (32, 128), (64, 256)]  # raw 0.13 .. 4.5 GiB
    configs = [
        ProbeConfig(micro_batch_size=m, max_response_length=lr, train_batch_size=64) for m, lr in sizes
    ]
    points = [(c, truth.predict(c)) for c in configs]
    fitted = MemoryModel(TINY, device="cpu").calibrate(points)  # prior factor 1.0
    # the prior factor weighs like one point 0.3 × mean raw from the mean: a wide spread outweighs it
    assert fitted.factor == pytest.approx(1.23, rel=0.02)
    assert fitted.constant == pytest.approx(420 * 2**20, rel=0.05)
    assert fitted.points == 5
    assert all(abs(fitted.relative_error(c, m)) < 0.01 for c, m in points)
    # with the true factor as the prior, the fit is exact
    exact = MemoryModel(TINY, device="cpu", factor=1.23).calibrate(points)
    assert (exact.constant, exact.factor) == (pytest.approx(420 * 2**20), pytest.approx(1.23))


def test_calibration_over_a_narrow_range_stays_near_the_prior_factor():
    # three nearly equal raw totals with noisy peaks: plain least squares would follow the noise to a
    # factor of ~5 (clamped to 3); the prior keeps it sane
    pairs = [(130e6, 580e6), (132e6, 575e6), (134e6, 600e6)]
    _, factor = fit_constant_and_factor(pairs, prior_factor=1.0)
    assert 0.9 < factor < 1.6


def test_calibration_with_one_point_keeps_the_prior_factor():
    config = ProbeConfig()
    model = MemoryModel(TINY, device="cpu")
    measured = 600 * 2**20
    model.calibrate([(config, measured)])
    assert model.factor == PRIORS["cpu"][1]
    assert model.predict(config) == pytest.approx(measured, abs=1)


def test_calibration_clamps_the_factor_and_the_constant():
    # a steep line: the factor is clamped to 3 and the constant refitted
    constant, factor = fit_constant_and_factor([(1.0e8, 1.0e8), (3.0e8, 5.0e9)], prior_factor=1.1)
    assert factor == 3.0
    # points through a negative intercept: the constant stays >= 0, the factor is refitted through 0
    constant, factor = fit_constant_and_factor([(1.0e9, 0.5e9), (2.0e9, 2.0e9)], prior_factor=1.1)
    assert constant == 0.0
    assert 0.5 <= factor <= 3.0
    # one point below factor × raw: constant 0, factor = measured / raw
    constant, factor = fit_constant_and_factor([(1.0e9, 0.8e9)], prior_factor=1.1)
    assert (constant, factor) == (0.0, pytest.approx(0.8))


def test_calibration_without_points_keeps_the_priors():
    model = MemoryModel(LLAMA_7B, device="cuda").calibrate([])
    assert (model.constant, model.factor) == PRIORS["cuda"]


def test_serialisation_round_trip():
    model = MemoryModel(LLAMA_7B, world_size=4, device="cuda", constant=0.9 * GIB, factor=1.07)
    model.points = 3
    copy = MemoryModel.from_dict(model.to_dict())
    assert copy.to_dict() == model.to_dict()
    config = ProbeConfig(micro_batch_size=2, train_batch_size=64, rollout_batch_size=32)
    assert copy.predict(config) == model.predict(config)


def test_minimum_bytes_is_below_every_prediction():
    model = MemoryModel(LLAMA_7B, device="cuda")
    for config in [ProbeConfig(), ProbeConfig(micro_batch_size=1, max_response_length=8)]:
        assert model.minimum_bytes(config) < model.predict(config)


def test_bad_device_and_measurement_are_value_errors():
    with pytest.raises(ValueError, match="device"):
        MemoryModel(TINY, device="tpu")
    with pytest.raises(ValueError, match="device"):
        predict_components(TINY, ProbeConfig(), device="tpu")
    with pytest.raises(ValueError, match="measured"):
        MemoryModel(TINY, device="cpu").relative_error(ProbeConfig(), 0)
