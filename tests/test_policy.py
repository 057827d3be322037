"""The tuner's decision on a config, as a pure function of the trials seen, the memory model and the budget:
no storage, no probe."""

from __future__ import annotations

import dataclasses

from optuna.distributions import IntDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.config.knobs import ProbeConfig
from autotune.memory.budget import Budget
from autotune.memory.calibration import MemoryModel
from autotune.search.policy import ProbeIt, decide, prediction_margin
from autotune.status import Attr, Status
from autotune.study.outcome import Outcome
from autotune.units import GIB
from tests.test_memory_model import TINY

BASE = ProbeConfig(
    rollout_batch_size=8,
    train_batch_size=16,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    max_prompt_length=32,
    max_response_length=16,
)
BUDGET = Budget(int(1.0 * GIB), 0.10)
PRIOR = MemoryModel(TINY, 1, "cpu")


def trial(number: int, status: str, config: ProbeConfig, speed: float, peak: float, **attrs) -> FrozenTrial:
    frozen = create_trial(
        state=TrialState.COMPLETE,
        values=[speed, peak],
        params={"log2_micro_batch_size": 2},
        distributions={"log2_micro_batch_size": IntDistribution(0, 6)},
        user_attrs={Attr.STATUS: status, Attr.CONFIG: config.to_dict(), Attr.PEAK_BYTES: int(peak), **attrs},
    )
    frozen.number = number
    return frozen


def test_a_config_measured_before_is_a_duplicate_of_that_measurement():
    seen = [trial(3, Status.OK, BASE, 12.5, 0.6 * GIB)]
    decision = decide(BASE, seen, PRIOR, BUDGET)
    assert isinstance(decision, Outcome)
    assert (decision.status, decision.samples_per_sec, decision.peak_bytes) == (
        Status.OK,
        12.5,
        int(0.6 * GIB),
    )
    assert decision.attrs == {Attr.DUPLICATE_OF: 3}


def test_under_dynamic_batch_size_the_micro_batch_sizes_verl_does_not_read_make_no_new_job():
    dynamic = dataclasses.replace(BASE, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=1024)
    seen = [trial(3, Status.OK, dynamic, 12.5, 0.6 * GIB)]
    other_micro = dataclasses.replace(dynamic, micro_batch_size=2, gradient_accumulation_steps=4)
    other_micro = dataclasses.replace(other_micro, log_prob_micro_batch_size=4)
    decision = decide(other_micro, seen, PRIOR, BUDGET)
    assert isinstance(decision, Outcome) and decision.attrs == {Attr.DUPLICATE_OF: 3}
    other_mini = dataclasses.replace(dynamic, gradient_accumulation_steps=1)  # 4 samples per step, not 8
    assert isinstance(decide(other_mini, seen, PRIOR, BUDGET), ProbeIt)
    static = [
        trial(
            3,
            Status.OK,
            dataclasses.replace(dynamic, use_dynamic_bsz=False, ppo_max_token_len_per_gpu=None),
            12.5,
            0.6 * GIB,
        )
    ]
    static_other = dataclasses.replace(other_micro, use_dynamic_bsz=False, ppo_max_token_len_per_gpu=None)
    assert isinstance(decide(static_other, static, PRIOR, BUDGET), ProbeIt)  # verl reads m and lm: a new job


def test_a_crash_is_not_reused_the_config_is_probed_again():
    seen = [trial(0, Status.CRASHED, BASE, 0.0, 0.0)]
    assert isinstance(decide(BASE, seen, PRIOR, BUDGET), ProbeIt)


def test_a_config_at_least_as_large_as_a_measured_oom_is_not_launched():
    seen = [trial(5, Status.OOM, BASE, 0.0, 1.0 * GIB)]
    larger = dataclasses.replace(BASE, micro_batch_size=8, gradient_accumulation_steps=1)
    decision = decide(larger, seen, PRIOR, BUDGET)
    assert isinstance(decision, Outcome) and decision.status == Status.INFERRED_OOM
    assert decision.attrs == {Attr.DOMINATES_OOM_TRIAL: 5} and decision.peak_bytes >= BUDGET.bytes
    smaller = dataclasses.replace(BASE, micro_batch_size=2, gradient_accumulation_steps=4)
    assert isinstance(decide(smaller, seen, PRIOR, BUDGET), ProbeIt)


def test_a_config_far_over_the_budget_is_predicted_not_probed():
    tiny_budget = Budget(int(0.2 * GIB), 0.10)  # the CPU prior alone (0.45 GiB) is over it
    decision = decide(BASE, [], PRIOR, tiny_budget)
    assert isinstance(decision, Outcome) and decision.status == Status.PREDICTED_OOM
    assert decision.attrs[Attr.CALIBRATION_POINTS] == 0
    assert decision.peak_bytes == decision.attrs[Attr.PREDICTED_PEAK_BYTES] > tiny_budget.bytes * 1.6


def test_within_the_margin_the_probe_decides_and_carries_the_prediction():
    decision = decide(BASE, [], PRIOR, BUDGET)
    assert isinstance(decision, ProbeIt)
    assert decision.attrs[Attr.PREDICTED_PEAK_BYTES] == PRIOR.predict(BASE)
    assert decision.attrs[Attr.CALIBRATION_POINTS] == 0


def test_the_model_is_calibrated_on_the_studys_ok_probes_and_the_margin_narrows():
    other = dataclasses.replace(BASE, max_response_length=32)
    seen = [
        trial(0, Status.OK, other, 10.0, 0.8 * GIB),
        trial(1, Status.OK, other, 10.0, 0.8 * GIB, duplicate_of=0),
    ]
    decision = decide(BASE, seen, PRIOR, BUDGET)
    # a duplicate is not a second measurement, even of trial #0 (whose number is falsy)
    assert isinstance(decision, ProbeIt) and decision.attrs[Attr.CALIBRATION_POINTS] == 1
    assert decision.attrs[Attr.PREDICTED_PEAK_BYTES] != PRIOR.predict(BASE)
    assert prediction_margin(0) > prediction_margin(1) > prediction_margin(3)


def test_without_pruning_every_new_config_is_probed():
    seen = [trial(5, Status.OOM, BASE, 0.0, 1.0 * GIB)]
    larger = dataclasses.replace(BASE, micro_batch_size=8, gradient_accumulation_steps=1)
    assert decide(larger, seen, PRIOR, Budget(int(0.2 * GIB), 0.1), prune=False) == ProbeIt()
