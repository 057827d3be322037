"""One PPO/GRPO iteration as the target trainer runs it: rollout, scoring, advantages, update (docs/design.md,
"The probe").

Two trainers' passes (`StepContext.passes`, one of `PASSES`), told apart by asking the schedule (`packed`):
- `Passes.VERL`, packed: the training passes as verl runs them on the user's data. The rollout is synthetic:
  prompts from the data, responses of the data's lengths (`autotune.config.job_lengths`), since verl generates
  in vLLM at its own pace and that time carries over to nothing here. Micro batches are packed without padding
  (`autotune.probe.rank.packing`), the logits come out for every packed token, the old log-prob pass computes
  the entropy (verl's `calculate_entropy`), and micro batches are fixed or cut by token budgets
  (`use_dynamic_bsz`). The iteration's seconds are the training phases': scoring, advantages, update.
- `Passes.TRL`, padded: TRL's GRPOTrainer's way: Hugging Face `generate` forced to max_response_length, padded
  rows, the logits of the response positions only (`logits_to_keep`). Generation is a phase of that trainer:
  timed in.

Runs inside a probe rank (the runner program imports it). Each rank works on its share of the global batch;
gradients of the trainable models are averaged by DDP or FSDP (autotune.probe.rank.sharding), so W ranks do
the same work as verl's data-parallel actor and critic workers. With offload, each model's states come to the
device for the phases that use them, as verl's workers load and offload around each call.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist

from autotune.config.job_lengths import JobLengths, pass_tokens
from autotune.config.knobs import ProbeConfig
from autotune.config.passes import Passes
from autotune.probe.rank import rl_math
from autotune.probe.rank.packing import (
    PassPacking,
    Rollout,
    balanced_micro_batches,
    pack,
    plan_responses,
    prefix_under_budget,
)
from autotune.probe.rank.pass_math import AUTOTUNE, PassMath
from autotune.probe.rank.sharding import gathered, offloaded

__all__ = [
    "PASSES",
    "Models",
    "StepContext",
    "actor_loss",
    "advantages",
    "barrier",
    "critic_loss",
    "iteration",
    "response_log_probs",
    "response_values",
    "reward_scores",
    "rollout",
    "score",
    "synchronize",
    "timed",
    "train_epoch",
    "unwrap",
    "update",
    "warmup_config",
]

GAMMA, LAM = 1.0, 1.0  # verl's defaults
PASSES = (Passes.VERL, Passes.TRL)  # the schedules the built-in probe runs (module docstring)


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
    passes: Passes = Passes.VERL  # one of PASSES
    lengths: JobLengths = field(default_factory=JobLengths)  # the job's lengths (verl passes)
    vocab: int = 32000  # the actor's vocabulary: the synthetic responses' tokens
    # what each pass packed, over the measured iterations (verl passes)
    packing: dict[str, PassPacking] = field(default_factory=lambda: defaultdict(PassPacking))
    generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    math: PassMath = AUTOTUNE  # whose per-token functions the verl passes run (autotune.probe.rank.pass_math)

    def __post_init__(self) -> None:
        self.passes = Passes(self.passes)  # a job's string ("verl", "trl") becomes the schedule it names

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


# --- how a pass sees the samples: packed (verl) or padded (TRL) -------------------------------------------


class Layout(Protocol):
    """The samples as a trainer's passes see them, and the micro batches it cuts them into."""

    def log_probs(
        self, model: torch.nn.Module, ctx: StepContext, indices: list[int], entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def values(self, critic: torch.nn.Module, ctx: StepContext, indices: list[int]) -> torch.Tensor: ...

    def micro_batches(self, ctx: StepContext, pool: list[int], first: bool, kind: str) -> list[list[int]]: ...

    def reward_inputs(self, indices: slice) -> tuple[torch.Tensor, torch.Tensor]: ...

    def response_tokens(self, indices: list[int]) -> int: ...


@dataclass
class PaddedLayout:
    """Hugging Face generate's output: rows of max_prompt_length + max_response_length, left padded."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    responses: torch.Tensor

    def log_probs(self, model, ctx, indices, entropy=False):
        return response_log_probs(
            model, ctx, self.input_ids[indices], self.attention_mask[indices], self.responses[indices]
        ), None

    def values(self, critic, ctx, indices):
        ids, mask = self.input_ids[indices], self.attention_mask[indices]
        return response_values(critic, ctx, ids, mask, self.responses.shape[1])

    def micro_batches(self, ctx, pool, first, kind):
        size = ctx.config.micro_batch_size if kind.endswith("update") else ctx.config.forward_micro_batch_size
        return [pool[start : start + size] for start in range(0, len(pool), size)]

    def reward_inputs(self, indices):
        return self.input_ids[indices], self.attention_mask[indices]

    def response_tokens(self, indices):
        return len(indices) * self.responses.shape[1]  # generation is forced to max_response_length


@dataclass
class PackedLayout:
    """verl's remove-padding passes over a rollout of the job's lengths (autotune.probe.rank.packing)."""

    rollout: Rollout

    def log_probs(self, model, ctx, indices, entropy=False):
        packed = pack(self.rollout, indices, ctx.device)
        with ctx.autocast():
            out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
        logits = out.logits.squeeze(0)  # (tokens, vocab): every packed token's, as verl's logits_rmpad
        # the rollout's temperature is verl's default 1.0, where verl scales nothing (no copy of the logits)
        token_entropy = ctx.math.entropy(logits) if entropy else None
        token_log_probs = ctx.math.log_probs(logits, packed.labels)
        found = packed.responses_of(token_log_probs.float())
        return found, None if token_entropy is None else packed.responses_of(token_entropy.float())

    def values(self, critic, ctx, indices):
        packed = pack(self.rollout, indices, ctx.device)
        with ctx.autocast():
            out = critic(input_ids=packed.input_ids, position_ids=packed.position_ids)
        return packed.responses_of(out.logits.squeeze(0).squeeze(-1).float())

    def micro_batches(self, ctx, pool, first, kind):
        """Fixed sizes, or verl's token-budget rule; the first micro batch of a pass's first pool is the
        prefix `synthetic_rollout` planned to the priced worst case."""
        c = ctx.config
        update, critic = kind.endswith("update"), kind.startswith("critic")
        if not c.use_dynamic_bsz:
            size = c.micro_batch_size if update else c.forward_micro_batch_size
            return [pool[start : start + size] for start in range(0, len(pool), size)]
        budget = _budget(c, update, critic)
        lengths = [self.rollout.lengths[i] for i in pool]
        head = prefix_under_budget(lengths, budget) if first else 0
        rest = balanced_micro_batches(lengths[head:], budget)
        chunks = [list(range(head))] if head else []
        chunks += [[head + i for i in chunk] for chunk in rest]
        return [[pool[i] for i in chunk] for chunk in chunks]

    def reward_inputs(self, indices):
        """Right-padded prompt + response rows: a reward model scores whole sequences (not packed)."""
        rows = [
            torch.cat([p, r])
            for p, r in zip(self.rollout.prompts[indices], self.rollout.responses[indices], strict=True)
        ]
        width = max(len(row) for row in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)], mask[i, : len(row)] = row, 1
        return ids, mask

    def response_tokens(self, indices):
        return sum(len(self.rollout.responses[i]) for i in indices)


def _budget(config: ProbeConfig, update: bool, critic: bool) -> int:
    update_budget, forward_budget, critic_budget = config.token_budgets
    if critic:
        return critic_budget  # V1 sizes both of the critic's passes by its one budget
    return update_budget if update else forward_budget


# --- rollout -------------------------------------------------------------------------------------------


def rollout(models: Models, ctx: StepContext, prompt_batches: Iterator[dict[str, torch.Tensor]]) -> dict:
    """The rank's T/W samples: synthetic ones of the job's lengths (verl passes) or generated (TRL passes)."""
    if ctx.passes.packed:  # verl's schedule: its rollout is vLLM's, timed apart (module docstring)
        return synthetic_rollout(ctx, prompt_batches)
    return generated_rollout(models, ctx, prompt_batches)


def synthetic_rollout(ctx: StepContext, prompt_batches: Iterator[dict[str, torch.Tensor]]) -> dict:
    """The data's prompts, each answered rollout_n times by random tokens of the job's response lengths, the
    first samples planned so that each pass's first micro batch holds the priced worst case."""
    c = ctx.config
    prompts: list[torch.Tensor] = []
    for _ in range(c.train_batch_size // c.rollout_batch_size):
        batch = next(prompt_batches)
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
            prompts += [ids[mask.bool()]] * c.rollout_n  # the answers of one prompt are adjacent
    drawn = ctx.lengths.response_lengths(c.max_response_length)
    picks = torch.randint(0, len(drawn), (len(prompts),), generator=ctx.generator).tolist()
    planned = plan_responses(
        [len(p) for p in prompts], [int(drawn[i]) for i in picks], c.max_response_length, *_targets(ctx)
    )
    responses = [torch.randint(0, ctx.vocab, (n,), generator=ctx.generator) for n in planned]
    samples = Rollout(prompts, responses, c.max_response_length)
    ids, mask = samples.padded_responses(ctx.device)
    return {"layout": PackedLayout(samples), "responses": ids, "response_mask": mask}


def _targets(ctx: StepContext) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(fixed, budgets) for `plan_responses`: each pass's first micro batch at its priced tokens."""
    c = ctx.config
    tokens = pass_tokens(c, ctx.lengths, ctx.world_size)
    if not c.use_dynamic_bsz:
        return [(c.micro_batch_size, tokens.update), (c.forward_micro_batch_size, tokens.forward)], []
    mini, share = c.micro_batch_size * c.gradient_accumulation_steps, ctx.samples_per_rank
    budgets = [(mini, tokens.update), (share, tokens.forward)]
    if tokens.critic_update:
        budgets += [(mini, tokens.critic_update), (share, tokens.critic_forward)]
    return [], budgets


def generated_rollout(
    models: Models, ctx: StepContext, prompt_batches: Iterator[dict[str, torch.Tensor]]
) -> dict:
    """T/R generation calls of R samples (each rank R/W), forced to exactly max_response_length tokens."""
    c = ctx.config
    sequences: list[torch.Tensor] = []
    masks: list[torch.Tensor] = []
    actor = unwrap(models.actor)
    with offloaded(c, ctx.device, actor), gathered(actor, c), inference(actor):
        for _ in range(c.train_batch_size // c.rollout_batch_size):
            _generate_one(actor, ctx, next(prompt_batches), sequences, masks)
    input_ids = torch.cat(sequences)
    responses = input_ids[:, c.max_prompt_length :]
    layout = PaddedLayout(input_ids, torch.cat(masks), responses)
    return {"layout": layout, "responses": responses, "response_mask": torch.ones_like(responses).float()}


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


def response_log_probs(model: torch.nn.Module, ctx: StepContext, ids, mask, responses) -> torch.Tensor:
    """Padded rows: log-probs of the response tokens; only the response positions' logits are materialised."""
    length = responses.shape[1]
    with ctx.autocast():
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=length + 1, use_cache=False).logits
    return rl_math.logprobs_from_logits(logits[:, :-1].float(), responses)


def response_values(critic: torch.nn.Module, ctx: StepContext, ids, mask, length: int) -> torch.Tensor:
    with ctx.autocast():
        values = critic(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
    return values[:, -length - 1 : -1].float()


def _forward_pass(
    ctx: StepContext, batch: dict, kind: str, run: Callable[[list[int]], Any], label: str | None = None
) -> list[Any]:
    """A forward-only pass over the rank's share in the `kind` pass's micro batches (no gradients); what it
    packed is counted under `label` (the pass's name)."""
    layout: Layout = batch["layout"]
    pool = list(range(ctx.samples_per_rank))
    outputs = []
    with torch.no_grad():
        for indices in layout.micro_batches(ctx, pool, True, kind):
            _count(ctx, batch, label or kind, indices)
            outputs.append(run(indices))
    return outputs


def _count(ctx: StepContext, batch: dict, kind: str, indices: list[int]) -> None:
    layout = batch["layout"]
    if isinstance(layout, PackedLayout):
        ctx.packing[kind].add(sum(layout.rollout.lengths[i] for i in indices))


def _log_prob_pass(model: torch.nn.Module, ctx: StepContext, batch: dict, entropy: bool, label: str) -> dict:
    """The old log-prob or the reference pass: both cut by the forward micro batch (or its one budget)."""
    layout: Layout = batch["layout"]
    found = _forward_pass(ctx, batch, "forward", lambda i: layout.log_probs(model, ctx, i, entropy), label)
    out = {"log_probs": torch.cat([f[0] for f in found])}
    if entropy and found[0][1] is not None:
        out["entropy"] = torch.cat([f[1] for f in found])
    return out


def reward_scores(models: Models, ctx: StepContext, batch: dict) -> torch.Tensor:
    """Sequence scores: the reward model in batches of the rollout share, or a rule-based function."""
    responses, mask = batch["responses"], batch["response_mask"]
    if models.reward is None:
        # Rule-based reward (no model): the share of response tokens divisible by 7, a stand-in for a
        # verifier that inspects the tokens. Cheap, as real rule-based rewards are.
        return ((responses % 7 == 0).float() * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1)
    layout: Layout = batch["layout"]
    share = ctx.config.rollout_batch_size // ctx.world_size
    scores = []
    with torch.no_grad(), ctx.autocast():
        for start in range(0, ctx.samples_per_rank, share):
            ids, attention = layout.reward_inputs(slice(start, start + share))
            # The reward model has its own vocabulary: verl re-tokenises the text; ids are mapped here.
            ids = ids.to(ctx.device) % models.reward_vocab
            scores.append(models.reward(input_ids=ids, attention_mask=attention.to(ctx.device)).logits[:, 0])
    return torch.cat(scores).float()


def score(models: Models, ctx: StepContext, batch: dict) -> None:
    c = ctx.config
    actor = unwrap(models.actor)
    layout: Layout = batch["layout"]
    batch["scores"] = reward_scores(models, ctx, batch)
    with offloaded(c, ctx.device, actor):
        # verl's old log-prob pass computes the entropy (calculate_entropy), its reference pass does not
        old = _log_prob_pass(actor, ctx, batch, ctx.passes.packed, "forward")
        batch["old_log_probs"] = old["log_probs"]
        if "entropy" in old:
            batch["entropy"] = old["entropy"]
        if c.use_kl and models.ref is None:
            peft_model: Any = actor  # peft's wrapper (untyped): disable_adapter is peft's
            with peft_model.disable_adapter():  # LoRA: the frozen base model is the reference, no second copy
                batch["ref_log_probs"] = _log_prob_pass(actor, ctx, batch, False, "reference")["log_probs"]
    if c.use_kl and models.ref is not None:  # full fine-tuning with KL: a reference model of its own
        batch["ref_log_probs"] = _log_prob_pass(models.ref, ctx, batch, False, "reference")["log_probs"]
    if models.critic is not None:
        critic = unwrap(models.critic)
        with offloaded(c, ctx.device, critic):
            found = _forward_pass(ctx, batch, "critic forward", lambda i: layout.values(critic, ctx, i))
            batch["values"] = torch.cat(found)


# --- advantages ----------------------------------------------------------------------------------------


def advantages(ctx: StepContext, batch: dict) -> None:
    c = ctx.config
    mask = batch["response_mask"]
    if c.algorithm == "grpo":
        # Group ids: each prompt's rollout_n samples are adjacent (repeat_interleave in rollout).
        groups = torch.arange(batch["scores"].shape[0], device=mask.device) // c.rollout_n
        batch["advantages"] = rl_math.grpo_advantages(batch["scores"], groups, mask)
        return
    kl = rl_math.kl_penalty(batch["old_log_probs"], batch["ref_log_probs"], "k1") if c.use_kl else None
    rewards = rl_math.token_rewards_from_scores(batch["scores"], mask, kl=kl, kl_coef=c.kl_coef)
    batch["advantages"], batch["returns"] = rl_math.compute_gae(rewards, batch["values"], mask, GAMMA, LAM)


# --- update --------------------------------------------------------------------------------------------


def _mini_batches(ctx: StepContext, generator: torch.Generator) -> Iterator[list[int]]:
    """Mini-batches of micro_batch_size × gradient_accumulation_steps samples per rank: consecutive, as verl
    (actor.shuffle: false); shuffled for TRL's passes."""
    c = ctx.config
    if ctx.passes.packed:
        order = list(range(ctx.samples_per_rank))
    else:
        order = torch.randperm(ctx.samples_per_rank, generator=generator).tolist()
    mini = c.micro_batch_size * c.gradient_accumulation_steps
    for start in range(0, ctx.samples_per_rank, mini):
        yield order[start : start + mini]


def _no_sync(model: torch.nn.Module, last: bool):
    """Skip DDP's all-reduce on all but the last micro-batch of an accumulation step. FSDP reduce-scatters
    every micro-batch, as verl's default (use_no_sync_for_gradient_accumulation: false) does."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not last:
        return model.no_sync()
    return nullcontext()


def actor_loss(models: Models, ctx: StepContext, batch: dict, idx: list[int]) -> torch.Tensor:
    """The actor's loss on the micro batch `idx`: the clipped policy loss, plus GRPO's KL term with use_kl
    (public: the memory trace runs the actor's update pass through it)."""
    c = ctx.config
    log_probs, _ = batch["layout"].log_probs(models.actor, ctx, idx)
    mask = batch["response_mask"][idx]
    loss = ctx.math.policy_loss(log_probs, batch["old_log_probs"][idx], batch["advantages"][idx], mask)
    if c.algorithm == "grpo" and c.use_kl:  # GRPO keeps the KL out of the reward, in the loss (k3, as verl)
        loss = loss + c.kl_coef * ctx.math.kl_loss(log_probs, batch["ref_log_probs"][idx], mask)
    return loss


def critic_loss(models: Models, ctx: StepContext, batch: dict, idx: list[int]) -> torch.Tensor:
    """The critic's clipped value loss on the micro batch `idx` (public: the memory trace runs the critic's
    update pass through it)."""
    assert models.critic is not None  # update trains the critic only when there is one
    values = batch["layout"].values(models.critic, ctx, idx)
    old, returns, mask = batch["values"][idx], batch["returns"][idx], batch["response_mask"][idx]
    return ctx.math.value_loss(values, old, returns, mask)


def train_epoch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[StepContext, dict, list[int]], torch.Tensor],
    ctx: StepContext,
    batch: dict,
    generator: torch.Generator,
    kind: str = "update",
    keep_gradients: bool = False,
) -> None:
    """One epoch over the mini-batches, one optimizer step each; a micro batch's loss weighs its share of the
    mini batch's response tokens (token-mean over the mini batch, as verl aggregates). `loss_fn(ctx, batch,
    idx)`: `actor_loss` or `critic_loss` with the models bound. `keep_gradients` skips each step's
    zero_grad: the memory trace runs one micro batch as a later one of an accumulation step, which starts
    with the gradients the earlier ones left."""
    layout: Layout = batch["layout"]
    with offloaded(ctx.config, ctx.device, unwrap(model), optimizer):
        for number, mini in enumerate(_mini_batches(ctx, generator)):
            micro_batches = layout.micro_batches(ctx, mini, number == 0, kind)
            tokens = max(1, layout.response_tokens(mini))
            if not keep_gradients:
                optimizer.zero_grad(set_to_none=True)
            for j, idx in enumerate(micro_batches):
                _count(ctx, batch, kind, idx)
                with _no_sync(model, last=j == len(micro_batches) - 1):
                    (loss_fn(ctx, batch, idx) * (layout.response_tokens(idx) / tokens)).backward()
            optimizer.step()


def update(models: Models, ctx: StepContext, batch: dict, generator: torch.Generator) -> None:
    """verl's order: the critic first (when there is one), then the actor; one PPO epoch."""
    if models.critic is not None:
        assert models.critic_optimizer is not None  # a critic is built with its optimizer
        critic = functools.partial(critic_loss, models)
        train_epoch(models.critic, models.critic_optimizer, critic, ctx, batch, generator, "critic update")
    train_epoch(
        models.actor, models.actor_optimizer, functools.partial(actor_loss, models), ctx, batch, generator
    )


def iteration(models: Models, ctx: StepContext, prompt_batches, generator: torch.Generator) -> dict[str, Any]:
    """One full PPO step; returns its wall time and per-phase seconds (ranks aligned by barriers). With verl's
    passes the wall time is the training phases' (the synthetic rollout is timed apart, as "rollout")."""
    ctx.phases = defaultdict(float)
    barrier(ctx)
    start = time.perf_counter()
    with timed(ctx, "rollout"):
        batch = rollout(models, ctx, prompt_batches)
    if ctx.passes.packed:
        barrier(ctx)
        start = time.perf_counter()
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
    lcm(rollout_batch_size, micro_batch_size × gradient_accumulation_steps × gpus, log-prob micro × gpus).
    """
    mini = config.micro_batch_size * config.gradient_accumulation_steps * world_size
    forward = config.forward_micro_batch_size * world_size
    return dataclasses.replace(config, train_batch_size=math.lcm(config.rollout_batch_size, mini, forward))


def barrier(ctx: StepContext) -> None:
    synchronize(ctx.device)
    if ctx.world_size > 1:
        dist.barrier()
