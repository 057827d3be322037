"""--parallel: disjoint probe slots, several writers on one study, exact counts, nothing measured twice."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import Counter

import optuna
import pytest

from autotune.errors import UserError
from autotune.probe.contract import ProbeSettings
from autotune.probe.launcher import _rank_env
from autotune.run.slots import oversubscribed, plan_slots, visible_device_ids
from autotune.space.model import config_to_params
from autotune.study.coordination import recover_stale_trials, retry_stale_trial
from autotune.study.storage import check_parallel_safe, default_storage_url, journal_path, make_storage
from autotune.study.trials import finished_trials
from tests.conftest import QUICK_SPACE, run_cli
from tests.test_study import FakeProbe, make_tuner


def test_cuda_slots_are_disjoint_sets_of_w_gpus():
    slots = plan_slots(2, 2, "cuda", gpus=["0", "1", "2", "3", "4"])
    assert [slot.devices for slot in slots] == [("0", "1"), ("2", "3")]
    env = _rank_env(1, slots[1].apply(ProbeSettings(device="cuda", world_size=2)), 29500)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["LOCAL_RANK"] == "1"


def test_too_few_gpus_for_the_slots_is_a_user_error():
    with pytest.raises(UserError, match=r"--parallel 3 with 2 GPU\(s\) per probe needs 6 GPUs, but 4"):
        plan_slots(3, 2, "cuda", gpus=["0", "1", "2", "3"])


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert visible_device_ids() == ["3", "5"]
    assert [s.devices for s in plan_slots(2, 1, "cuda")] == [("3",), ("5",)]


def test_cpu_slots_share_the_cores():
    slots = plan_slots(2, 1, "cpu", cores=8)
    assert [slot.threads for slot in slots] == [4, 4]
    env = _rank_env(0, slots[0].apply(ProbeSettings(device="cpu")), 29500)
    assert env["OMP_NUM_THREADS"] == "4"
    assert oversubscribed(plan_slots(3, 1, "cpu", cores=2), 1, cores=2)
    assert not oversubscribed(slots, 1, cores=8)


def test_sqlite_is_refused_for_several_writers_and_the_default_follows_parallel(tmp_path):
    with pytest.raises(UserError, match="SQLite is not safe for 2 concurrent probes"):
        check_parallel_safe("sqlite:///x.db", 2)
    check_parallel_safe("sqlite:///x.db", 1)
    assert default_storage_url(tmp_path, 1).startswith("sqlite:///")
    assert default_storage_url(tmp_path, 2) == f"journal:{(tmp_path / 'study.journal').resolve()}"
    (tmp_path / "study.journal").touch()  # an existing study file wins over the flag
    assert default_storage_url(tmp_path, 1).startswith("journal:")
    assert journal_path("journal:/a/b.journal").as_posix() == "/a/b.journal"
    assert journal_path("postgresql://h/db") is None


class SlowProbe(FakeProbe):
    """FakeProbe that takes a moment, so that threads overlap."""

    def __call__(self, config, settings, cancel=None):
        time.sleep(0.05)
        return super().__call__(config, settings, cancel)


def _run_threads(target, count: int) -> None:
    threads = [threading.Thread(target=target, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a slot never finished"


def _step_until_quota(tuner, quota: int) -> None:
    while tuner.step(quota=quota) is not None or len(finished_trials(tuner.study)) < quota:
        time.sleep(0.01)


def test_three_slots_record_exactly_the_quota_and_measure_nothing_twice(tmp_path):
    probe = SlowProbe()
    tuner = make_tuner(tmp_path, probe, storage=f"journal:{tmp_path / 'study.journal'}")
    _run_threads(lambda: _step_until_quota(tuner, 12), 3)
    trials = tuner.study.get_trials()
    assert Counter(t.state.name for t in trials) == {"COMPLETE": 12}
    launched = [json.dumps(c.to_dict(), sort_keys=True) for c in probe.launched]
    assert len(launched) == len(set(launched))


def test_a_config_being_probed_elsewhere_is_waited_for_not_probed_again(tmp_path):
    probe = SlowProbe()
    tuner = make_tuner(tmp_path, probe, storage=f"journal:{tmp_path / 'study.journal'}")
    params = config_to_params(tuner.space, tuner.space.grid()[0])
    tuner.study.enqueue_trial(params)
    tuner.study.enqueue_trial(params, skip_if_exists=False)
    _run_threads(lambda: tuner.step(), 2)
    first, second = tuner.study.get_trials()
    assert len(probe.launched) == 1
    assert second.user_attrs["duplicate_of"] == first.number and second.values == first.values


def test_a_worker_that_asked_too_late_stands_down(tmp_path):
    storage = f"journal:{tmp_path / 'study.journal'}"
    one, two = (
        make_tuner(tmp_path, FakeProbe(), storage=storage),
        make_tuner(tmp_path, FakeProbe(), storage=storage),
    )
    assert one.step(quota=1) is not None
    # `two` asks without the quota check (as a worker racing `one` would), then checks it
    trial = two.study.ask()
    assert two._claims.is_surplus(trial.number, 1) and not one._claims.is_surplus(0, 1)
    assert two.step(quota=1) is None  # quota reached: nothing asked


def test_heartbeat_that_goes_quiet_fails_the_trial_and_queues_it_again(tmp_path):
    url = f"sqlite:///{tmp_path / 'beat.db'}"
    storage = make_storage(url, heartbeat_seconds=1, grace_seconds=2, on_stale=retry_stale_trial)
    study = optuna.create_study(storage=storage, study_name="s", directions=["maximize", "minimize"])
    trial = study.ask()
    trial.suggest_int("x", 0, 3)
    trial.set_user_attr("host", "another-machine")  # not this host: only the heartbeat can tell
    trial.set_user_attr("tuner_pid", 1)
    study._storage.record_heartbeat(trial._trial_id)
    assert recover_stale_trials(study) == []  # beating recently
    # the last beat 10 s ago, past the grace period, as Optuna's own clock (the database's) reads it
    with sqlite3.connect(tmp_path / "beat.db") as db:
        db.execute("UPDATE trial_heartbeats SET heartbeat = datetime(heartbeat, '-10 seconds')")
    assert recover_stale_trials(study) == [0]
    assert study.trials[0].state.name == "FAIL"
    assert study.trials[1].state.name == "WAITING" and study.trials[1].user_attrs["retry_of"] == 0


@pytest.mark.e2e
def test_run_parallel_2_records_eight_trials_none_measured_twice(tmp_path):
    proc = run_cli(
        "run",
        "--gain-rounds",  # the back-to-back gain has its own tests (test_interrupt_e2e, test_live_and_gain)
        "0",
        "--model",
        "tiny-llama",
        "--space",
        QUICK_SPACE,
        "--trials",
        "8",
        "--parallel",
        "2",
        "--device",
        "cpu",
        "--out",
        str(tmp_path),
        "--study",
        "par",
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "2 probes at a time" in proc.stdout
    study = optuna.load_study(
        study_name="par", storage=make_storage(f"journal:{tmp_path / 'par' / 'study.journal'}")
    )
    trials = study.get_trials()
    assert Counter(t.state.name for t in trials) == {"COMPLETE": 8}
    measured = [
        json.dumps(t.user_attrs["config"], sort_keys=True)
        for t in trials
        if t.user_attrs["status"] in ("ok", "oom", "timeout") and "duplicate_of" not in t.user_attrs
    ]
    assert len(measured) == len(set(measured))
    assert (tmp_path / "par" / "trials.csv").exists()
    report = run_cli("report", "--study", "par", "--out", str(tmp_path))
    assert report.returncode in (0, 1) and "report.html" in report.stdout, report.stderr
