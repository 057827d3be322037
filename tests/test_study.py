"""The study's decisions, with a stand-in probe function (the real probe is tested end to end)."""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor

import optuna
import pytest

from autotune.errors import UserError
from autotune.memory.architecture import Architecture
from autotune.memory.budget import Budget
from autotune.memory.calibration import MemoryModel
from autotune.models.catalog import resolve_model
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.report.selection import best_feasible
from autotune.run.tuner import Tuner
from autotune.space.loading import load_space
from autotune.study.coordination import recover_stale_trials
from autotune.study.storage import make_storage, redact
from autotune.study.trials import enqueue_seed_configs, finished_trials, open_study, status_counts
from autotune.units import GIB

BUDGET = Budget(int(0.70 * GIB), 0.10)


class FakeProbe:
    """Peak grows with micro batch × response length; speed with micro batch. Records what it launched."""

    def __init__(self, oom_above: float = 0.70):
        self.launched = []
        self.oom_above = oom_above

    def __call__(self, config, settings, cancel=None):
        self.launched.append(config)
        peak = int((0.5 + 0.0002 * config.micro_batch_size * config.max_response_length) * GIB)
        if peak > self.oom_above * GIB:
            return ProbeResult(status="oom", oom_kind="emulated", peak_memory_bytes=peak)
        return ProbeResult(
            status="ok", samples_per_sec=float(config.micro_batch_size), peak_memory_bytes=peak
        )


def make_tuner(tmp_path, probe, seed=0, storage=None):
    space = load_space("cpu-tiny")
    storage = storage or f"sqlite:///{tmp_path / 'study.db'}"
    study = open_study(storage, "t", seed)
    model = MemoryModel(Architecture.from_specs(resolve_model("tiny-llama")), 1, "cpu")
    return Tuner(study, space, ProbeSettings(), BUDGET, model, probe=probe)


def test_every_trial_has_a_status_and_ooms_teach_the_sampler(tmp_path):
    probe = FakeProbe()
    tuner = make_tuner(tmp_path, probe)
    enqueue_seed_configs(tuner.study, tuner.space)
    for _ in range(15):
        tuner.step()
    trials = tuner.study.get_trials()
    assert all(t.user_attrs.get("status") for t in trials)
    assert trials[0].user_attrs.get("seed_config")  # the hand-made config went first
    ooms = [t for t in trials if t.user_attrs["status"] in ("oom", "inferred_oom", "predicted_oom")]
    for trial in ooms:  # recorded COMPLETE, infeasible, with finite worst-case values
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert trial.values[0] == 0.0 and trial.constraints["memory"] > 0
    best = best_feasible(tuner.study, BUDGET)
    assert best is not None and best.values[1] <= BUDGET.limit


def test_nothing_is_measured_twice(tmp_path):
    probe = FakeProbe()
    tuner = make_tuner(tmp_path, probe)
    for _ in range(20):
        tuner.step()
    keys = [repr(c) for c in probe.launched]
    assert len(keys) == len(set(keys))


def test_dominance_rules_out_larger_configs_without_a_launch(tmp_path):
    probe = FakeProbe(oom_above=0.6)
    tuner = make_tuner(tmp_path, probe)
    tuner.budget = Budget(4 * GIB, 0.1)  # the memory model predicts nothing above this: only a probe can tell
    small = tuner.space.grid()[0]
    big = dataclasses.replace(small, micro_batch_size=16, max_response_length=64)
    bigger_train = dataclasses.replace(big, train_batch_size=64, gradient_accumulation_steps=1)
    tuner.record(tuner.study.ask(), tuner.decide(big))
    assert tuner.study.trials[-1].user_attrs["status"] == "oom"
    outcome = tuner.decide(bigger_train)
    assert outcome.status == "inferred_oom" and outcome.attrs["dominates_oom_trial"] == 0
    assert len(probe.launched) == 1


def test_predicted_oom_is_not_launched(tmp_path):
    probe = FakeProbe()
    tuner = make_tuner(tmp_path, probe)
    tuner.budget = Budget(int(0.2 * GIB), 0.1)  # far below what the model predicts for anything
    outcome = tuner.decide(tuner.space.grid()[-1])
    assert outcome.status == "predicted_oom" and outcome.attrs["predicted_peak_bytes"] > 0.2 * GIB
    assert probe.launched == []


def test_stale_running_trial_is_failed_and_requeued_once(tmp_path):
    tuner = make_tuner(tmp_path, FakeProbe())
    trial = tuner.study.ask({"max_prompt_length": optuna.distributions.CategoricalDistribution([16, 32])})
    trial.set_user_attr("host", __import__("socket").gethostname())
    trial.set_user_attr("tuner_pid", 2**22 + 12345)  # no such process
    assert recover_stale_trials(tuner.study) == [0]
    first = tuner.study.trials[0]
    assert first.state == optuna.trial.TrialState.FAIL and first.user_attrs["status"] == "interrupted"
    retry = tuner.study.ask()
    assert retry.user_attrs["retry_of"] == 0
    assert retry.suggest_categorical("max_prompt_length", [16, 32]) == first.params["max_prompt_length"]


def test_a_trial_being_claimed_is_not_taken_for_dead(tmp_path):
    """Another worker reads the trial between the claim's attributes: the host is set, the pid not yet."""
    tuner = make_tuner(tmp_path, FakeProbe())
    trial = tuner.study.ask()
    trial.set_user_attr("host", __import__("socket").gethostname())
    assert recover_stale_trials(tuner.study) == []
    assert tuner.study.trials[0].state == optuna.trial.TrialState.RUNNING


def test_hand_made_trial_killed_before_sampling_is_requeued_from_its_fixed_params(tmp_path):
    tuner = make_tuner(tmp_path, FakeProbe())
    tuner.study.enqueue_trial({"max_prompt_length": 32}, user_attrs={"seed_config": "verl-default"})
    trial = tuner.study.ask()  # the tuner dies here: no suggest, so no params
    trial.set_user_attr("host", __import__("socket").gethostname())
    trial.set_user_attr("tuner_pid", 2**22 + 12345)
    assert recover_stale_trials(tuner.study) == [0]
    retry = tuner.study.ask()
    assert retry.user_attrs == {"retry_of": 0, "seed_config": "verl-default"}
    assert retry.suggest_categorical("max_prompt_length", [16, 32]) == 32


def test_sampler_trial_killed_before_sampling_is_not_requeued(tmp_path):
    tuner = make_tuner(tmp_path, FakeProbe())
    trial = tuner.study.ask()
    trial.set_user_attr("host", __import__("socket").gethostname())
    trial.set_user_attr("tuner_pid", 2**22 + 12345)
    assert recover_stale_trials(tuner.study) == [0]
    assert not tuner.study.get_trials(states=(optuna.trial.TrialState.WAITING,))


def test_study_with_other_directions_is_refused(tmp_path):
    storage = f"sqlite:///{tmp_path / 'other.db'}"
    optuna.create_study(storage=storage, study_name="s", directions=["minimize", "minimize"])
    with pytest.raises(UserError, match="not \\[maximize, minimize\\]"):
        open_study(storage, "s", 0)


def test_unopenable_storage_is_a_user_error():
    with pytest.raises(UserError, match="--storage"):
        open_study("nosuchdb://user:secret@host/db", "s", 0)


def test_processes_opening_a_new_database_at_once_all_open_it(tmp_path):
    """The race behind a flaky resume test: a new database's tables are created by whoever opens it first;
    the others lost "table already exists" and the tuner died. Eight at once, every one opens it."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    start = threading.Barrier(8)

    def open_it(_: int) -> str:
        start.wait()
        return type(make_storage(url)).__name__

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(open_it, range(8))) == ["RDBStorage"] * 8


def test_password_is_redacted():
    assert redact("postgresql://tuner:s3cret@db:5432/optuna") == "postgresql://tuner:***@db:5432/optuna"
    assert redact("sqlite:///x.db") == "sqlite:///x.db"


def test_status_counts_and_resume_keep_every_trial(tmp_path):
    storage = f"sqlite:///{tmp_path / 'resume.db'}"
    tuner = make_tuner(tmp_path, FakeProbe(), storage=storage)
    for _ in range(4):
        tuner.step()
    again = make_tuner(tmp_path, FakeProbe(), storage=storage)
    assert len(finished_trials(again.study)) == 4
    assert sum(status_counts(again.study).values()) == 4


def test_a_probe_lost_with_its_fork_server_is_retried_with_its_hand_made_label(tmp_path):
    """Not a property of the configuration: interrupted (FAIL), queued once more, the seed label kept."""

    def lost(config, settings, cancel=None):
        return ProbeResult(status="crashed", message="the fork server exited", infrastructure=True)

    tuner = make_tuner(tmp_path, lost)
    enqueue_seed_configs(tuner.study, tuner.space)
    first = tuner.step()
    assert first.user_attrs["status"] == "interrupted" and first.state.name == "FAIL"
    tuner.probe = FakeProbe()
    retry = tuner.step()
    assert retry.user_attrs["retry_of"] == first.number
    assert retry.user_attrs["seed_config"] == first.user_attrs["seed_config"]
    assert retry.user_attrs["config"] == first.user_attrs["config"] and retry.user_attrs["status"] == "ok"


BUSY_TIMEOUT = {"load": {"other_cores": None, "cores": 2, "load_1m_start": 7.0, "load_1m_end": 8.5}}


def _timing_out_first(busy: dict):
    """A probe whose first launch times out with `busy` conditions, the next ones run: the limits it saw."""
    limits = []

    def probe(config, settings, cancel=None):
        limits.append(settings.timeout_seconds)
        if len(limits) == 1:
            return ProbeResult(
                status="timeout", message="probe exceeded its wall-clock timeout", environment=busy
            )
        return ProbeResult(status="ok", samples_per_sec=2.0, peak_memory_bytes=int(0.5 * GIB))

    return probe, limits


def test_a_hand_made_config_that_timed_out_on_a_busy_machine_gets_one_longer_try(tmp_path):
    """The gain rests on the hand-made config: a timeout while other work held the cores is not its
    verdict. Probed once more with twice the limit; the trial says so."""
    probe, limits = _timing_out_first(BUSY_TIMEOUT)
    tuner = make_tuner(tmp_path, probe)
    enqueue_seed_configs(tuner.study, tuner.space)
    trial = tuner.step()
    assert limits == [600.0, 1200.0] and trial.user_attrs["status"] == "ok"
    first = trial.user_attrs["first_try"]
    assert first["status"] == "timeout" and first["second_timeout_seconds"] == 1200.0
    assert "load average reached 8.5" in first["busy"]


def test_a_timeout_on_a_quiet_machine_or_of_a_searched_config_is_its_verdict(tmp_path):
    quiet = {"load": {"other_cores": None, "cores": 2, "load_1m_start": 1.0, "load_1m_end": 2.0}}
    probe, limits = _timing_out_first(quiet)
    tuner = make_tuner(tmp_path, probe)
    enqueue_seed_configs(tuner.study, tuner.space)
    assert tuner.step().user_attrs["status"] == "timeout" and limits == [600.0]
    probe, limits = _timing_out_first(BUSY_TIMEOUT)
    (tmp_path / "searched").mkdir()
    searched = make_tuner(tmp_path / "searched", probe)  # no hand-made config queued: the sampler's
    assert searched.step().user_attrs["status"] == "timeout" and limits == [600.0]
