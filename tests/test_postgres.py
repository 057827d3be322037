"""One study in a real PostgreSQL, shared by several processes (Optuna is the distributed engine).

The server comes from `./setup.sh test` (run as root: Debian's postgresql on 127.0.0.1) or from
$AUTOTUNE_TEST_POSTGRES; without either these tests skip and say so (see the `postgres_url` fixture).
"""

import json
import subprocess
import sys
import time

import optuna
import pytest
import sqlalchemy

from autotune.cli import main
from tests.conftest import QUICK_SPACE, REPO

pytestmark = pytest.mark.e2e  # starts processes

# One worker process: load the shared study and run its trials; each trial records the process that ran it.
WORKER = """
import os, sys, time
import optuna

url, name, n_trials, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
study = optuna.load_study(study_name=name, storage=url, sampler=optuna.samplers.RandomSampler(seed=seed))

def objective(trial):
    trial.set_user_attr("pid", os.getpid())
    time.sleep(0.05)  # let the workers' trials interleave
    return trial.suggest_float("x", -1.0, 1.0) ** 2

study.optimize(objective, n_trials=n_trials)
"""


def test_two_processes_share_one_study(postgres_url, study_name):
    optuna.create_study(study_name=study_name, storage=postgres_url, direction="minimize")
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, postgres_url, study_name, "3", str(seed)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    try:
        for proc in workers:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
    finally:
        for proc in workers:
            proc.kill()  # only those still running (a timeout or a failed assertion above)

    trials = optuna.load_study(study_name=study_name, storage=postgres_url).get_trials(deepcopy=False)
    assert [t.number for t in sorted(trials, key=lambda t: t.number)] == list(range(6))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials), [t.state for t in trials]
    assert {t.user_attrs["pid"] for t in trials} == {proc.pid for proc in workers}
    assert all(t.value == t.params["x"] ** 2 for t in trials)


def _autotune(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_plan(url: str, name: str, timeout: float = 300) -> None:
    """Until `autotune run` has created the study and stored its probe plan (workers need both)."""
    from autotune.status import StudyAttr

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if StudyAttr.PLAN in optuna.load_study(study_name=name, storage=url).user_attrs:
                return
        except KeyError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"study {name} never got its probe plan")


@pytest.mark.e2e
def test_three_autotune_workers_share_one_study(postgres_url, study_name, tmp_path, capsys):
    """`autotune run` plus two `autotune worker`s: every trial recorded once, none lost, the count exact."""
    trials = 6  # enough for each of the three processes to record some
    password = sqlalchemy.engine.make_url(postgres_url).password
    common = ["--study", study_name, "--storage", postgres_url]
    run = _autotune(
        "run",
        "--gain-rounds",  # the back-to-back gain has its own tests (test_interrupt_e2e, test_live_and_gain)
        "0",
        "--space",
        QUICK_SPACE,
        "--device",
        "cpu",
        "--trials",
        str(trials),
        "--out",
        str(tmp_path),
        *common,
    )
    workers = []
    try:
        _wait_for_plan(postgres_url, study_name)
        workers = [_autotune("worker", "--device", "cpu", "--out", str(tmp_path), *common) for _ in range(2)]
        outputs = [proc.communicate(timeout=900)[0] for proc in (run, *workers)]
    finally:
        for proc in (run, *workers):
            proc.kill()
    for proc, output in zip((run, *workers), outputs, strict=True):
        assert proc.returncode in (0, 1), output[-3000:]
        assert password not in output  # redacted in every message
    assert "joining study" in outputs[1]
    study = optuna.load_study(study_name=study_name, storage=postgres_url)
    all_trials = study.get_trials()
    complete = [t for t in all_trials if t.state.name == "COMPLETE"]
    assert len(complete) == trials
    # Only a worker that asked in the same instant as another may have stood down: nothing else failed.
    assert {t.user_attrs.get("status") for t in all_trials if t.state.name != "COMPLETE"} <= {"surplus"}
    measured = [
        json.dumps(t.user_attrs["config"], sort_keys=True)
        for t in complete
        if t.user_attrs["status"] in ("ok", "oom", "timeout") and "duplicate_of" not in t.user_attrs
    ]
    assert len(measured) == len(set(measured))  # no configuration probed twice
    pids = {proc.pid for proc in (run, *workers)}
    assert {t.user_attrs["tuner_pid"] for t in complete} <= pids  # every trial claimed by one of the three
    capsys.readouterr()
    assert main(["report", "--out", str(tmp_path), *common]) in (0, 1)  # in this process: no start-up
    said = capsys.readouterr()
    assert "report.html" in said.out and password not in said.out + said.err
