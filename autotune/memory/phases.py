"""The transient bytes of each phase of a step, which run one after another so only the largest counts:
rollout (generate's KV cache, logits and prefill), scoring (the forward-only passes and the reward model)
and update (training activations, logits with their gradients, the optimizer step), and the moment in
backward where the update peaks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.config.job_lengths import PassTokens
from autotune.config.knobs import ProbeConfig
from autotune.config.passes import Passes
from autotune.memory.activations import (
    MicroBatch,
    autocast_weight_copy,
    forward_logits,
    layer_forward_bytes,
    training_activations,
    training_logits,
)
from autotune.memory.architecture import Architecture, Precision, trainable_parameters
from autotune.memory.states import Holding

__all__ = ["PassBatches", "backward_moment", "rollout_terms", "scoring_terms", "update_terms"]


@dataclass(frozen=True)
class PassBatches:
    """The largest micro batch of each training pass (None: the pass does not run)."""

    update: MicroBatch
    forward: MicroBatch
    critic_update: MicroBatch | None
    critic_forward: MicroBatch | None

    @classmethod
    def of(cls, config: ProbeConfig, device: str, passes: Passes, tokens: PassTokens) -> PassBatches:
        """verl's passes: packed micro batches of `tokens`; TRL's: padded rows of the micro batch sizes."""
        if passes.padded:
            fused = passes.fused_head
            update = MicroBatch.padded(config, config.micro_batch_size, fused)
            forward = MicroBatch.padded(config, config.forward_micro_batch_size, fused)
            critic = config.algorithm == "ppo"
            return cls(update, forward, update if critic else None, forward if critic else None)
        return cls(
            MicroBatch.of_packed(tokens.update, device),
            MicroBatch.of_packed(tokens.forward, device),
            MicroBatch.of_packed(tokens.critic_update, device) if tokens.critic_update else None,
            MicroBatch.of_packed(tokens.critic_forward, device) if tokens.critic_forward else None,
        )


def rollout_terms(arch: Architecture, config: ProbeConfig, p: Precision, world_size: int) -> dict[str, int]:
    """Hugging Face generate over the rank's R/W samples at once (the TRL-like passes; verl's rollout is
    vLLM's pool, priced apart): the KV cache, each step's logits, the prompt's prefill."""
    samples = config.rollout_batch_size // world_size  # R counts samples (prompts × rollout_n)
    length = config.sequence_length
    per_token_layer = 2 * arch.kv_size * p.act  # K and V
    # DynamicCache grows by torch.cat: the new and the old tensors of one layer coexist for a moment
    kv_cache = samples * length * per_token_layer * (arch.layers + 1)
    # per step: the model's last-position logits, generate's fp32 copy, the softmax probabilities
    generation_logits = samples * arch.vocab * (p.act + 4 + 4)
    prompt_tokens = samples * config.max_prompt_length
    prefill = prompt_tokens * layer_forward_bytes(arch, p) + samples * config.max_prompt_length**2
    cache = autocast_weight_copy(arch, arch.actor_parameters, p, config)
    return {
        "kv_cache": kv_cache,
        "generation_logits": generation_logits,
        "prefill_activations": prefill,
        "generation_autocast_weights": cache,
    }


def _reward_forward(arch: Architecture, config: ProbeConfig, p: Precision, world_size: int) -> int:
    """The reward model at R/W sequences: DeBERTa-style attention materialises ~4 b·a·s² score tensors."""
    if not arch.reward_parameters:
        return 0
    rows, length = config.rollout_batch_size // world_size, config.sequence_length
    h, i = arch.reward_hidden, arch.reward_intermediate
    per_token = p.act * (3 * h + 3 * i)
    scores = 4 * arch.reward_heads * length * length * p.act
    return rows * (length * per_token + scores)


def scoring_terms(
    arch: Architecture, config: ProbeConfig, p: Precision, world_size: int, batches: PassBatches
) -> dict[str, int]:
    """The forward-only passes (old and reference log-probs, the critic's values) at their micro batch, and
    the reward model: nothing is kept for backward, so one layer's transients or the logits set the peak."""
    run = batches.forward
    hidden = run.tokens * arch.hidden * p.residual  # the final hidden states, alive while the logits are made
    layer = run.tokens * layer_forward_bytes(arch, p) + run.mask
    critic = batches.critic_forward
    if critic is not None:  # the values pass: a layer's transients, no vocabulary-sized logits
        critic_hidden = critic.tokens * arch.hidden * p.residual
        layer = max(
            layer, critic.tokens * layer_forward_bytes(arch, p) + critic.mask + critic_hidden - hidden
        )
    logits = forward_logits(arch, config, p, run, entropy=run.packed)
    actor_cache = autocast_weight_copy(arch, arch.actor_parameters, p, config)
    critic_cache = 0
    if config.algorithm == "ppo":
        critic_cache = autocast_weight_copy(arch, arch.critic_parameters, p, config, lm_head=False)
    terms = {
        "scoring_activations": hidden + layer,
        "scoring_hidden": hidden,
        "scoring_logits": logits,
        "scoring_autocast_weights": max(actor_cache, critic_cache),
        "reward_activations": _reward_forward(arch, config, p, world_size),
    }
    return terms


def update_terms(
    arch: Architecture, config: ProbeConfig, p: Precision, held: Holding, batches: PassBatches
) -> dict[str, int]:
    """A training micro batch (the actor's or the critic's, the larger): its saved activations, the logits
    with their gradients, backward's workspace, and the optimizer step's temporaries that come after."""
    saved, workspace, end = training_activations(arch, config, p, batches.update)
    if batches.critic_update is not None:  # the critic's micro batch may have a budget of its own
        by_critic = training_activations(arch, config, p, batches.critic_update)
        saved, workspace, end = (
            max(ours, its) for ours, its in zip((saved, workspace, end), by_critic, strict=True)
        )
    actor, critic = trainable_parameters(arch, config)
    # AdamW's temporaries: foreach on CUDA (sqrt of every exp_avg_sq at once), per tensor on CPU (two copies
    # of the largest tensor, the embedding or the LM head); of the local shards when sharded
    if p.autocast:
        step = max(actor, critic) * 4 // held.shards
    else:
        largest = arch.vocab * arch.hidden if not config.use_lora else arch.intermediate * config.lora_r
        step = 2 * largest * 4 // held.shards
    # zero_grad(set_to_none=True) opens every mini-batch: with one micro-batch per step the model's own
    # gradients are not alive during its forward (they fill in as backward frees the activations)
    released = actor * 4 // held.shards if config.gradient_accumulation_steps == 1 else 0
    logits = training_logits(arch, config, p, batches.update)
    return {
        "activations": saved,
        "logits": logits,
        "backward_workspace": workspace,
        "backward_end": end,
        "update_autocast_weights": autocast_weight_copy(arch, arch.actor_parameters, p, config),
        "released_gradients": 0 if held.weights_away else released,
        "optimizer_step": 0 if held.states_on_host else step,  # CPUOffloadPolicy: Adam steps on the host
    }


def backward_moment(update: dict[str, int], get: Any) -> tuple[int, int]:
    """(exact, dynamic) bytes of the update's backward at its largest moment. Backward opens on the logits'
    gradients, before any unit is gathered again for it; the layers come after, one recomputed at a time
    with two units gathered and the reduce-scatter in flight (the trace at 7B-13B: never both at once). It
    ends in the first layer: with one micro batch per step the gradients zero_grad released are all back by
    then (the trace at 7B-13B with micro batch 16: the backward's peak)."""
    autocast, released = update["update_autocast_weights"], update["released_gradients"]
    units = autocast + get("gathered_update", 0) + get("reduce_scatter", 0)
    logits = (autocast - released, update["activations"] + update["logits"])
    layers = (units - released, update["activations"] + update["backward_workspace"])
    end = (units, update["backward_end"])
    return max(logits, layers, end, key=sum)
