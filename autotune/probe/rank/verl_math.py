"""The pass math table filled with verl 0.9.1's own functions; imported only in verl's environment
(`autotune check --trace --verl-python PATH` runs the trace rank there, autotune's package on its path).

What verl's FSDP engine calls per micro batch (workers/engine/fsdp/transformer_impl.py,
`prepare_model_outputs`; workers/utils/losses.py, `ppo_loss` and `value_loss`), with verl's defaults:
- log-probs: `verl.utils.torch_functional.logprobs_from_logits` on the packed logits (flash-attn's Triton
  cross-entropy where flash-attn is installed, else its own fallback, `logprobs_from_logits_v2`);
- entropy (the old log-prob pass): `entropy_from_logits`;
- policy loss: `core_algos.get_policy_loss_fn("vanilla")` with verl's own `FSDPActorConfig` (clip 0.2, dual
  clip 3.0), aggregated by `agg_loss` ("token-mean");
- KL loss (GRPO's use_kl_loss): `kl_penalty(..., "low_var_kl")`, aggregated by `agg_loss`;
- value loss: `compute_value_loss` (cliprange_value 0.5, "token-mean").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from autotune.probe.rank.pass_math import CLIP_RATIO, VALUE_CLIP, PassMath
from autotune.probe.traced import TraceUnavailable
from autotune.probe.verl.install import VERL_VERSION  # the version these calls were read in

__all__ = ["verl_math"]

AGGREGATION = "token-mean"  # verl's default loss_agg_mode
KL_TYPE = "low_var_kl"  # verl's default kl_loss_type (k3)
METRICS_NOTE = "verl's policy-loss metrics (.item()) read 0.0 on fake tensors; the loss itself is traced"
TRITON_NOTE = (
    "flash-attn's cross-entropy (a Triton kernel) cannot run on fake tensors: log-probs traced by "
    "logprobs_from_logits_v2, verl's fallback without it"
)
ABSENT_NOTE = (
    "flash-attn is not installed here: verl's logprobs_from_logits falls back to logprobs_from_logits_v2 "
    "(row by row), as verl does on a machine without it; on a GPU with flash-attn its cross-entropy holds "
    "no vocabulary-sized temporary either, and writes the logits' gradient in place"
)


@contextlib.contextmanager
def _metrics_read_as_zero() -> Iterator[None]:
    """verl's policy loss reads its metrics with `.item()` (clip fractions, ppo_kl): a fake tensor has no
    value, so in the trace they read 0.0. Only metrics are read; the loss stays a tensor."""
    from torch._subclasses.fake_tensor import FakeTensor

    item = torch.Tensor.item

    def fake_item(tensor: torch.Tensor) -> Any:
        return 0.0 if isinstance(tensor, FakeTensor) else item(tensor)

    torch.Tensor.item = fake_item  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.Tensor.item = item  # type: ignore[method-assign]


def _log_probs(functional: Any) -> tuple[Callable[..., torch.Tensor], str, str]:
    """verl's log-prob function as it dispatches here: (function, its name, the note saying so)."""
    if functional.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE:  # verl's spelling
        return functional.logprobs_from_logits_v2, "logprobs_from_logits_v2", TRITON_NOTE
    return functional.logprobs_from_logits, "logprobs_from_logits (→ logprobs_from_logits_v2)", ABSENT_NOTE


def verl_math() -> PassMath:
    """The table with verl's functions; TraceUnavailable when verl is absent or not VERL_VERSION."""
    try:
        import verl
        import verl.utils.torch_functional as functional
        from verl.trainer.ppo import core_algos
        from verl.workers.config import FSDPActorConfig
    except Exception as error:  # any import failure: verl's environment is not what the trace needs
        raise TraceUnavailable(f"verl cannot be imported here: {type(error).__name__}: {error}") from error
    if verl.__version__ != VERL_VERSION:
        raise TraceUnavailable(f"verl {verl.__version__} found, the trace needs verl {VERL_VERSION}")
    # verl's own actor config at its defaults (the batch sizes are required, and unused by the loss)
    actor = FSDPActorConfig(
        strategy="fsdp", ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1, rollout_n=1
    )
    assert actor.clip_ratio == CLIP_RATIO and actor.loss_agg_mode == AGGREGATION  # what autotune prices
    policy = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
    log_probs, log_probs_name, note = _log_probs(functional)

    def policy_loss(log_prob: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor):
        with _metrics_read_as_zero():
            loss, _ = policy(old, log_prob, advantages, mask.bool(), AGGREGATION, actor)
        return loss

    def kl_loss(log_prob: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return core_algos.agg_loss(core_algos.kl_penalty(log_prob, ref, KL_TYPE), mask.bool(), AGGREGATION)

    def value_loss(values, old_values, returns, mask) -> torch.Tensor:
        found = core_algos.compute_value_loss(
            values, returns, old_values, mask.bool(), VALUE_CLIP, AGGREGATION
        )
        return found[0]

    return PassMath(
        log_probs=log_probs,
        entropy=functional.entropy_from_logits,
        policy_loss=policy_loss,
        kl_loss=kl_loss,
        value_loss=value_loss,
        functions={
            "log_probs": f"verl.utils.torch_functional.{log_probs_name}",
            "entropy": "verl.utils.torch_functional.entropy_from_logits",
            "policy_loss": f"verl.trainer.ppo.core_algos.compute_policy_loss_{actor.policy_loss.loss_mode} "
            f"+ agg_loss({AGGREGATION})",
            "kl_loss": f"verl.trainer.ppo.core_algos.kl_penalty({KL_TYPE}) + agg_loss({AGGREGATION})",
            "value_loss": f"verl.trainer.ppo.core_algos.compute_value_loss + agg_loss({AGGREGATION})",
        },
        notes=(f"per-token math: verl {VERL_VERSION}'s own functions", note, METRICS_NOTE),
    )
