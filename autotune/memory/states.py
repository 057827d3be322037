"""The training states a rank holds, as `autotune.probe.rank.sharding` holds them: weights, gradients, Adam's
moments, DDP's buckets and the rollout buffer through the whole iteration; sharded or offloaded, what each
phase gathers or brings back. All exact bytes: the calibration's factor never scales them."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config.knobs import ProbeConfig
from autotune.config.passes import Passes
from autotune.memory.architecture import Architecture, Precision, trainable_parameters, unit_parameters

__all__ = [
    "ADAM_MOMENTS",
    "Holding",
    "model_weights",
    "resident_weights",
    "rollout_buffer",
    "sharded_terms",
    "static_terms",
]

ADAM_MOMENTS = 2  # AdamW: exp_avg and exp_avg_sq, fp32 like the parameters


@dataclass(frozen=True)
class Holding:
    """How the training states are held (autotune.probe.rank.sharding): the shard divisor, what is offloaded,
    and whether the reference's shards live on the host (CUDA: verl's forward-only engines offload them)."""

    shards: int
    sharding: str
    param_offload: bool
    optimizer_offload: bool
    reference_on_host: bool
    states_on_host: bool  # offload_policy: actor and critic states live on the host, Adam steps there

    @classmethod
    def of(cls, config: ProbeConfig, world_size: int, device: str) -> Holding:
        sharded, cuda = config.sharded, device == "cuda"
        return cls(
            shards=world_size if sharded else 1,
            sharding=config.sharding,
            # verl ignores param_offload and optimizer_offload under offload_policy
            param_offload=config.param_offload and sharded and cuda and not config.offload_policy,
            optimizer_offload=config.optimizer_offload and sharded and cuda and not config.offload_policy,
            reference_on_host=sharded and cuda,
            states_on_host=config.offload_policy and sharded and cuda,
        )

    @property
    def weights_away(self) -> bool:
        return self.param_offload or self.states_on_host

    @property
    def optimizer_away(self) -> bool:
        return self.optimizer_offload or self.states_on_host


def model_weights(arch: Architecture, config: ProbeConfig, p: Precision) -> tuple[int, int, int]:
    """Unsharded bytes of (actor, critic, reference) weights: frozen bases + fp32 adapters with LoRA (the
    reference is then the actor with its adapters disabled), fp32 trainables otherwise."""
    actor, critic = trainable_parameters(arch, config)
    if config.use_lora:
        critic_base = arch.critic_parameters * p.frozen if critic else 0
        return arch.actor_parameters * p.frozen + actor * p.trainable, critic_base + critic * p.trainable, 0
    reference = arch.actor_parameters * p.frozen if config.use_kl else 0  # verl builds it only for KL
    return actor * p.trainable, critic * p.trainable, reference


def resident_weights(arch: Architecture, config: ProbeConfig, p: Precision, held: Holding) -> int:
    """The weights that stay on the device: each model's shard, none of what offload or the host keeps."""
    actor, critic, reference = model_weights(arch, config, p)
    trained = 0 if held.weights_away else (actor + critic) // held.shards
    reference = 0 if held.reference_on_host else reference // held.shards
    return trained + reference + arch.reward_parameters * p.frozen  # the reward model runs whole


def rollout_buffer(config: ProbeConfig, world_size: int, passes: Passes = Passes.VERL) -> int:
    """The rank's rollout on the device, as `ppo.rollout`, `score` and `advantages` keep it: a score per
    sample; int64 response ids (verl's passes: padded to the response limit, each sample's own tokens stay on
    the host until its micro batch is packed) or whole left-padded rows of ids and mask (generated); and per
    response token the mask, old log-probs and advantages (and the entropy, verl's), reference log-probs
    with KL, values and returns for PPO (fp32)."""
    samples = config.train_batch_size // world_size
    ids = config.max_response_length * 8 if passes.packed else 2 * config.sequence_length * 8
    per_token = 3 + config.use_kl + 2 * (config.algorithm == "ppo") + passes.packed
    return samples * (ids + per_token * config.max_response_length * 4 + 4)


def sharded_terms(arch: Architecture, config: ProbeConfig, p: Precision, held: Holding) -> dict[str, int]:
    """What FSDP gathers in each phase, and what offload brings back to the device for it (exact bytes)."""
    if held.shards == 1 and not config.sharded:
        return {}
    whole_actor = arch.actor_parameters * p.act  # gathered at the compute dtype (bf16 on CUDA)
    whole_critic = arch.critic_parameters * p.act if config.algorithm == "ppo" else 0
    whole_ref = whole_actor if config.use_kl and not config.use_lora else 0
    unit = unit_parameters(arch) * p.act
    # backward: the unit's gradient (at the compute dtype) and the fp32 reduce-scatter input it is copied into
    trained_grads = 0 if config.use_lora else unit_parameters(arch) * (p.act + 4)
    if (
        config.sharding == "shard_grad_op"
    ):  # nothing reshards a forward's weights before that model's backward
        everything = whole_actor + whole_ref + whole_critic
        gathered = {"gathered_rollout": whole_actor + whole_ref + unit, "gathered_scoring": everything}
        gathered["gathered_update"] = everything
    else:
        gathered = {
            "gathered_rollout": whole_actor + unit,
            "gathered_scoring": 2 * unit,
            "gathered_update": 2 * unit,
        }
    actor_w, critic_w, _ = model_weights(arch, config, p)
    actor_t, critic_t = trainable_parameters(arch, config)
    largest_w, largest_t = max(actor_w, critic_w) // held.shards, max(actor_t, critic_t) // held.shards
    loaded = {"loaded_rollout": 0, "loaded_scoring": 0, "loaded_update": 0}
    if held.param_offload:  # weights (and, for the update, gradients) come for the phases that use them
        loaded["loaded_rollout"] = actor_w // held.shards
        loaded["loaded_scoring"] = largest_w
        loaded["loaded_update"] = largest_w + largest_t * 4
    if held.optimizer_offload:
        loaded["loaded_update"] += largest_t * 4 * ADAM_MOMENTS
    return {**gathered, "reduce_scatter": trained_grads, **loaded}


def static_terms(
    arch: Architecture, config: ProbeConfig, p: Precision, held: Holding, world_size: int, passes: Passes
) -> dict[str, int]:
    """The states alive through the whole iteration (MemoryBreakdown's static terms): gradients and Adam's
    moments are fp32 for every trainable parameter, and DDP keeps one more copy of the gradients."""
    actor, critic = trainable_parameters(arch, config)
    trainable = actor + critic
    return {
        "weights": resident_weights(arch, config, p, held),
        "gradients": 0 if held.weights_away else trainable * 4 // held.shards,
        "optimizer": 0 if held.optimizer_away else trainable * 4 * ADAM_MOMENTS // held.shards,
        "ddp_buckets": trainable * 4 if world_size > 1 and not config.sharded else 0,
        "rollout_buffer": rollout_buffer(config, world_size, passes),
    }
