"""Bad input to every command is one line on stderr and exit code 2, before any work starts: a probe, a
study, a database. The CLI's entry point runs in this process (`cli_here`): nothing here starts a process,
which the fast tier enforces, so each case costs milliseconds instead of an interpreter's start.
(`test_cli_small.py` and each command's e2e tests run the real command line as a process.)"""

from __future__ import annotations

import optuna
import pytest

from autotune.study.trials import open_study
from tests.conftest import REPO

SECRET_URL = "postgresql+psycopg2://tuner:s3cret-pw@127.0.0.1:1/nowhere"  # nothing listens on port 1
TRL_RECIPE = [
    *("--set", "algorithm=grpo", "--set", "rollout_n=4", "--set", "train_batch_size=8"),
    *("--set", "mini_batch_size=4", "--set", "micro_batch_size=2", "--set", "max_prompt_length=16"),
    *("--set", "max_response_length=8"),
]


def one_line(proc, fragment: str) -> str:
    assert proc.returncode == 2, (proc.args, proc.stdout[-1000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], (proc.args, proc.stderr)
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--set", "batch=4"], "unknown knob"),
        (["--set", "micro_batch_size"], "expected KNOB=VALUE"),
        (
            ["--set", "train_batch_size=300", "--set", "rollout_batch_size=128"],
            "samples and trains on 300",
        ),
        (["--model", "llama-3-70b"], "unknown model"),
        (["--model", "/nonexistent/model/dir"], "/nonexistent/model/dir"),
        (["--device", "cuda", "--gpus", "2"], "--gpus 2"),
        (["--memory-budget", "-1"], "--memory-budget"),
        (
            ["--device", "cpu", "--set", "sharding=full_shard", "--set", "param_offload=true"],
            "param_offload=true on CPU",
        ),
        (
            ["--device", "cpu", "--set", "sharding=full_shard", "--set", "optimizer_offload=true"],
            "optimizer_offload=true on CPU",
        ),
        (["--device", "cpu", "--set", "optimizer_offload=true"], "offload is FSDP's"),
        (["--device", "cpu", "--set", "sharding=zero3"], "sharding=zero3: unknown"),
    ],
)
def test_bad_input_to_probe(cli_here, args, fragment):
    one_line(cli_here("probe", "--model", "tiny-llama", *args), fragment)


def test_bad_input_to_run_is_one_line_per_problem(cli_here, tmp_path):
    other = tmp_path / "other.db"
    optuna.create_study(storage=f"sqlite:///{other}", study_name="taken", directions=["minimize"])
    cases = [
        (["--space", "no-such-space"], "no-such-space", 1),
        (["--space", str(REPO / "tests" / "data" / "invalid_space.yaml")], "invalid_space.yaml", None),
        (["--space", "cpu-tiny", "--storage", "nosuchdb://u:hunter2@h/db"], "--storage", 1),
        (["--space", "cpu-tiny", "--storage", f"sqlite:///{other}", "--study", "taken"], "taken", 1),
        (["--space", "cpu-tiny", "--model", "llama-2-13b", "--memory-budget", "8"], "--memory-budget 8", 1),
        (["--space", "cpu-tiny", "--time-budget", "soon"], "--time-budget", 1),
    ]
    for args, fragment, lines in cases:
        proc = cli_here("run", "--device", "cpu", "--out", str(tmp_path), *args)
        assert proc.returncode == 2, (args, proc.stdout[-1000:], proc.stderr[-2000:])
        errors = proc.stderr.strip().splitlines()
        assert "Traceback" not in proc.stderr and fragment in proc.stderr, (args, proc.stderr)
        assert "hunter2" not in proc.stderr + proc.stdout
        if lines is not None:
            assert len(errors) == lines, (args, proc.stderr)
        else:
            assert len(errors) >= 5  # every mistake in the file, one line each
    assert optuna.load_study(study_name="taken", storage=f"sqlite:///{other}").directions  # untouched


def test_report_of_a_missing_study(cli_here, tmp_path):
    one_line(cli_here("report", "--study", "nope", "--out", str(tmp_path)), "nope")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["run", "--space", "cpu-tiny", "--device", "cpu", "--storage", SECRET_URL], "cannot open it"),
        (["worker", "--study", "s", "--device", "cpu", "--storage", SECRET_URL], "cannot open it"),
        (["worker", "--study", "s", "--storage", "sqlite:///x.db"], "SQLite is not safe"),
        (
            ["run", "--space", "cpu-tiny", "--parallel", "2", "--storage", "sqlite:///x.db"],
            "SQLite is not safe",
        ),
    ],
)
def test_bad_storage_never_shows_the_password(cli_here, tmp_path, args, fragment):
    proc = cli_here(*args, "--out", str(tmp_path))
    one_line(proc, fragment)
    assert "s3cret-pw" not in proc.stdout + proc.stderr


def test_worker_needs_a_study_started_by_run(cli_here, tmp_path):
    journal = f"journal:{tmp_path / 'study.journal'}"
    open_study(journal, "bare", None)  # a study, but no probe plan
    proc = cli_here("worker", "--study", "bare", "--storage", journal, "--device", "cpu")
    one_line(proc, "was not started by `autotune run`")


def test_a_recipe_trl_cannot_train_is_refused_before_trl_starts(cli_here):
    one_line(
        cli_here("probe", "--engine", "trl", *TRL_RECIPE, "--set", "algorithm=ppo"), "GRPOTrainer trains GRPO"
    )
