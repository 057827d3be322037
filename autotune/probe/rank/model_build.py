"""Build the probe's models the way a verl PPO job holds them: actor, reference, critic, reward.

Precision on GPU: trainable full models keep fp32 weights (mixed-precision Adam: ~16 B per trainable
parameter) and compute in bf16 (autocast, or FSDP's mixed precision); frozen models (reference, reward, a
LoRA base) are bf16. On CPU everything is fp32 (CPU bf16 kernels are slow and not what a GPU run does).
Actor, critic and reference are held as `sharding` says (autotune.probe.rank.sharding); the reward model
runs whole on every rank, as a served reward model does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from autotune.config.knobs import ProbeConfig
from autotune.models.catalog import (
    ModelSpec,
    build_causal_lm,
    build_critic,
    build_reward_model,
)
from autotune.probe.rank.ppo import Models
from autotune.probe.rank.sharding import distribute, park, place

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["build_actor_and_ref", "build_models", "build_value_model", "dtypes", "gpu_precision"]

# Projections LoRA adapts in llama/qwen-style blocks; other architectures fall back to every linear layer.
_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LEARNING_RATE = 1e-6


def gpu_precision(device: torch.device, precision: bool | None = None) -> bool:
    """Whether models take a GPU run's dtypes: on CUDA, or where a memory trace on the host asks for them."""
    return device.type == "cuda" if precision is None else precision


def dtypes(device: torch.device, precision: bool | None = None) -> tuple[torch.dtype, torch.dtype]:
    """(trainable weights, frozen weights)."""
    if gpu_precision(device, precision):
        return torch.float32, torch.bfloat16
    return torch.float32, torch.float32


def _lora_targets(model: torch.nn.Module) -> list[str] | str:
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in _LORA_TARGETS if t in names]
    return targets or "all-linear"


def _with_lora(model: torch.nn.Module, config: ProbeConfig, task_type: str) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=0.0,
        target_modules=_lora_targets(model),
        task_type=task_type,
    )
    return get_peft_model(model, lora)  # adapters are kept in fp32 by peft (autocast_adapter_dtype)


def _prepare_trainable(model: PreTrainedModel, config: ProbeConfig) -> PreTrainedModel:
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if config.use_lora:
            model.enable_input_require_grads()
    return model


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=LEARNING_RATE)


def build_actor_and_ref(
    spec: ModelSpec, config: ProbeConfig, device: torch.device, precision: bool | None = None
):
    """(actor, reference) before sharding, built where `place` says."""
    trainable, frozen = dtypes(device, precision)
    where = place(config, device)
    if config.use_lora:
        base = _prepare_trainable(build_causal_lm(spec, dtype=frozen, device=where), config)
        for param in base.parameters():
            param.requires_grad_(False)
        return _with_lora(base, config, "CAUSAL_LM"), None
    actor = _prepare_trainable(build_causal_lm(spec, dtype=trainable, device=where), config)
    if not config.use_kl:  # as verl: a reference model exists only when the recipe uses KL
        return actor, None
    ref = build_causal_lm(spec, dtype=frozen, device=where).eval().requires_grad_(False)
    return actor, ref


def build_value_model(
    spec: ModelSpec, config: ProbeConfig, device: torch.device, precision: bool | None = None
) -> torch.nn.Module:
    """The critic before sharding, built where `place` says."""
    trainable, frozen = dtypes(device, precision)
    where = place(config, device)
    if not config.use_lora:
        return _prepare_trainable(build_critic(spec, dtype=trainable, device=where), config)
    critic = _prepare_trainable(build_critic(spec, dtype=frozen, device=where), config)
    critic.requires_grad_(False)
    # The value head stays fully trainable (peft's modules_to_save), the body gets adapters.
    return _with_lora(critic, config, "TOKEN_CLS")


def build_models(
    actor_spec: ModelSpec,
    reward_spec: ModelSpec | None,
    config: ProbeConfig,
    device: torch.device,
    world_size: int,
    precision: bool | None = None,
) -> Models:
    """`precision`: True builds with a GPU run's dtypes and mixed precision on any device (a memory trace on
    the host); None takes the device's own."""
    actor, ref = build_actor_and_ref(actor_spec, config, device, precision)
    critic = build_value_model(actor_spec, config, device, precision) if config.algorithm == "ppo" else None
    _, frozen = dtypes(device, precision)
    reward = None
    if reward_spec is not None:
        reward = build_reward_model(reward_spec, dtype=frozen, device=device).eval().requires_grad_(False)
    # Optimizers come after sharding: FSDP replaces the parameters with their shards
    mixed = gpu_precision(device, precision)
    actor = distribute(actor.train(), config, device, world_size, mixed=mixed)
    if critic is not None:
        critic = distribute(critic.train(), config, device, world_size, mixed=mixed)
    if ref is not None:
        ref = distribute(ref, config, device, world_size, trainable=False, mixed=mixed)
    park(config, device, actor, critic)
    return Models(
        actor=actor,
        ref=ref,
        critic=critic,
        reward=reward,
        actor_optimizer=_optimizer(actor),
        critic_optimizer=_optimizer(critic) if critic is not None else None,
        reward_vocab=reward_spec.config.vocab_size if reward_spec is not None else 0,
    )
