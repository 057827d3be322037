"""rl_math against values worked out by hand (the arithmetic is in the comments)."""

import math

import pytest
import torch

from autotune.probe.rank.rl_math import (
    compute_gae,
    grpo_advantages,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_loss,
    token_rewards_from_scores,
    value_loss,
)


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# --- masked statistics ---------------------------------------------------------------------------------


def test_masked_mean_and_var_ignore_masked_tail():
    values = t([1.0, 2.0, 3.0, 100.0])
    mask = t([1.0, 1.0, 1.0, 0.0])
    close(masked_mean(values, mask), 2.0)  # (1 + 2 + 3) / 3
    close(masked_var(values, mask), 1.0)  # (1 + 0 + 1) / (3 - 1)
    close(masked_var(values, mask, unbiased=False), 2.0 / 3.0)  # (1 + 0 + 1) / 3


def test_masked_mean_per_row_and_nan_outside_mask():
    values = t([1.0, 3.0, float("nan")], [4.0, 0.0, 0.0])
    mask = t([1.0, 1.0, 0.0], [1.0, 0.0, 0.0])
    close(masked_mean(values, mask, dim=-1), [2.0, 4.0])  # row 0: (1 + 3) / 2; row 1: 4 / 1


def test_masked_mean_empty_mask_is_zero():
    close(masked_mean(t([5.0, 6.0]), t([0.0, 0.0])), 0.0)  # 0 / (0 + 1e-8)


def test_masked_var_unbiased_needs_two_elements():
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(t([1.0, 2.0]), t([1.0, 0.0]))


def test_masked_whiten():
    values = t([2.0, 4.0, 6.0, 50.0])
    mask = t([1.0, 1.0, 1.0, 0.0])
    # mean 4, unbiased var (4 + 0 + 4) / 2 = 4, std 2
    white = masked_whiten(values, mask)
    close(white[:, :3], [[-1.0, 0.0, 1.0]])
    close(white[0, 3], (50.0 - 4.0) / 2.0)  # padding is transformed too (losses mask it later)
    close(masked_whiten(values, mask, shift_mean=False)[:, :3], [[3.0, 4.0, 5.0]])  # -1+4, 0+4, 1+4


# --- log-probs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_logprobs_from_logits(dtype, atol):
    # token 0: logits [0, 0, ln 2] -> probs [1/4, 1/4, 1/2]; label 2 -> ln(1/2)
    # token 1: logits [1, 1, 1]    -> probs [1/3, 1/3, 1/3]; label 0 -> ln(1/3)
    # row 2:   logits [ln 3, 0, 0] -> probs [3/5, 1/5, 1/5]; label 0 -> ln(3/5), label 1 -> ln(1/5)
    logits = torch.tensor(
        [[[0.0, 0.0, math.log(2)], [1.0, 1.0, 1.0]], [[math.log(3), 0.0, 0.0], [math.log(3), 0.0, 0.0]]],
        dtype=dtype,
    )
    labels = torch.tensor([[2, 0], [0, 1]])
    out = logprobs_from_logits(logits, labels)
    assert out.shape == (2, 2)
    expected = [[math.log(0.5), math.log(1 / 3)], [math.log(0.6), math.log(0.2)]]
    close(out.float(), expected, atol=atol)


def test_logprobs_from_logits_shape_mismatch():
    with pytest.raises(ValueError, match="labels"):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


# --- GAE -----------------------------------------------------------------------------------------------

REWARDS = [0.0, 0.0, 1.0]
VALUES = [0.5, 0.6, 0.7]


def test_gae_gamma1_lam1():
    # gamma = lam = 1: delta_t = r_t + V_{t+1} - V_t, A_t = delta_t + A_{t+1}, V_3 = 0
    # t=2: delta = 1 + 0 - 0.7 = 0.3            A2 = 0.3
    # t=1: delta = 0 + 0.7 - 0.6 = 0.1          A1 = 0.1 + 0.3 = 0.4
    # t=0: delta = 0 + 0.6 - 0.5 = 0.1          A0 = 0.1 + 0.4 = 0.5
    # returns = A + V = [1.0, 1.0, 1.0] (= the undiscounted reward-to-go)
    # whitened: mean 0.4, unbiased var (0.01 + 0 + 0.01) / 2 = 0.01, std 0.1 -> [1, 0, -1]
    adv, ret = compute_gae(t(REWARDS), t(VALUES), t([1.0, 1.0, 1.0]), gamma=1.0, lam=1.0)
    close(ret, [[1.0, 1.0, 1.0]])
    close(adv, [[1.0, 0.0, -1.0]], atol=1e-5)


def test_gae_gamma09_lam095():
    # gamma * lam = 0.9 * 0.95 = 0.855
    # t=2: delta = 1 + 0.9*0 - 0.7 = 0.3                 A2 = 0.3
    # t=1: delta = 0 + 0.9*0.7 - 0.6 = 0.03              A1 = 0.03 + 0.855*0.3 = 0.2865
    # t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04              A0 = 0.04 + 0.855*0.2865 = 0.2849575
    # returns = A + V = [0.7849575, 0.8865, 1.0]
    adv, ret = compute_gae(t(REWARDS), t(VALUES), t([1.0, 1.0, 1.0]), gamma=0.9, lam=0.95)
    close(ret, [[0.7849575, 0.8865, 1.0]])
    raw = torch.tensor([0.2849575, 0.2865, 0.3], dtype=torch.float64)
    # mean 0.29048583.., unbiased std 0.00845..: whitened = (raw - mean) / std
    close(adv[0], (raw - raw.mean()) / raw.std(), atol=1e-4)
    assert adv[0, 2] > adv[0, 1] > adv[0, 0]


def test_gae_ignores_rewards_and_values_on_padded_tail():
    # mask [1, 1, 1, 0]: the padded token's reward 5 and value 9 must not leak in.
    # t=3 (masked): next value and running GAE stay at 0 -> A3 = 0
    # then as in test_gae_gamma1_lam1: A = [0.5, 0.4, 0.3], returns on valid tokens = [1, 1, 1]
    # (older verl used V_{t+1} = 9 at t=2: A2 would be 1 + 9 - 0.7 = 9.3)
    rewards = t([0.0, 0.0, 1.0, 5.0])
    values = t([0.5, 0.6, 0.7, 9.0])
    mask = t([1.0, 1.0, 1.0, 0.0])
    adv, ret = compute_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    close(ret[:, :3], [[1.0, 1.0, 1.0]])
    close(adv[:, :3], [[1.0, 0.0, -1.0]], atol=1e-5)  # whitened over the 3 valid tokens only
    close(ret[0, 3], 9.0)  # raw advantage 0 + value 9 on the padded token (as verl)


def test_gae_skips_masked_observation_token_in_the_middle():
    # mask [1, 0, 1], gamma 0.9, lam 1, the masked token's value 9 is jumped over:
    # t=2: delta = 1 - 0.7 = 0.3, A2 = 0.3                   (next value <- 0.7, running A <- 0.3)
    # t=1: masked -> carries A = 0.3, next value stays 0.7
    # t=0: delta = 0 + 0.9*0.7 - 0.5 = 0.13, A0 = 0.13 + 0.9*1*0.3 = 0.40
    # returns on valid tokens: 0.40 + 0.5 = 0.9, 0.3 + 0.7 = 1.0
    adv, ret = compute_gae(t([0.0, 0.0, 1.0]), t([0.5, 9.0, 0.7]), t([1.0, 0.0, 1.0]), gamma=0.9, lam=1.0)
    close(ret[0, [0, 2]], [0.9, 1.0])
    # whitening over the two valid tokens [0.4, 0.3]: mean 0.35, std sqrt(0.005) -> [+0.7071, -0.7071]
    close(adv[0, [0, 2]], [1 / math.sqrt(2), -1 / math.sqrt(2)], atol=1e-5)


def test_gae_batch_whitening_is_global():
    # Two identical rows: stats over 6 tokens: mean 0.4, unbiased var (4 * 0.01) / 5 = 0.008
    adv, ret = compute_gae(
        t(REWARDS, REWARDS), t(VALUES, VALUES), torch.ones(2, 3, dtype=torch.float64), 1.0, 1.0
    )
    close(ret, [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    s = 0.1 / math.sqrt(0.008)
    close(adv, [[s, 0.0, -s], [s, 0.0, -s]], atol=1e-5)


# --- GRPO ----------------------------------------------------------------------------------------------

# group a: scores [1, 0]     -> mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.70710678
# group b: scores [3, 1, 2]  -> mean 2,   unbiased std sqrt((1 + 1 + 0) / 2) = 1
#   (the population std would be sqrt(2/3) = 0.8165 and give +-1.2247 instead of +-1)
# group c: score [0.7] alone -> verl uses mean 0, std 1
SCORES = [1.0, 3.0, 0.0, 1.0, 2.0, 0.7]
EPS = 1e-6
A_HI = 0.5 / (math.sqrt(0.5) + EPS)  # 0.70710578
EXPECTED_NORM = [A_HI, 1 / (1 + EPS), -A_HI, -1 / (1 + EPS), 0.0, 0.7 / (1 + EPS)]
EXPECTED_NO_STD = [0.5, 1.0, -0.5, -1.0, 0.0, 0.7]
GRPO_MASK = [
    [1.0, 1.0, 1.0],
    [1.0, 1.0, 0.0],
    [1.0, 0.0, 0.0],
    [1.0, 1.0, 1.0],
    [1.0, 1.0, 1.0],
    [1.0, 1.0, 0.0],
]


@pytest.mark.parametrize(
    "group_ids",
    [["a", "b", "a", "b", "b", "c"], torch.tensor([7, 3, 7, 3, 3, 0])],
    ids=["strings", "tensor"],
)
def test_grpo_two_groups_and_a_singleton(group_ids):
    scores = torch.tensor(SCORES, dtype=torch.float64)
    mask = torch.tensor(GRPO_MASK, dtype=torch.float64)
    adv = grpo_advantages(scores, group_ids, mask)
    expected = torch.tensor(EXPECTED_NORM, dtype=torch.float64).unsqueeze(-1) * mask
    close(adv, expected)
    assert adv[1, 2] == 0.0 and adv[2, 1] == 0.0  # masked tail stays zero


def test_grpo_without_std_normalisation():
    scores = torch.tensor(SCORES, dtype=torch.float64)
    mask = torch.ones(6, 2, dtype=torch.float64)
    adv = grpo_advantages(scores, ["a", "b", "a", "b", "b", "c"], mask, norm_by_std=False)
    close(adv, torch.tensor(EXPECTED_NO_STD, dtype=torch.float64).unsqueeze(-1).expand(6, 2))


def test_grpo_equal_scores_give_zero_not_nan():
    adv = grpo_advantages(torch.tensor([1.0, 1.0]), [0, 0], torch.ones(2, 2))  # 0 / (0 + eps)
    close(adv, torch.zeros(2, 2))


def test_grpo_rejects_wrong_lengths():
    with pytest.raises(ValueError, match="one label per score"):
        grpo_advantages(torch.tensor([1.0, 2.0]), [0], torch.ones(2, 3))
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(torch.ones(2, 3), [0, 0], torch.ones(2, 3))


# --- KL ------------------------------------------------------------------------------------------------


def test_kl_k1_and_k3_known_values():
    # k3 = e^x - x - 1 with x = ln(ref / p)
    # token 0: p = 0.5,  ref = 0.25: k1 = ln 2 = 0.693147; x = -ln 2: k3 = 0.5 + ln 2 - 1 = 0.193147
    # token 1: p = 0.25, ref = 0.5:  k1 = -ln 2;           x = ln 2:  k3 = 2 - ln 2 - 1 = 0.306853
    logp = t([math.log(0.5), math.log(0.25)])
    ref = t([math.log(0.25), math.log(0.5)])
    ln2 = math.log(2)
    close(kl_penalty(logp, ref, "k1"), [[ln2, -ln2]])
    close(kl_penalty(logp, ref, "k3"), [[0.5 + ln2 - 1, 2 - ln2 - 1]])
    close(kl_penalty(logp, ref, "low_var_kl"), [[0.5 + ln2 - 1, 2 - ln2 - 1]])  # verl's name


def test_kl_k3_is_clamped():
    # x = ref - logp = +30 -> clamp 20 -> e^20 - 21 ~ 4.85e8 -> clamp 10
    # x = -30 -> clamp -20 -> e^-20 + 20 - 1 ~ 19 -> clamp 10
    close(kl_penalty(t([-30.0, 0.0]), t([0.0, -30.0]), "k3"), [[10.0, 10.0]])
    close(kl_penalty(t([0.3]), t([0.3]), "k3"), [[0.0]])  # same policy: exp(0) - 0 - 1 = 0


def test_kl_unknown_kind():
    with pytest.raises(ValueError, match="but got 'k2'"):
        kl_penalty(t([0.0]), t([0.0]), "k2")


# --- policy loss ---------------------------------------------------------------------------------------


def _logp_for_ratios(ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.full((1, len(ratios)), math.log(0.5), dtype=torch.float64)
    return old + torch.log(torch.tensor([ratios], dtype=torch.float64)), old


def test_policy_loss_no_clipping_inside_trust_region():
    # token 0: r = 1.1, A = +1: max(-1.1, -clip(1.1) = -1.1) = -1.1
    # token 1: r = 0.9, A = -1: max( 0.9,  clip(0.9) =  0.9) =  0.9
    # loss = (-1.1 + 0.9) / 2 = -0.1, nothing clipped
    logp, old = _logp_for_ratios([1.1, 0.9])
    loss, clipfrac = policy_loss(logp, old, t([1.0, -1.0]), t([1.0, 1.0]), clip_ratio=0.2)
    close(loss, -0.1)
    close(clipfrac, 0.0)


def test_policy_loss_clipping_applies():
    # r = [1.5, 0.5, 1.5, 0.5, e^2 (masked)], A = [+1, +1, -1, -1, +1], eps = 0.2
    # token 0: max(-1.5, -1.2) = -1.2  clipped
    # token 1: max(-0.5, -0.8) = -0.5  not clipped (pessimistic: the lower ratio counts)
    # token 2: max( 1.5,  1.2) =  1.5  not clipped
    # token 3: max( 0.5,  0.8) =  0.8  clipped
    # loss = (-1.2 - 0.5 + 1.5 + 0.8) / 4 = 0.15; clipfrac = 2 / 4 = 0.5
    logp, old = _logp_for_ratios([1.5, 0.5, 1.5, 0.5, math.e**2])
    logp.requires_grad_(True)
    adv = t([1.0, 1.0, -1.0, -1.0, 1.0])
    loss, clipfrac = policy_loss(logp, old, adv, t([1.0, 1.0, 1.0, 1.0, 0.0]), clip_ratio=0.2)
    close(loss.detach(), 0.15)
    close(clipfrac, 0.5)
    # d loss / d logp_i = -A_i * r_i / 4 where unclipped, 0 where the clipped term won or masked
    (grad,) = torch.autograd.grad(loss, logp)
    close(grad, [[0.0, -0.5 / 4, 1.5 / 4, 0.0, 0.0]])


def test_policy_loss_dual_clip_caps_negative_advantage():
    # r = 4, A = -1: max(4, 1.2) = 4; dual clip: min(4, -A * 3) = 3 (plain PPO keeps 4)
    logp, old = _logp_for_ratios([4.0])
    mask = t([1.0])
    close(policy_loss(logp, old, t([-1.0]), mask)[0], 3.0)
    close(policy_loss(logp, old, t([-1.0]), mask, clip_ratio_c=None)[0], 4.0)
    close(policy_loss(logp, old, t([1.0]), mask)[0], -1.2)  # A > 0: -clip(4) = -1.2, dual clip not used


# --- value loss ----------------------------------------------------------------------------------------


def test_value_loss_clipped():
    # clip range 0.5 around the old value 1.0 -> [0.5, 1.5]
    # token 0: v = 2.0, R = 1.5: (0.5)^2 = 0.25 vs (1.5 - 1.5)^2 = 0    -> 0.25  not clipped
    # token 1: v = 2.0, R = 3.0: (1.0)^2 = 1.0  vs (1.5 - 3.0)^2 = 2.25 -> 2.25  clipped
    # token 2: v = 1.2, R = 0.0: inside the range: 1.44 vs 1.44          -> 1.44  not clipped
    # token 3: masked (v = 100)
    # loss = 0.5 * (0.25 + 2.25 + 1.44) / 3 = 0.656667; clipfrac = 1/3
    values = t([2.0, 2.0, 1.2, 100.0])
    old = t([1.0, 1.0, 1.0, 1.0])
    returns = t([1.5, 3.0, 0.0, 0.0])
    loss, clipfrac = value_loss(values, old, returns, t([1.0, 1.0, 1.0, 0.0]), clip_range=0.5)
    close(loss, 0.5 * 3.94 / 3)
    close(clipfrac, 1 / 3)


# --- token rewards -------------------------------------------------------------------------------------


def test_token_rewards_score_on_last_valid_token_with_kl():
    scores = torch.tensor([2.0, -1.0], dtype=torch.float64)
    mask = t([1.0, 1.0, 1.0], [1.0, 1.0, 0.0])
    close(token_rewards_from_scores(scores, mask), [[0.0, 0.0, 2.0], [0.0, -1.0, 0.0]])
    kl = t([0.1, 0.2, 0.3], [0.4, 0.5, 0.6])
    # coef 0.5: row 0: [-0.05, -0.1, 2 - 0.15]; row 1: [-0.2, -1 - 0.25, 0 (masked kl ignored)]
    close(
        token_rewards_from_scores(scores, mask, kl=kl, kl_coef=0.5), [[-0.05, -0.1, 1.85], [-0.2, -1.25, 0.0]]
    )


def test_token_rewards_reject_row_without_valid_token():
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        token_rewards_from_scores(torch.tensor([1.0, 2.0]), torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
