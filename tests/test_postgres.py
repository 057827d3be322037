"""One study in a real PostgreSQL, shared by several processes (DESIGN §5: Optuna is the distributed engine).

The server comes from `./setup.sh test` (run as root: Debian's postgresql on 127.0.0.1) or from
$AUTOTUNE_TEST_POSTGRES; without either these tests skip and say so (see the `postgres_url` fixture).
"""

import subprocess
import sys

import optuna

from tests.conftest import REPO

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
