"""The PPO/GRPO math a probe runs, as small pure torch functions.

Semantics follow verl's `verl/trainer/ppo/core_algos.py` and `verl/utils/torch_functional.py` so that a
probe does the same work (and the same numerics) as a real verl iteration. Token tensors are
`[batch, response_len]`; `mask` is 1 on response tokens that count and 0 on padding (or on tool/observation
tokens in multi-turn rollouts). Argument order is this module's own: current log-probs come before old ones.
"""

from collections.abc import Hashable, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "compute_gae",
    "entropy_from_logits",
    "grpo_advantages",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "token_rewards_from_scores",
    "value_loss",
]

_DIM = int | tuple[int, ...] | None


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: _DIM = None) -> torch.Tensor:
    """Sum of `values` where `mask` is set; NaN/inf outside the mask cannot leak in (0 * nan is nan)."""
    kept = torch.where(mask.bool(), values, torch.zeros_like(values))
    return (kept * mask).sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: _DIM = None) -> torch.Tensor:
    """Mean over masked elements; the +1e-8 (as verl) makes an all-zero mask give 0 instead of NaN."""
    return masked_sum(values, mask, dim) / (mask.sum(dim=dim) + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all masked elements (a scalar), Bessel-corrected by default as verl does.

    Raises ValueError when the correction would divide by zero (fewer than two masked elements).
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count < 2:
            raise ValueError(
                f"masked_var(unbiased=True) needs at least 2 masked elements but got {int(count.item())}."
            )
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) * rsqrt(var + 1e-8) with masked statistics; shift_mean=False adds the mean back.

    Every element is transformed (padding too); losses later ignore the padded ones through the mask.
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] for each position: `logits` [..., vocab] -> [...].

    Works one leading row at a time so the full-vocab log-softmax is never materialised for the whole batch
    (it is the largest activation of the scoring phase). In float32/64 it uses x_label - logsumexp(x); in
    half precision logsumexp loses too much, so, as verl, each row takes a log_softmax instead.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"labels must have the shape of logits without its last dim {tuple(logits.shape[:-1])} "
            f"but got {tuple(labels.shape)}."
        )
    if logits.dim() == 1:
        return logits.log_softmax(dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    if logits.dtype in (torch.float32, torch.float64):
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
        return picked - lse
    rows = [
        F.log_softmax(row, dim=-1).gather(-1, row_labels.unsqueeze(-1)).squeeze(-1)
        for row, row_labels in zip(logits, labels, strict=True)
    ]
    return torch.stack(rows)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """The entropy of softmax(logits) per position, as verl computes it in the old log-prob pass:
    logsumexp(x) - sum(softmax(x) * x), every vocabulary-sized temporary at once (verl's default; its
    `entropy_from_logits_with_chunking` is the chunked form)."""
    probabilities = F.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probabilities * logits, dim=-1)


@torch.no_grad()
def compute_gae(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the response tokens, run backwards in time.

    Masked tokens are skipped as verl (since 0.5, PR #2337) does: at a masked step neither the value nor
    the running GAE is updated, both carry through from the next valid token. So tail padding bootstraps
    with 0 after the last valid token (padding values/rewards are never used), and a masked observation
    token in the middle is jumped over, connecting the valid tokens on either side.

    Returns (advantages, returns): returns = raw advantages + values (the critic's target), and the
    advantages are then whitened with masked statistics over the whole batch.
    """
    m = mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    reversed_adv = []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        next_value = values[:, t] * m[:, t] + (1 - m[:, t]) * next_value
        last_gae = gae_t * m[:, t] + (1 - m[:, t]) * last_gae
        reversed_adv.append(last_gae)
    advantages = torch.stack(reversed_adv[::-1], dim=1)
    returns = advantages + values
    return masked_whiten(advantages, mask), returns


def _group_index(group_ids: torch.Tensor | Sequence[Hashable], n: int, device: torch.device) -> torch.Tensor:
    """Map arbitrary group labels (ints, strings, uuids) to 0..G-1."""
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D but got shape {tuple(group_ids.shape)}.")
        labels = group_ids.tolist()
    else:
        labels = list(group_ids)
    if len(labels) != n:
        raise ValueError(f"group_ids must have one label per score ({n}) but got {len(labels)}.")
    first_seen: dict[Hashable, int] = {}
    index = [first_seen.setdefault(label, len(first_seen)) for label in labels]
    return torch.tensor(index, dtype=torch.long, device=device)


@torch.no_grad()
def grpo_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable],
    mask: torch.Tensor,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """GRPO outcome advantages: each response's score relative to its prompt group, on every valid token.

    (score - group mean) / (group std + eps) with the *unbiased* std (torch.std, as verl). A group of one
    has no baseline, so verl uses mean 0 and std 1: its advantage is score / (1 + eps). A group of equal
    scores gets 0 (eps avoids 0/0). norm_by_std=False is Dr. GRPO: score - group mean.
    Returns [batch, response_len] = per-sequence advantage * mask.
    """
    if scores.dim() != 1 or scores.shape[0] != mask.shape[0]:
        raise ValueError(
            f"scores must be 1-D with one score per row of mask ({mask.shape[0]}) "
            f"but got shape {tuple(scores.shape)}."
        )
    idx = _group_index(group_ids, scores.shape[0], scores.device)
    groups = int(idx.max().item()) + 1 if idx.numel() else 0
    count = torch.zeros(groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, idx, torch.ones_like(scores)
    )
    total = torch.zeros_like(count).index_add_(0, idx, scores)
    mean = total / count
    # Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels badly.
    sq_dev = torch.zeros_like(count).index_add_(0, idx, (scores - mean[idx]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp_min(1))
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    advantage = scores - mean[idx]
    if norm_by_std:
        advantage = advantage / (std[idx] + eps)
    return advantage.unsqueeze(-1) * mask.to(scores.dtype)


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate from sampled-token log-probs (Schulman's k1/k3).

    "k1" (verl alias "kl"): logp - ref, unbiased but high variance and can be negative.
    "k3" (verl alias "low_var_kl"): exp(ref - logp) - (ref - logp) - 1, always >= 0 and low variance; the
    log-ratio is clamped to [-20, 20] before exp and the result to [-10, 10], as verl does, so one
    badly-mismatched token cannot blow up the loss.
    """
    if kind in ("k1", "kl"):
        return log_probs - ref_log_probs
    if kind in ("k3", "low_var_kl"):
        log_ratio = torch.clamp(ref_log_probs - log_probs, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, min=-10.0, max=10.0)
    raise ValueError(f"kl_penalty kind must be 'k1' or 'k3' (verl: 'kl', 'low_var_kl') but got {kind!r}.")


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio: float = 0.2,
    clip_ratio_c: float | None = 3.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate, "token-mean" aggregated: returns (loss, clipfrac).

    Per token: max(-A * r, -A * clip(r, 1 - eps, 1 + eps)) with r = exp(logp - old_logp), the pessimistic
    choice, so a step gains nothing by pushing r outside the trust region. The log-ratio is clamped to
    [-20, 20] before exp (as verl). Like verl's default "vanilla" loss, dual-clip (Ye et al. 2019) then caps
    the loss of negative-advantage tokens at -A * clip_ratio_c, so a huge ratio cannot dominate the batch;
    clip_ratio_c=None gives plain PPO. clipfrac is the masked fraction of tokens where the clipped term won.
    """
    log_ratio = torch.clamp(log_probs - old_log_probs, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    losses = torch.maximum(unclipped, clipped)
    clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), mask)
    if clip_ratio_c is not None:
        if clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1.0 (dual-clip lower bound) but got {clip_ratio_c}.")
        capped = torch.minimum(losses, -advantages * clip_ratio_c)
        losses = torch.where(advantages < 0, capped, losses)
    return masked_mean(losses, mask), clipfrac


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped critic loss 0.5 * token-mean(max((v - R)^2, (clip(v, old ± c) - R)^2)): (loss, clipfrac).

    The max is pessimistic like the policy clip: moving a value further than clip_range from the rollout-time
    value earns no reduction in loss. clipfrac is the masked fraction where the clipped error was larger.
    """
    clipped_values = torch.clamp(values, old_values - clip_range, old_values + clip_range)
    err_unclipped = (values - returns) ** 2
    err_clipped = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(err_unclipped, err_clipped), mask)
    clipfrac = masked_mean(torch.gt(err_clipped, err_unclipped).float(), mask)
    return loss, clipfrac


def token_rewards_from_scores(
    scores: torch.Tensor,
    mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Turn per-sequence scores [batch] into token-level rewards [batch, response_len] for PPO.

    An outcome reward belongs to the whole response, so (as verl's reward managers) it sits on the last valid
    response token and every other token gets 0. With verl's KL-in-reward (use_kl_in_reward), each valid
    token also pays kl_coef * kl (kl masked first, so padding pays nothing). A row with no valid token has
    nowhere to put its score, so that raises ValueError rather than dropping the score silently.
    """
    if scores.dim() != 1 or scores.shape[0] != mask.shape[0]:
        raise ValueError(
            f"scores must be 1-D with one score per row of mask ({mask.shape[0]}) "
            f"but got shape {tuple(scores.shape)}."
        )
    valid = mask.bool()
    empty = ~valid.any(dim=-1)
    if empty.any():
        rows = empty.nonzero().flatten().tolist()
        raise ValueError(f"every row needs at least one valid response token but rows {rows} have none.")
    length = mask.shape[-1]
    # argmax returns the first maximum: on the flipped mask that is the last valid token.
    last = length - 1 - torch.argmax(valid.flip(-1).to(torch.int8), dim=-1)
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    rewards[torch.arange(mask.shape[0], device=scores.device), last] = scores
    if kl is not None and kl_coef != 0.0:
        rewards = rewards - kl_coef * (kl * mask.to(kl.dtype))
    return rewards
