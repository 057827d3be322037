"""One verl-style PPO/GRPO iteration: rollout, scoring, advantages, update (docs/design.md, "The probe").

Runs inside a probe rank (the runner program imports it). Each rank works on its share of the global batch;
gradients of the trainable models are averaged by DDP or FSDP (autotune.probe.rank.sharding), so W ranks do
the same work as verl's data-parallel actor and critic workers. With offload, each model's states come to the
device for the phases that use them, as verl's workers load and offload around each call.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from autotune.config.knobs import ProbeConfig
from autotune.probe.rank import rl_math
from autotune.probe.rank.sharding import gathered, offloaded

__all__ = [
    "Models",
    "StepContext",
    "advantages",
    "barrier",
    "iteration",
    "response_log_probs",
    "response_values",
    "reward_scores",
    "rollout",
    "score",
    "synchronize",
    "timed",
    "unwrap",
    "update",
    "warmup_config",
]

GAMMA, LAM, CLIP_RATIO, VALUE_CLIP = 1.0, 1.0, 0.2, 0.5  # verl's defaults


@dataclass
class Models:
    actor: torch.nn.Module
    # None with LoRA (the reference is the actor with its adapters disabled), or when the recipe has no KL
    ref: torch.nn.Module | None
    critic: torch.nn.Module | None  # None for GRPO
    reward: torch.nn.Module | None  # None for a rule-based reward function
    actor_optimizer: torch.optim.Optimizer
    critic_optimizer: torch.optim.Optimizer | None
    reward_vocab: int = 0


@dataclass
class StepContext:
    config: ProbeConfig
    device: torch.device
    world_size: int
    pad_token_id: int
    compute_dtype: torch.dtype | None = None  # autocast dtype on GPU (bf16); None on CPU
    phases: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def autocast(self):
        if self.compute_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    @property
    def samples_per_rank(self) -> int:
        return self.config.train_batch_size // self.world_size


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def timed(ctx: StepContext, phase: str):
    synchronize(ctx.device)
    start = time.perf_counter()
    yield
    synchronize(ctx.device)
    ctx.phases[phase] += time.perf_counter() - start


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


# --- rollout -------------------------------------------------------------------------------------------


def rollout(models: Models, ctx: StepContext, prompt_batches: Iterator[dict[str, torch.Tensor]]) -> dict:
    """T/R generation calls of R samples (each rank R/W), forced to exactly max_response_length tokens."""
    c = ctx.config
    sequences: list[torch.Tensor] = []
    masks: list[torch.Tensor] = []
    actor = unwrap(models.actor)
    with offloaded(c, ctx.device, actor), gathered(actor, c), inference(actor):
        for _ in range(c.train_batch_size // c.rollout_batch_size):
            _generate_one(actor, ctx, next(prompt_batches), sequences, masks)
    input_ids = torch.cat(sequences)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.cat(masks),
        "responses": input_ids[:, c.max_prompt_length :],
    }


@contextmanager
def inference(model: torch.nn.Module):
    """Generation runs in eval mode, as verl's rollout engine does: a model in training mode with gradient
    checkpointing on makes Hugging Face drop the KV cache (every new token recomputes the whole sequence)."""
    model.eval()
    try:
        yield
    finally:
        model.train()


def _generate_one(
    actor: torch.nn.Module, ctx: StepContext, batch: dict, sequences: list, masks: list
) -> None:
    c = ctx.config
    prompts = batch["input_ids"].repeat_interleave(c.rollout_n, dim=0).to(ctx.device)
    prompt_mask = batch["attention_mask"].repeat_interleave(c.rollout_n, dim=0).to(ctx.device)
    hf: Any = actor  # a Hugging Face model or peft's wrapper: `generate` is theirs, not torch's Module's
    with torch.no_grad(), ctx.autocast():
        out = hf.generate(
            input_ids=prompts,
            attention_mask=prompt_mask,
            do_sample=True,
            top_k=0,
            top_p=1.0,
            max_new_tokens=c.max_response_length,
            min_new_tokens=c.max_response_length,
            use_cache=True,
            pad_token_id=ctx.pad_token_id,
        )
    response_mask = torch.ones(
        out.shape[0], c.max_response_length, dtype=prompt_mask.dtype, device=ctx.device
    )
    sequences.append(out)
    masks.append(torch.cat([prompt_mask, response_mask], dim=1))


# --- scoring -------------------------------------------------------------------------------------------


def _chunks(size: int, chunk: int) -> list[slice]:
    return [slice(start, start + chunk) for start in range(0, size, chunk)]


def response_log_probs(model: torch.nn.Module, ctx: StepContext, ids, mask, responses) -> torch.Tensor:
    """Log-probs of the response tokens; only the response positions' logits are materialised."""
    length = responses.shape[1]
    with ctx.autocast():
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=length + 1, use_cache=False).logits
    return rl_math.logprobs_from_logits(logits[:, :-1].float(), responses)


def response_values(critic: torch.nn.Module, ctx: StepContext, ids, mask, length: int) -> torch.Tensor:
    with ctx.autocast():
        values = critic(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
    return values[:, -length - 1 : -1].float()


def _forward_in_micro_batches(fn, batch: dict, micro: int) -> torch.Tensor:
    size = batch["input_ids"].shape[0]
    with torch.no_grad():
        return torch.cat(
            [
                fn(batch["input_ids"][s], batch["attention_mask"][s], batch["responses"][s])
                for s in _chunks(size, micro)
            ]
        )


def reward_scores(models: Models, ctx: StepContext, batch: dict) -> torch.Tensor:
    """Sequence scores: the reward model in batches of the rollout share, or a rule-based function."""
    responses = batch["responses"]
    if models.reward is None:
        # Rule-based reward (no model): the share of response tokens divisible by 7, a stand-in for a
        # verifier that inspects the tokens. Cheap, as real rule-based rewards are.
        return (responses % 7 == 0).float().mean(dim=1)
    size = batch["input_ids"].shape[0]
    share = ctx.config.rollout_batch_size // ctx.world_size
    scores = []
    with torch.no_grad(), ctx.autocast():
        for s in _chunks(size, share):
            # The reward model has its own vocabulary: verl re-tokenises the text; ids are mapped here.
            ids = batch["input_ids"][s] % models.reward_vocab
            scores.append(
                models.reward(input_ids=ids, attention_mask=batch["attention_mask"][s]).logits[:, 0]
            )
    return torch.cat(scores).float()


def score(models: Models, ctx: StepContext, batch: dict) -> None:
    c = ctx.config
    micro = c.forward_micro_batch_size
    actor = unwrap(models.actor)
    batch["scores"] = reward_scores(models, ctx, batch)
    with offloaded(c, ctx.device, actor):
        batch["old_log_probs"] = _forward_in_micro_batches(
            lambda i, m, r: response_log_probs(actor, ctx, i, m, r), batch, micro
        )
        if c.use_kl and models.ref is None:
            peft_model: Any = actor  # peft's wrapper (untyped): disable_adapter is peft's
            with peft_model.disable_adapter():  # LoRA: the frozen base model is the reference, no second copy
                batch["ref_log_probs"] = _forward_in_micro_batches(
                    lambda i, m, r: response_log_probs(actor, ctx, i, m, r), batch, micro
                )
    if c.use_kl and models.ref is not None:  # full fine-tuning with KL: a reference model of its own
        batch["ref_log_probs"] = _forward_in_micro_batches(
            lambda i, m, r: response_log_probs(models.ref, ctx, i, m, r), batch, micro
        )
    if models.critic is not None:
        critic = unwrap(models.critic)
        with offloaded(c, ctx.device, critic):
            batch["values"] = _forward_in_micro_batches(
                lambda i, m, r: response_values(critic, ctx, i, m, r.shape[1]), batch, micro
            )


# --- advantages ----------------------------------------------------------------------------------------


def advantages(ctx: StepContext, batch: dict) -> None:
    c = ctx.config
    mask = torch.ones_like(batch["old_log_probs"])
    batch["response_mask"] = mask
    if c.algorithm == "grpo":
        # Group ids: each prompt's rollout_n samples are adjacent (repeat_interleave in rollout).
        groups = torch.arange(batch["scores"].shape[0], device=mask.device) // c.rollout_n
        batch["advantages"] = rl_math.grpo_advantages(batch["scores"], groups, mask)
        return
    kl = rl_math.kl_penalty(batch["old_log_probs"], batch["ref_log_probs"], "k1") if c.use_kl else None
    rewards = rl_math.token_rewards_from_scores(batch["scores"], mask, kl=kl, kl_coef=c.kl_coef)
    batch["advantages"], batch["returns"] = rl_math.compute_gae(rewards, batch["values"], mask, GAMMA, LAM)


# --- update --------------------------------------------------------------------------------------------


def _micro_batches(ctx: StepContext, generator: torch.Generator) -> Iterator[list[torch.Tensor]]:
    """Mini-batches of micro_batch_size × gradient_accumulation_steps samples per rank, shuffled."""
    c = ctx.config
    order = torch.randperm(ctx.samples_per_rank, generator=generator)
    mini = c.micro_batch_size * c.gradient_accumulation_steps
    for start in range(0, ctx.samples_per_rank, mini):
        indices = order[start : start + mini]
        yield [indices[j : j + c.micro_batch_size] for j in range(0, mini, c.micro_batch_size)]


def _no_sync(model: torch.nn.Module, last: bool):
    """Skip DDP's all-reduce on all but the last micro-batch of an accumulation step. FSDP reduce-scatters
    every micro-batch, as verl's default (use_no_sync_for_gradient_accumulation: false) does."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not last:
        return model.no_sync()
    return nullcontext()


def _actor_loss(models: Models, ctx: StepContext, batch: dict, idx: torch.Tensor) -> torch.Tensor:
    c = ctx.config
    log_probs = response_log_probs(
        models.actor, ctx, batch["input_ids"][idx], batch["attention_mask"][idx], batch["responses"][idx]
    )
    mask = batch["response_mask"][idx]
    loss, _ = rl_math.policy_loss(
        log_probs, batch["old_log_probs"][idx], batch["advantages"][idx], mask, CLIP_RATIO
    )
    if c.algorithm == "grpo" and c.use_kl:  # GRPO keeps the KL out of the reward, in the loss (k3, as verl)
        kl = rl_math.kl_penalty(log_probs, batch["ref_log_probs"][idx], "k3")
        loss = loss + c.kl_coef * rl_math.masked_mean(kl, mask)
    return loss


def _critic_loss(models: Models, ctx: StepContext, batch: dict, idx: torch.Tensor) -> torch.Tensor:
    assert models.critic is not None  # update trains the critic only when there is one
    values = response_values(
        models.critic, ctx, batch["input_ids"][idx], batch["attention_mask"][idx], batch["responses"].shape[1]
    )
    loss, _ = rl_math.value_loss(
        values, batch["values"][idx], batch["returns"][idx], batch["response_mask"][idx], VALUE_CLIP
    )
    return loss


def _train(model, optimizer, loss_fn, ctx: StepContext, batch: dict, generator: torch.Generator) -> None:
    steps = ctx.config.gradient_accumulation_steps
    with offloaded(ctx.config, ctx.device, unwrap(model), optimizer):
        for micro_batches in _micro_batches(ctx, generator):
            optimizer.zero_grad(set_to_none=True)
            for j, idx in enumerate(micro_batches):
                with _no_sync(model, last=j == steps - 1):
                    (loss_fn(ctx, batch, idx) / steps).backward()
            optimizer.step()


def update(models: Models, ctx: StepContext, batch: dict, generator: torch.Generator) -> None:
    """verl's order: the critic first (when there is one), then the actor; one PPO epoch."""
    if models.critic is not None:
        _train(
            models.critic,
            models.critic_optimizer,
            lambda cx, b, i: _critic_loss(models, cx, b, i),
            ctx,
            batch,
            generator,
        )
    _train(
        models.actor,
        models.actor_optimizer,
        lambda cx, b, i: _actor_loss(models, cx, b, i),
        ctx,
        batch,
        generator,
    )


def iteration(models: Models, ctx: StepContext, prompt_batches, generator: torch.Generator) -> dict[str, Any]:
    """One full PPO step; returns its wall time and per-phase seconds (ranks aligned by barriers)."""
    ctx.phases = defaultdict(float)
    barrier(ctx)
    start = time.perf_counter()
    with timed(ctx, "rollout"):
        batch = rollout(models, ctx, prompt_batches)
    with timed(ctx, "scoring"):
        score(models, ctx, batch)
    with timed(ctx, "advantages"):
        advantages(ctx, batch)
    with timed(ctx, "update"):
        update(models, ctx, batch, generator)
    barrier(ctx)
    return {"seconds": time.perf_counter() - start, "phases": dict(ctx.phases)}


def warmup_config(config: ProbeConfig, world_size: int) -> ProbeConfig:
    """The smallest iteration with every shape of the real one: one rollout call, one optimizer step.

    Same rollout batch, micro batches and lengths, so kernels, the allocator, DDP buckets and the optimizer
    state are all warmed up; only the number of repetitions (train_batch_size) shrinks to
    lcm(rollout_batch_size, micro_batch_size × gradient_accumulation_steps × gpus).
    """
    mini = config.micro_batch_size * config.gradient_accumulation_steps * world_size
    return dataclasses.replace(config, train_batch_size=math.lcm(config.rollout_batch_size, mini))


def barrier(ctx: StepContext) -> None:
    synchronize(ctx.device)
    if ctx.world_size > 1:
        dist.barrier()
