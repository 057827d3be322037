"""Peak bytes per GPU when verl's FSDP shards (or offloads) the training states, from the probe's model.

    estimate = estimate_memory(arch, config, gpus=4, sharding="full_shard")   # CUDA priors, uncalibrated
    estimate.peak, estimate.states, estimate.phases, estimate.peak_phase

The probe replicates its states (DDP): `MemoryModel` predicts that. Here its terms are re-sharded: FULL_SHARD
divides parameter, gradient and optimizer states by W and adds one gathered layer; SHARD_GRAD_OP divides
gradients and optimizer states only; offload moves the states to CPU memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config.knobs import ProbeConfig
from autotune.memory.model import Architecture, MemoryBreakdown, MemoryModel
from autotune.units import GIB

__all__ = ["SHARDINGS", "MemoryEstimate", "describe", "estimate_memory", "layer_parameters"]

SHARDINGS = ("none", "full_shard", "shard_grad_op")


def gib(value: float) -> str:
    return f"{value / GIB:.1f}"


@dataclass(frozen=True)
class MemoryEstimate:
    peak: int  # predicted bytes per GPU: constant + factor × raw
    raw: int  # the terms' sum
    states: dict[str, int]  # weights, gradients, optimizer, ... (alive all the time)
    phases: dict[str, int]  # rollout, scoring, update: only the largest counts
    constant: float
    factor: float

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.__getitem__)


def layer_parameters(arch: Architecture) -> int:
    """One decoder layer's parameters: the model less its embedding (and untied LM head), per layer."""
    embeddings = arch.vocab * arch.hidden * (1 if arch.tied_embeddings else 2)
    return (arch.actor_parameters - embeddings) // arch.layers


def estimate_memory(
    arch: Architecture, config: ProbeConfig, gpus: int, sharding: str = "none", offload: bool = False
) -> MemoryEstimate:
    """Peak bytes per GPU: the memory model's terms, re-sharded for FSDP (CUDA priors, uncalibrated).

    FULL_SHARD: parameters, gradients and optimizer states of every model (actor, critic, reference,
    reward) ÷ W; no DDP buckets; weights are gathered one layer at a time — 4 B per parameter of a layer
    (the current and the prefetched layer in bf16) — and backward holds that layer's full fp32 gradient
    before the reduce-scatter. FSDP's mixed precision casts only the gathered layer, so the probe's
    whole-model bf16 autocast copies are dropped. SHARD_GRAD_OP: gradients and optimizer ÷ W, weights
    replicated. cpu_offload: the states live in CPU memory and Adam steps there.
    """
    model = MemoryModel(arch, gpus, "cuda")
    b = model.breakdown(config)
    layer = layer_parameters(arch) * 4 if sharding == "full_shard" else 0
    states = _state_terms(b, gpus, sharding, offload, layer)
    phases = _phase_terms(b, gpus, sharding, offload, layer)
    raw = sum(states.values()) + max(phases.values())
    return MemoryEstimate(
        int(model.constant + model.factor * raw), raw, states, phases, model.constant, model.factor
    )


def _state_terms(b: MemoryBreakdown, gpus: int, sharding: str, offload: bool, layer: int) -> dict[str, int]:
    shard = gpus if sharding != "none" else 1
    weights = b.weights // (gpus if sharding == "full_shard" else 1)
    states = {
        "weights": 0 if offload else weights,
        "gradients": 0 if offload else b.gradients // shard,
        "optimizer": 0 if offload else b.optimizer // shard,
        "ddp_buckets": b.ddp_buckets if sharding == "none" and not offload else 0,
        "gathered_layer": layer,
        "rollout_buffer": b.rollout_buffer + b.allocator_retention,
    }
    return states


def _phase_terms(b: MemoryBreakdown, gpus: int, sharding: str, offload: bool, layer: int) -> dict[str, int]:
    autocast = sharding != "full_shard"  # FSDP casts the gathered layer only (see estimate_memory)
    shard = gpus if sharding != "none" else 1
    rollout = b.kv_cache + b.generation_logits + b.prefill_activations
    forward = b.scoring_activations + b.scoring_logits
    training = b.activations + max(b.logits, b.backward_workspace) + layer
    if autocast:
        rollout += b.generation_autocast_weights
        forward += b.scoring_autocast_weights
        training += b.update_autocast_weights
    training -= 0 if offload else b.released_gradients // shard
    return {
        "rollout": rollout,
        "scoring": max(forward, b.reward_activations),
        "update": max(training, 0 if offload else b.optimizer_step // shard),
    }


def describe(
    estimate: MemoryEstimate,
    sharding: str,
    label: str,
    offload: bool,
    config: ProbeConfig,
    gpus: int,
    reward: bool,
) -> str:
    """How the peak is made up and how it was computed: one sentence."""
    s = estimate.states
    models = "actor + critic + reference" if config.algorithm == "ppo" else "actor + reference"
    models += " + reward model" if reward else ""
    if offload:
        how = "states offloaded to CPU (not counted)"
    elif sharding == "full_shard":
        how = (
            f"{label} over {gpus} GPUs: parameter, gradient and optimizer states ÷ {gpus}, "
            f"plus one gathered layer {gib(s['gathered_layer'])} GiB"
        )
    elif sharding == "shard_grad_op":
        how = f"{label}: gradient and optimizer states ÷ {gpus}, weights replicated"
    else:
        how = "states replicated on every GPU, as autotune's DDP probe"
    phase = estimate.peak_phase
    tokens = f"{config.micro_batch_size} × {config.sequence_length} tokens"
    detail = f" (micro batch {tokens})" if phase == "update" else ""
    return (
        f"{models}: weights {gib(s['weights'])} + gradients {gib(s['gradients'])} + Adam states "
        f"{gib(s['optimizer'])} GiB ({how}), then the {phase} phase {gib(estimate.phases[phase])} GiB"
        f"{detail}; peak = {estimate.constant / GIB:.2f} GiB + {estimate.factor:g} × "
        f"{gib(estimate.raw)} GiB (the memory model of autotune's probe, CUDA priors, uncalibrated)"
    )
