"""The probe's training passes as the memory trace runs them (autotune.probe.rank.trace), and what they read.

    for name, model, optimizer, run in training_passes(models, ctx):
        run()   # under the trace's tracker: one pass on its largest micro batch

Each pass is the probe's own code (`ppo`'s log-prob, value and reward passes, `ppo.train_epoch` with
`ppo.actor_loss` or `ppo.critic_loss`) on its largest micro batch (autotune.config.job_lengths.pass_tokens),
packed from the job's lengths as the analytic model prices it, each update one optimizer step. Every tensor
built here is zeros: under the trace's FakeTensorMode a value is never read, only its shape.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from autotune.config.job_lengths import JobLengths, PassTokens, micro_batch_tokens, pass_tokens
from autotune.config.knobs import ProbeConfig
from autotune.probe.rank import ppo
from autotune.probe.rank.packing import Rollout

__all__ = ["HOST", "Pass", "batch_of", "micro_batch", "one_step", "rollout_buffer", "training_passes"]

HOST = torch.device("cpu")  # the trace's tensors sit on the host (fake: no storage)
# (name, model, optimizer or None for a forward-only pass, run the pass)
Pass = tuple[str, torch.nn.Module, torch.optim.Optimizer | None, Callable[[], Any]]


def micro_batch(config: ProbeConfig, tokens: int, lengths: JobLengths) -> Rollout:
    """A packed micro batch of `tokens` tokens (autotune.probe.rank.packing.Rollout): as many samples as the
    job's mean sequence puts in it (the data's, or the limits' at the limits), none longer than the limits
    allow, their tokens split between prompt and response as the job's means split them. What a pass holds
    grows with its tokens, not with how they are split into sequences (flash-attn's varlen kernels, and the
    logits of every packed token); the samples' count sizes the per-sample tensors beside them."""
    prompt = float(lengths.prompt_lengths(config.max_prompt_length).mean())
    response = float(lengths.response_lengths(config.max_response_length).mean())
    samples = max(1, min(round(tokens / (prompt + response)), tokens // 2))
    samples = max(samples, -(-tokens // config.sequence_length))  # no sample over Lp + Lr
    sizes = [tokens // samples + (1 if i < tokens % samples else 0) for i in range(samples)]
    prompt_sizes = [_prompt_share(config, size, prompt / (prompt + response)) for size in sizes]
    return Rollout(
        [torch.zeros(p, dtype=torch.long) for p in prompt_sizes],
        [torch.zeros(max(1, s - p), dtype=torch.long) for s, p in zip(sizes, prompt_sizes, strict=True)],
        config.max_response_length,
    )


def _prompt_share(config: ProbeConfig, size: int, share: float) -> int:
    """A sample's prompt tokens: its share of `size`, within the prompt limit, leaving the response at most
    its limit and at least one token."""
    prompt = min(config.max_prompt_length, max(1, round(size * share)))
    return max(1, min(max(prompt, size - config.max_response_length), size - 1))


def batch_of(config: ProbeConfig, micro: Rollout) -> dict[str, Any]:
    """The rollout buffer's keys `ppo.score`, `advantages` and `update` read, for one micro batch (zeros: a
    fake tensor's values are never read)."""
    responses, mask = micro.padded_responses(HOST)
    keys = ["old_log_probs", "advantages"]
    keys += ["ref_log_probs"] if config.use_kl else []
    keys += ["values", "returns"] if config.algorithm == "ppo" else []
    samples = len(micro)
    return {
        "layout": ppo.PackedLayout(micro),
        "responses": responses,
        "response_mask": mask,
        "scores": torch.zeros(samples),
        **{key: torch.zeros(samples, config.max_response_length) for key in keys},
    }


def rollout_buffer(config: ProbeConfig, world_size: int) -> list[torch.Tensor]:
    """The rank's rollout on the device, as the probe keeps it through the iteration: a score per sample; per
    response token the padded ids, mask, old log-probs, entropy and advantages, the reference's log-probs
    with KL, values and returns for PPO. (Each sample's own tokens stay on the host until packed.)"""
    samples, length = config.train_batch_size // world_size, config.max_response_length
    floats = 4 + config.use_kl + 2 * (config.algorithm == "ppo")
    ids = torch.zeros(samples, length, dtype=torch.long)
    return [torch.zeros(samples), ids, *(torch.zeros(samples, length) for _ in range(floats))]


def one_step(config: ProbeConfig, samples: int, world_size: int) -> ProbeConfig:
    """One fixed micro batch of `samples` and one optimizer step: with accumulation, every micro-batch after
    the first starts with the gradients the first left, so one micro-batch run with them in place
    (`ppo.train_epoch`'s keep_gradients) holds what each later one does; without it, the step's zero_grad
    frees them first, as in the probe."""
    return dataclasses.replace(
        config,
        train_batch_size=samples * world_size,
        micro_batch_size=samples,
        gradient_accumulation_steps=1,
        log_prob_micro_batch_size=None,
        use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=None,
        log_prob_max_token_len_per_gpu=None,
        critic_max_token_len_per_gpu=None,
    )


@dataclasses.dataclass
class _Batches:
    """Makes each pass's micro batch from the job's lengths; `built`, when given, gets the tokens of each one
    made under its PassTokens name."""

    config: ProbeConfig
    lengths: JobLengths
    built: dict[str, int] | None

    def __call__(self, kind: str, tokens: int) -> dict[str, Any]:
        made = batch_of(self.config, micro_batch(self.config, tokens, self.lengths))
        if self.built is not None:
            self.built[kind] = sum(made["layout"].rollout.lengths)
        return made


def training_passes(
    models: ppo.Models, ctx: ppo.StepContext, built: dict[str, int] | None = None
) -> Iterator[Pass]:
    """Each training pass the probe makes, in its order, each on its largest micro batch of `ctx`'s config on
    one rank of its world, from its lengths (autotune.config.job_lengths.pass_tokens): verl's packed passes.
    Lazy: a pass's micro batch is made when the caller comes to it. `built`, when given, gets the tokens of
    each micro batch made (PassTokens' names), priced alike by the analytic model."""
    tokens = pass_tokens(ctx.config, ctx.lengths, ctx.world_size)
    batches = _Batches(ctx.config, ctx.lengths, built)
    yield from _scoring_passes(models, ctx, batches, tokens)
    if models.critic is not None:
        loss = functools.partial(ppo.critic_loss, models)
        optimizer = models.critic_optimizer
        update = _update(models.critic, optimizer, loss, ctx, batches, "critic_update", tokens.critic_update)
        yield "critic update", models.critic, optimizer, update
    loss = functools.partial(ppo.actor_loss, models)
    update = _update(models.actor, models.actor_optimizer, loss, ctx, batches, "update", tokens.update)
    yield "actor update", models.actor, models.actor_optimizer, update


def _scoring_passes(
    models: ppo.Models, ctx: ppo.StepContext, batches: _Batches, tokens: PassTokens
) -> Iterator[Pass]:
    """The forward-only passes of `ppo.score`: old log-probs (with the entropy), the reference's, the
    critic's values, the reward model's scores."""
    config, actor = ctx.config, ppo.unwrap(models.actor)
    forward = batches("forward", tokens.forward)
    everyone = list(range(len(forward["layout"].rollout)))

    def log_probs(model: torch.nn.Module, entropy: bool) -> Callable[[], Any]:
        return lambda: forward["layout"].log_probs(model, ctx, everyone, entropy)

    def without_adapters() -> Any:
        peft_model: Any = actor  # peft's wrapper (untyped): disable_adapter is peft's
        with peft_model.disable_adapter():
            return log_probs(actor, False)()

    yield "log-prob", actor, None, lambda: torch.no_grad()(log_probs(actor, True))()
    if config.use_kl and models.ref is None:
        yield "reference", actor, None, lambda: torch.no_grad()(without_adapters)()
    elif config.use_kl and models.ref is not None:
        ref = models.ref
        yield "reference", ref, None, lambda: torch.no_grad()(log_probs(ref, False))()
    if models.critic is not None:
        critic = ppo.unwrap(models.critic)
        critic_forward = batches("critic_forward", tokens.critic_forward)
        values = lambda: critic_forward["layout"].values(  # noqa: E731
            critic, ctx, list(range(len(critic_forward["layout"].rollout)))
        )
        yield "values", critic, None, lambda: torch.no_grad()(values)()
    if models.reward is not None:
        yield "reward", models.reward, None, _reward(models, ctx, tokens.forward)


def _reward(models: ppo.Models, ctx: ppo.StepContext, tokens: int) -> Callable[[], Any]:
    """The reward model's pass over a forward micro batch's samples, scored as one rollout share."""
    config, world_size = ctx.config, ctx.world_size
    share = batch_of(config, micro_batch(config, tokens, ctx.lengths))
    rows = len(share["layout"].rollout)
    sized = dataclasses.replace(
        config, rollout_batch_size=rows * world_size, train_batch_size=rows * world_size
    )
    scored = dataclasses.replace(ctx, config=sized)
    return lambda: ppo.reward_scores(models, scored, share)


def _update(
    model: torch.nn.Module,
    optimizer: Any,
    loss: Callable[[ppo.StepContext, dict, list[int]], torch.Tensor],
    ctx: ppo.StepContext,
    batches: _Batches,
    kind: str,
    micro_tokens: int,
) -> Callable[[], None]:
    """An update pass: `ppo.train_epoch` over one micro batch of `micro_tokens`, one optimizer step; a later
    micro batch of an accumulation step keeps the gradients the earlier ones left (`one_step`)."""
    config = ctx.config
    micro = batches(kind, micro_tokens)
    step = dataclasses.replace(ctx, config=one_step(config, len(micro["layout"].rollout), ctx.world_size))
    generator = torch.Generator().manual_seed(0)
    mini = config.micro_batch_size * config.gradient_accumulation_steps
    accumulating = micro_tokens < micro_batch_tokens(config, ctx.lengths, mini)  # more micro batches follow

    def run() -> None:
        with torch.enable_grad():
            ppo.train_epoch(model, optimizer, loss, step, micro, generator, keep_gradients=accumulating)

    return run
