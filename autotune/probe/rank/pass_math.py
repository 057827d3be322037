"""The per-token math of the scoring and update passes, as a table of functions a pass calls through.

    math = StepContext(...).math          # AUTOTUNE by default: autotune.probe.rank.rl_math's functions
    math.log_probs(logits, labels), math.entropy(logits), math.policy_loss(lp, old, adv, mask), ...

The probe fills it with its own functions (`AUTOTUNE`); `check --trace --verl-python` fills it, in verl's
environment, with verl 0.9.1's (`autotune.probe.rank.verl_math`), so that the trace measures what verl's own
code allocates around the logits and the losses. Every entry takes and returns whole tensors: a pass calls
each once per micro batch, whoever fills the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from autotune.probe.rank import rl_math

__all__ = ["AUTOTUNE", "PassMath"]

Tensor = torch.Tensor
CLIP_RATIO, VALUE_CLIP = 0.2, 0.5  # verl's defaults (actor.clip_ratio, critic.cliprange_value)


@dataclass(frozen=True)
class PassMath:
    """Whose functions a pass runs. Shapes: logits (tokens, vocab) of the packed row, labels (tokens,);
    the losses' inputs (samples, max_response_length) with the response mask; each loss a scalar, token-mean
    over its micro batch (the caller weighs it by its share of the mini batch)."""

    log_probs: Callable[[Tensor, Tensor], Tensor]  # (logits, labels) -> (tokens,)
    entropy: Callable[[Tensor], Tensor]  # logits -> (tokens,)
    policy_loss: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]  # (log_probs, old, advantages, mask)
    kl_loss: Callable[[Tensor, Tensor, Tensor], Tensor]  # (log_probs, ref_log_probs, mask): k3, token-mean
    value_loss: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]  # (values, old_values, returns, mask)
    functions: dict[str, str] = field(default_factory=dict)  # entry -> the function it runs, for the trace
    notes: tuple[str, ...] = ()  # what differs from a GPU run of those functions, and why


def _policy_loss(log_probs: Tensor, old: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    return rl_math.policy_loss(log_probs, old, advantages, mask, CLIP_RATIO)[0]


def _kl_loss(log_probs: Tensor, ref_log_probs: Tensor, mask: Tensor) -> Tensor:
    return rl_math.masked_mean(rl_math.kl_penalty(log_probs, ref_log_probs, "k3"), mask)


def _value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    return rl_math.value_loss(values, old_values, returns, mask, VALUE_CLIP)[0]


AUTOTUNE = PassMath(
    log_probs=rl_math.logprobs_from_logits,
    entropy=rl_math.entropy_from_logits,
    policy_loss=_policy_loss,
    kl_loss=_kl_loss,
    value_loss=_value_loss,
    functions={
        name: f"autotune.probe.rank.rl_math.{function}"
        for name, function in (
            ("log_probs", "logprobs_from_logits"),
            ("entropy", "entropy_from_logits"),
            ("policy_loss", "policy_loss"),
            ("kl_loss", "kl_penalty(k3) + masked_mean"),
            ("value_loss", "value_loss"),
        )
    },
)
