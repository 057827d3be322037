"""Packed micro batches as verl's remove-padding path forms them (autotune.probe.rank.packing)."""

from __future__ import annotations

import torch

from autotune.models.catalog import build_causal_lm, resolve_model
from autotune.probe.rank import rl_math
from autotune.probe.rank.packing import (
    Rollout,
    balanced_micro_batches,
    pack,
    plan_responses,
    prefix_under_budget,
)

CPU = torch.device("cpu")


def _rollout(prompts: list[list[int]], responses: list[list[int]], limit: int = 4) -> Rollout:
    return Rollout([torch.tensor(p) for p in prompts], [torch.tensor(r) for r in responses], limit)


def test_the_docstrings_example_positions_restart_and_responses_are_read_one_before():
    # prompts of 3 and 2 tokens, responses of 2 and 1: one row of 8 tokens
    rollout = _rollout([[11, 12, 13], [21, 22]], [[14, 15], [23]])
    packed = pack(rollout, [0, 1], CPU)
    assert packed.tokens == 8
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert packed.input_ids.tolist() == [[11, 12, 13, 14, 15, 21, 22, 23]]
    # the first response's tokens are predicted at packed positions 2 and 3, the second's at 6
    assert packed.response_positions[0, :2].tolist() == [2, 3] and packed.response_positions[1, 0] == 6
    assert packed.response_mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
    # and the label at each of those positions is the response token itself
    labels = packed.responses_of(packed.labels)
    assert labels[0, :2].tolist() == [14, 15] and labels[1, 0] == 23


def test_packed_log_probs_equal_each_sequence_alone():
    """Hugging Face attends within each sequence of a packed row (from the restarting position ids, without
    a cache, as the probe calls it): the response log-probs of one packed forward equal those of each sample
    run on its own."""
    torch.manual_seed(0)
    model = build_causal_lm(resolve_model("tiny-llama"), dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1000, (n,), generator=generator) for n in (5, 3, 7)]
    responses = [torch.randint(0, 1000, (n,), generator=generator) for n in (4, 2, 3)]
    rollout = Rollout(prompts, responses, 4)
    packed = pack(rollout, [0, 1, 2], CPU)
    with torch.no_grad():
        out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
        logits = out.logits.squeeze(0)
        together = packed.responses_of(rl_math.logprobs_from_logits(logits, packed.labels))
        for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            ids = torch.cat([prompt, response]).unsqueeze(0)
            alone = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            expected = rl_math.logprobs_from_logits(alone, response)
            torch.testing.assert_close(together[row, : len(response)], expected, atol=1e-4, rtol=1e-4)


def test_a_budget_cuts_verls_count_of_balanced_micro_batches():
    lengths = [9, 7, 6, 5, 4, 3]  # 34 tokens under a budget of 12: ceil(34 / 12) = 3 micro batches
    batches = balanced_micro_batches(lengths, 12)
    assert len(batches) == 3
    assert sorted(i for b in batches for i in b) == list(range(6))  # every sample once
    assert all(sum(lengths[i] for i in b) <= 12 for b in batches)
    # one more when the count does not fit: 3 × 10 tokens under 15 need 3, not ceil(30 / 15) = 2
    assert len(balanced_micro_batches([10, 10, 10], 15)) == 3
    assert balanced_micro_batches([], 8) == []


def test_the_prefix_under_a_budget_holds_at_least_one_sequence():
    assert prefix_under_budget([4, 4, 4], 9) == 2
    assert prefix_under_budget([4, 4, 4], 12) == 3
    assert prefix_under_budget([20, 4], 8) == 1  # verl asserts every sequence fits; one is kept


def test_planned_responses_fill_each_passs_first_micro_batch_to_its_priced_tokens():
    prompts, drawn = [10] * 8, [3] * 8  # samples of 13 tokens as drawn, responses up to 20
    # a fixed micro batch of 2 priced at 50 tokens, one of 4 at 80
    planned = plan_responses(prompts, drawn, 20, fixed=[(2, 50), (4, 80)])
    lengths = [p + r for p, r in zip(prompts, planned, strict=True)]
    assert sum(lengths[:2]) == 50 and sum(lengths[:4]) == 80 and planned[4:] == drawn[4:]
    assert all(1 <= r <= 20 for r in planned)
    # under a budget of 60 tokens over a pool of 8: the first samples hold exactly 60
    planned = plan_responses(prompts, drawn, 20, budgets=[(8, 60)])
    lengths = [p + r for p, r in zip(prompts, planned, strict=True)]
    assert sum(lengths[: prefix_under_budget(lengths, 60)]) == 60
