"""The study's sampler and speed model (autotune.search.sampler, .surrogate) and the noise-aware pick
(autotune.report.pick), against synthetic probes: no process is started."""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from autotune.config.knobs import ProbeConfig
from autotune.memory.budget import Budget
from autotune.memory.calibration import MemoryModel
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.report import pick
from autotune.run.tuner import Tuner
from autotune.search.sampler import SystemSampler, _fits, choose_next
from autotune.search.surrogate import Observation, SpeedModel
from autotune.space.loading import load_space
from autotune.space.model import at_least_as_large
from autotune.status import Attr, Status, StudyAttr
from autotune.study.trials import config_key, enqueue_seed_configs, trial_config_of
from autotune.units import GIB
from tests.conftest import TINY_GRID
from tests.test_memory_model import TINY

SPACE = load_space(str(TINY_GRID), cores=2)
PRIOR = MemoryModel(TINY, 1, "cpu")


def phase_seconds(c: ProbeConfig) -> dict[str, float]:
    """A synthetic machine: costs per call and per sample, checkpointing recomputes, two workers help."""
    rollout = (0.2 + 3.0 * c.train_batch_size / c.rollout_batch_size / 32) / (
        1.3 if c.num_rollout_workers > 1 else 1
    )
    scoring = 0.1 + 1.5 / c.forward_micro_batch_size
    update = 0.3 + 2.0 / c.micro_batch_size + (0.4 if c.gradient_checkpointing else 0.0)
    return {"rollout": rollout, "scoring": scoring, "update": update}


def synthetic_speed(c: ProbeConfig) -> float:
    return c.train_batch_size / sum(phase_seconds(c).values())


def synthetic_probe(config: ProbeConfig, settings=None, cancel=None) -> ProbeResult:
    phases = phase_seconds(config)
    iteration = sum(phases.values())
    return ProbeResult(
        status=Status.OK,
        samples_per_sec=config.train_batch_size / iteration,
        iteration_seconds=iteration,
        phase_seconds=phases,
        peak_memory_bytes=PRIOR.predict(config),
        wall_seconds=iteration + 1.0,
        config=config.to_dict(),
    )


def budget_fitting(share: float) -> Budget:
    """A budget whose limit lets `share` of the space's configurations fit under the prior model."""
    peaks = sorted(PRIOR.predict(c) for c in SPACE.grid())
    limit = peaks[int(share * (len(peaks) - 1))]
    return Budget(int(limit / 0.9) + 1, 0.10)


def test_before_any_probe_the_priors_rank_larger_batches_faster():
    small = SPACE.grid()[0]
    large = dataclasses.replace(small, micro_batch_size=8, gradient_accumulation_steps=1)
    model = SpeedModel(SPACE.grid(), 1, [])
    slow, fast = model.optimistic_speed([small, large], boldness=0.0)
    assert fast > slow


def test_the_phase_models_predict_configurations_never_probed():
    grid = SPACE.grid()
    seen = grid[::23]  # 11 of 240
    model = SpeedModel(
        grid, 1, [Observation(c, phase_seconds(c), sum(phase_seconds(c).values())) for c in seen]
    )
    predicted = model.optimistic_speed(grid, boldness=0.0)
    best_predicted = grid[int(predicted.argmax())]
    assert synthetic_speed(best_predicted) >= 0.95 * max(synthetic_speed(c) for c in grid)
    errors = [abs(p - synthetic_speed(c)) / synthetic_speed(c) for p, c in zip(predicted, grid, strict=True)]
    assert sorted(errors)[len(errors) // 2] < 0.10


def study_with(sampler: optuna.samplers.BaseSampler, budget: Budget, seeds: bool = True) -> Tuner:
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    tuner = Tuner(study, SPACE, ProbeSettings(), budget, PRIOR, probe=synthetic_probe)
    if seeds:
        enqueue_seed_configs(study, SPACE)
    return tuner


def test_the_sampler_finds_the_fastest_fitting_configuration_in_few_probes():
    budget = budget_fitting(0.3)  # Optuna's random and TPE samplers reach 67-82% of the optimum here
    tuner = study_with(SystemSampler(SPACE, PRIOR, budget, seed=0), budget)
    for _ in range(8):
        tuner.step()
    trials = tuner.study.trials
    first = trials[0].user_attrs[Attr.SEED_CONFIG]
    assert first == SPACE.seed_configs[0].name  # the hand-made config still goes first
    keys = [config_key(ProbeConfig(**t.user_attrs[Attr.CONFIG])) for t in trials]
    assert len(set(keys)) == len(keys)  # never the same configuration twice
    assert all(t.user_attrs[Attr.STATUS] == Status.OK for t in trials)  # never over the budget
    feasible = [c for c in SPACE.grid() if PRIOR.predict(c) <= budget.limit]
    best = max(t.values[0] for t in trials if t.values[1] <= budget.limit)
    assert best >= 0.99 * max(synthetic_speed(c) for c in feasible)


def test_choose_skips_what_is_decided_busy_or_at_least_as_large_as_an_oom():
    budget = budget_fitting(1.0)
    grid = SPACE.grid()
    study = optuna.create_study(directions=["maximize", "minimize"])
    tuner = Tuner(study, SPACE, ProbeSettings(), budget, PRIOR, probe=synthetic_probe)
    oom = dataclasses.replace(grid[0], micro_batch_size=2, gradient_accumulation_steps=4)

    def oom_probe(config, settings=None, cancel=None):
        return ProbeResult(status=Status.OOM, oom_kind="emulated", peak_memory_bytes=budget.bytes)

    tuner.probe = oom_probe
    study.enqueue_trial(_params(oom))
    tuner.step()
    complete = study.trials
    busy = {config_key(grid[-1])}
    chosen = choose_next(grid, complete, PRIOR, budget, busy)
    assert chosen is not None
    assert config_key(chosen) not in busy | {config_key(oom)}
    assert not at_least_as_large(chosen, oom)
    # everything not decided, not busy and not as large as the OOM is still open
    open_ = [
        c for c in grid if config_key(c) not in busy | {config_key(oom)} and not at_least_as_large(c, oom)
    ]
    assert len(open_) > 1


def test_choose_takes_the_smallest_predicted_peak_when_nothing_is_predicted_to_fit():
    tight = Budget(int(0.01 * GIB), 0.10)
    chosen = choose_next(SPACE.grid(), [], PRIOR, tight)
    assert PRIOR.predict(chosen) == min(PRIOR.predict(c) for c in SPACE.grid())


def _params(config: ProbeConfig) -> dict:
    from autotune.space.model import config_to_params

    params = config_to_params(SPACE, config)
    assert params is not None
    return params


# --- the noise-aware pick ----------------------------------------------------------------------------------


def test_contenders_within_the_noise_are_remeasured_and_the_pick_goes_by_the_mean():
    budget = budget_fitting(1.0)
    tuner = study_with(optuna.samplers.RandomSampler(seed=1), budget, seeds=False)
    grid = SPACE.grid()
    leader, rival, far = grid[-1], grid[-2], grid[0]
    speeds = {config_key(leader): 10.0, config_key(rival): 9.8, config_key(far): 5.0}
    later = {config_key(leader): 9.0, config_key(rival): 10.2}  # the leader's first figure was lucky

    def probe(config, settings=None, cancel=None):
        result = synthetic_probe(config)
        key = config_key(config)
        speed = later[key] if tuner.study.user_attrs.get("measured", {}).get(key) else speeds[key]
        return dataclasses.replace(result, samples_per_sec=speed, wall_seconds=2.0)

    for config in (leader, rival, far):
        tuner.study.enqueue_trial(_params(config))
    tuner.probe = probe
    for _ in range(3):
        tuner.step()
    tuner.study.set_user_attr("measured", dict.fromkeys(speeds, True))
    rivals = pick.contenders(tuner.study, budget)
    assert [config_key(trial_config_of(t)) for t in rivals] == [config_key(leader), config_key(rival)]
    count = pick.remeasure(tuner.study, rivals, probe, None, seconds=100.0)
    assert count == 2 * pick.ROUNDS
    chosen = pick.choose(tuner.study, budget)
    assert config_key(trial_config_of(chosen)) == config_key(rival)
    found = pick.figures(tuner.study, chosen)
    assert found.count == 1 + pick.ROUNDS
    assert found.mean == pytest.approx((9.8 + 10.2 * pick.ROUNDS) / (1 + pick.ROUNDS))


def test_remeasuring_stops_within_its_time_and_an_over_budget_reprobe_disqualifies():
    budget = budget_fitting(1.0)
    tuner = study_with(optuna.samplers.RandomSampler(seed=1), budget, seeds=False)
    grid = SPACE.grid()
    for config in (grid[-1], grid[-2]):
        tuner.study.enqueue_trial(_params(config))

    def probe(config, settings=None, cancel=None):
        return dataclasses.replace(synthetic_probe(config), samples_per_sec=10.0, wall_seconds=2.0)

    tuner.probe = probe
    tuner.step()
    tuner.step()
    rivals = pick.contenders(tuner.study, budget)
    assert pick.remeasure(tuner.study, rivals, probe, None, seconds=5.0) == 2  # 2 s each, within 5 s

    def over(config, settings=None, cancel=None):
        return dataclasses.replace(
            probe(config), peak_memory_bytes=int(budget.limit) + 1, samples_per_sec=11.0
        )

    kept = tuner.study.user_attrs[StudyAttr.REMEASURED]
    first = str(rivals[0].number)
    pick.remeasure(tuner.study, rivals[:1], over, None, seconds=5.0)
    assert len(tuner.study.user_attrs[StudyAttr.REMEASURED][first]) == len(kept[first]) + 2
    assert pick.choose(tuner.study, budget).number == rivals[1].number


def test_a_contender_left_with_its_first_probe_is_not_set_against_means():
    budget = budget_fitting(1.0)
    tuner = study_with(optuna.samplers.RandomSampler(seed=1), budget, seeds=False)
    grid = SPACE.grid()
    leader, rival, third = grid[-1], grid[-2], grid[-3]
    first = {config_key(leader): 10.0, config_key(rival): 9.9, config_key(third): 9.8}
    again = {config_key(leader): 9.0, config_key(rival): 8.9}  # both first figures were lucky draws

    def probe(config, settings=None, cancel=None):
        key = config_key(config)
        speed = again[key] if tuner.study.user_attrs.get("measured") else first[key]
        return dataclasses.replace(synthetic_probe(config), samples_per_sec=speed, wall_seconds=2.0)

    for config in (leader, rival, third):
        tuner.study.enqueue_trial(_params(config))
    tuner.probe = probe
    for _ in range(3):
        tuner.step()
    tuner.study.set_user_attr("measured", True)
    rivals = pick.contenders(tuner.study, budget)
    assert len(rivals) == 3
    assert pick.remeasure(tuner.study, rivals, probe, None, seconds=0.0) == 2  # the third's turn ran out
    chosen = pick.choose(tuner.study, budget)
    assert config_key(trial_config_of(chosen)) == config_key(leader)  # mean 9.5, not the third's single 9.8


def _two_reprobed(speeds: dict[str, list[float]]):
    """A study of two contenders, each probed as `speeds` says (first probe, then its re-probes)."""
    budget = budget_fitting(1.0)
    tuner = study_with(optuna.samplers.RandomSampler(seed=1), budget, seeds=False)
    grid = SPACE.grid()
    faster, keeper = grid[-1], grid[-2]
    runs = {config_key(faster): iter(speeds["faster"]), config_key(keeper): iter(speeds["keeper"])}

    def probe(config, settings=None, cancel=None):
        speed = next(runs[config_key(config)])
        return dataclasses.replace(synthetic_probe(config), samples_per_sec=speed, wall_seconds=2.0)

    for config in (faster, keeper):
        tuner.study.enqueue_trial(_params(config))
    tuner.probe = probe
    tuner.step()
    tuner.step()
    rivals = pick.contenders(tuner.study, budget)
    pick.remeasure(tuner.study, rivals, probe, None, seconds=100.0)
    knob = next(
        k for k in ("gradient_checkpointing", "micro_batch_size") if getattr(faster, k) != getattr(keeper, k)
    )
    defaults = {knob: getattr(keeper, knob)}  # the trainer's default is the keeper's value
    return tuner.study, budget, defaults, faster, keeper


def test_within_the_noise_the_trainers_default_is_kept():
    """The faster mean is 6.4% ahead and leaves a trainer default, but the keeper's own probes spread 12%:
    the probes cannot tell them apart, so the default stays."""
    study, budget, defaults, faster, keeper = _two_reprobed(
        {"faster": [5.9, 5.5, 5.45], "keeper": [5.6, 4.99, 5.25]}
    )
    chosen = pick.choose(study, budget, defaults)
    assert config_key(trial_config_of(chosen)) == config_key(keeper)
    assert pick.departures(trial_config_of(chosen), defaults) == 0
    assert config_key(trial_config_of(pick.choose(study, budget))) == config_key(faster)  # no defaults given


def test_beyond_the_noise_the_faster_leaves_the_default():
    study, budget, defaults, faster, _ = _two_reprobed(
        {"faster": [6.05, 6.1, 6.1], "keeper": [5.7, 5.65, 5.68]}  # 7% apart, each within 1%
    )
    chosen = pick.choose(study, budget, defaults)
    assert config_key(trial_config_of(chosen)) == config_key(faster)


def test_a_chosen_value_fits_a_distribution_by_its_public_bounds() -> None:
    """The sampler hands Optuna only values the asked-for distribution holds; any other is drawn at random."""
    assert _fits(CategoricalDistribution([1, 2, 4]), 2)
    assert not _fits(CategoricalDistribution([1, 2, 4]), 8)
    assert _fits(CategoricalDistribution([True, False]), False)
    assert _fits(IntDistribution(1, 9, step=2), 5)
    assert not _fits(IntDistribution(1, 9, step=2), 4)  # off the step
    assert not _fits(IntDistribution(1, 9, step=2), 11)  # past high
    assert not _fits(IntDistribution(1, 9), "many")  # another kind of value
    assert _fits(FloatDistribution(0.0, 1.0), 0.3)
    assert not _fits(FloatDistribution(0.0, 1.0), 1.5)
    assert _fits(FloatDistribution(0.0, 1.0, step=0.1), 0.3)
    assert not _fits(FloatDistribution(0.0, 1.0, step=0.25), 0.3)
