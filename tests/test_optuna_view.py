"""The study as Optuna's own tools see it (issue 16, item 6): parameters by knob name and real value, older
studies with `log2_...` exponents still resumed, and `best_trials` / `optuna best-trials` keeping only the
trials within the memory limit."""

from __future__ import annotations

import json
import sys
import warnings

import optuna
import optuna.cli
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from autotune.config.knobs import ProbeConfig
from autotune.memory.architecture import Architecture
from autotune.memory.budget import Budget
from autotune.memory.calibration import MemoryModel
from autotune.models.catalog import resolve_model
from autotune.probe.contract import ProbeSettings
from autotune.run.tuner import Tuner
from autotune.search.sampler import SystemSampler
from autotune.space.loading import load_space, with_settings
from autotune.space.model import config_to_params, sample_config
from autotune.status import Attr, Status
from autotune.study.outcome import Outcome, record_outcome
from autotune.study.trials import open_study
from autotune.units import GIB
from tests.conftest import TINY_GRID
from tests.test_study import FakeProbe

SPACE = load_space(str(TINY_GRID), cores=2)
BUDGET = Budget(int(0.70 * GIB), 0.10)
MODEL = MemoryModel(Architecture.from_specs(resolve_model("tiny-llama")), 1, "cpu")


def storage_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


def system_tuner(study: optuna.Study, probe: FakeProbe) -> Tuner:
    study.sampler = SystemSampler(SPACE, MODEL, BUDGET, seed=0)  # as `autotune run` sets it
    return Tuner(study, SPACE, ProbeSettings(), BUDGET, MODEL, probe=probe)


# --- parameters: the knobs, by name and value -------------------------------------------------------------


def test_parameters_are_the_knobs_with_their_values_and_one_distribution_each(tmp_path):
    study = open_study(storage_url(tmp_path), "view", seed=0)
    tuner = system_tuner(study, FakeProbe())
    for _ in range(6):
        tuner.step()
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(trials) >= 4
    for trial in trials:
        assert not any(name.startswith("log2_") for name in trial.params)
        assert trial.params == config_to_params(SPACE, ProbeConfig(**trial.user_attrs[Attr.CONFIG]))
        assert trial.params["micro_batch_size"] in (1, 2, 4, 8)
        assert trial.params["rollout_batch_size"] in (8, 16, 32)
    # one distribution per name across the study, so the dashboard's intersection views keep every knob
    common = optuna.search_space.intersection_search_space(trials)
    assert common["micro_batch_size"] == CategoricalDistribution([1, 2, 4, 8])
    assert common["log_prob_micro_batch_size"] == CategoricalDistribution([2, 4, 8, 16, 32])
    assert common["num_rollout_workers"] == IntDistribution(1, 2)


def test_random_sampling_over_a_tuned_recipe_stays_valid_and_fixed_trials_round_trip():
    space = with_settings(
        SPACE,
        tune=["train_batch_size"],
        knobs={**SPACE.raw["knobs"], "train_batch_size": {"min": 8, "max": 64}},
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(80):  # R's range is clipped by T here: a draw past it runs the nearest valid value
        trial = study.ask()
        config = sample_config(space, trial)
        assert config.train_batch_size % config.rollout_batch_size == 0
        params = config_to_params(space, config)
        assert params is not None and sample_config(space, optuna.trial.FixedTrial(params)) == config
        study.tell(trial, 0.0)


# --- feasibility: what Optuna's best trials are ---------------------------------------------------------


def recorded_study(tmp_path) -> tuple[optuna.Study, dict[str, int]]:
    """Four trials: ok within the limit; ok faster but over budget·(1−headroom) (within the budget);
    a predicted OOM (never launched); a timeout whose peak is low."""
    study = open_study(storage_url(tmp_path), "front", seed=0)
    grid, numbers = SPACE.grid(), {}
    outcomes = {
        "ok": Outcome(Status.OK, grid[0], 10.0, int(0.5 * GIB)),
        "over_headroom": Outcome(Status.OK, grid[1], 20.0, int(0.66 * GIB)),
        "predicted_oom": Outcome(Status.PREDICTED_OOM, grid[2], 0.0, int(2.0 * GIB)),
        "timeout": Outcome(Status.TIMEOUT, grid[3], 0.0, 0),
    }
    assert BUDGET.limit < 0.66 * GIB < BUDGET.bytes
    for name, outcome in outcomes.items():
        study.enqueue_trial(config_to_params(SPACE, outcome.config))  # the params say what was recorded
        trial = study.ask()
        assert sample_config(SPACE, trial) == outcome.config
        numbers[name] = record_outcome(study, trial, outcome, BUDGET).number
    return study, numbers


def test_best_trials_are_only_the_ok_trials_within_the_limit(tmp_path):
    _, numbers = recorded_study(tmp_path)
    reloaded = optuna.load_study(study_name="front", storage=storage_url(tmp_path))
    assert [t.number for t in reloaded.best_trials] == [numbers["ok"]]
    # without the constraints the faster over-headroom trial and the low-peak timeout would be on the front
    front = optuna.study._multi_objective._get_pareto_front_trials(reloaded, consider_constraint=False)
    assert {numbers["over_headroom"], numbers["timeout"]} <= {t.number for t in front}


def test_the_optuna_cli_best_trials_lists_only_the_feasible_trial(tmp_path, monkeypatch, capsys):
    _, numbers = recorded_study(tmp_path)
    argv = [
        "optuna",
        "best-trials",
        "--study-name",
        "front",
        "--storage",
        storage_url(tmp_path),
        "-f",
        "json",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with warnings.catch_warnings():  # 'best-trials' is experimental in Optuna 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        assert optuna.cli.main() == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["number"] for row in rows] == [numbers["ok"]]
    assert rows[0]["params"]["micro_batch_size"] == SPACE.grid()[0].micro_batch_size


def test_constraints_are_stored_where_optuna_and_the_dashboard_read_them(tmp_path):
    study, numbers = recorded_study(tmp_path)
    for trial in study.get_trials():
        # optuna-dashboard 0.21 shows feasibility from the list Optuna's samplers write ("constraints")
        listed = trial.system_attrs["constraints"]
        assert listed == [trial.constraints["memory"], trial.constraints["runs"]]
        feasible = all(value <= 0 for value in listed)
        assert feasible == (trial.number == numbers["ok"])
