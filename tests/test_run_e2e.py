"""`autotune run` through the real CLI on the quick test space (cpu-tiny's shape, probes of about 3 s):
statuses, resume after SIGKILL, Optuna's CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.cli import main
from autotune.config.knobs import ProbeConfig
from autotune.config.rules import config_findings
from autotune.status import Attr
from tests.conftest import QUICK_SPACE, REPO, run_cli, wait_for

pytestmark = pytest.mark.e2e
PRUNED = {"oom", "predicted_oom", "inferred_oom"}


def load(out: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{out / name / 'study.db'}")


def default_name(out: Path) -> str:
    """The study `run` named by default: space, model, GPUs and the fingerprint of what it measures."""
    (folder,) = out.glob("quick_space-tiny-llama-1gpu-*")
    assert re.fullmatch(r"quick_space-tiny-llama-1gpu-[0-9a-f]{8}", folder.name), folder.name
    return folder.name


@pytest.fixture(scope="module")
def twelve_trials(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    started = time.monotonic()
    proc = run_cli(
        "run",
        "--model",
        "tiny-llama",
        "--gpus",
        "1",
        "--space",
        QUICK_SPACE,
        "--trials",
        "12",
        "--out",
        str(out),
        "--device",
        "cpu",
        timeout=900,
    )
    return proc, out, time.monotonic() - started


def test_the_export_keeps_verls_defaults_without_a_measured_reason(twelve_trials):
    """The built-in probe's study: the vLLM share from the resident training states (at least verl's 0.5 on
    this emulated card, or the report says why not), worker keys at verl's defaults, and the report's table
    of the exported keys beside verl's defaults."""
    proc, out, _ = twelve_trials
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    folder = out / default_name(out)
    lines = dict(line.split("=", 1) for line in (folder / "verl_overrides.txt").read_text().splitlines())
    share = float(lines["actor_rollout_ref.rollout.gpu_memory_utilization"])
    report = (folder / "report.md").read_text()
    assert share >= 0.5 or "below verl's default 0.5" in report, share
    assert lines["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "1"
    assert lines["data.dataloader_num_workers"] == "8"  # verl's, not the probing machine's cores
    assert 1 <= int(lines["actor_rollout_ref.rollout.agent.num_workers"]) <= 8
    assert "## verl's keys beside verl's defaults" in report
    assert "| actor_rollout_ref.rollout.gpu_memory_utilization | " in report and "| 0.5 | memory" in report
    assert "| data.dataloader_num_workers | 8 | 8 | verl's default" in report
    best = yaml.safe_load((folder / "best_config.yaml").read_text())
    exported = best["verl_export"]["actor_rollout_ref.rollout.gpu_memory_utilization"]
    assert exported == {"value": share, "verl_default": 0.5, "why": exported["why"]}
    assert exported["why"].startswith("memory")


def test_twelve_trials_each_a_new_configuration_and_at_most_one_oom(twelve_trials):
    proc, out, seconds = twelve_trials
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = load(out, default_name(out))
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 12
    statuses = [t.user_attrs["status"] for t in complete]
    assert "ok" in statuses and set(statuses) <= {"ok", *PRUNED}, statuses
    assert statuses.count("oom") <= 1, statuses  # the sampler keeps probes within the memory model's budget
    configs = [str(sorted(t.user_attrs["config"].items())) for t in complete]
    assert len(set(configs)) == len(configs)  # the sampler never proposes a decided configuration again
    assert "Recommended: trial #" in proc.stdout and "memory model:" in proc.stdout
    trial_lines = [
        line
        for line in proc.stdout.splitlines()
        if re.match(r"#\d+ +(ok|oom|predicted_oom|inferred_oom) ", line)
    ]
    assert len(trial_lines) == 12, proc.stdout[-3000:]  # a line per finished trial, in a pipe too
    log = (out / default_name(out) / "run.log").read_text()
    assert all(line in log for line in trial_lines)  # and the same lines in the run's log
    print(f"12 trials in {seconds:.0f} s")  # the 10-minute bound is a benchmark figure, not a test


def test_run_writes_the_report_with_the_chosen_trials_figures(twelve_trials):
    _, out, _ = twelve_trials
    folder = out / default_name(out)
    for name in (
        "best_config.yaml",
        "verl_overrides.txt",
        "trials.csv",
        "report.md",
        "report.html",
        "run.log",
    ):
        assert (folder / name).is_file(), name
    summary = json.loads((folder / "summary.json").read_text())
    assert {"recommended", "gain", "files", "launch", "near_misses", "warnings", "run"} <= set(summary)
    assert all(Path(path).is_file() and Path(path).is_absolute() for path in summary["files"].values())
    best = yaml.safe_load((folder / "best_config.yaml").read_text())
    seed_keys = (
        "rollout_batch_size",
        "train_batch_size",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "num_rollout_workers",
        "max_prompt_length",
        "max_response_length",
        "actor_model_config",
    )
    assert all(key in best for key in seed_keys)
    knobs = {key: best[key] for key in seed_keys[:-1]}
    # for the training node: verl's 8 dataloader workers, not this machine's cores
    assert best["num_rollout_workers"] == 8
    assert config_findings(ProbeConfig(**knobs), best["measured"]["gpus"], cores=64) == []
    study = load(out, default_name(out))
    trial = study.trials[best["measured"]["trial_number"]]
    assert trial.user_attrs["status"] == "ok"
    remeasured = study.user_attrs.get("remeasured", {})
    if remeasured:  # the leaders were probed again: the pick is one of them, and the report shows them
        assert str(trial.number) in remeasured
        assert "## Re-measured before the pick" in (folder / "report.md").read_text()
    # The figures every file states: the mean of the config's measurements, the highest of their peaks.
    assert best["measured"]["samples_per_sec"] == summary["recommended"]["samples_per_sec"]
    assert best["measured"]["measurements"] == summary["recommended"]["measurements"] >= 1
    assert best["measured"]["peak_memory_bytes"] >= trial.values[1]
    probed = {key: knobs[key] for key in knobs if key != "num_rollout_workers"}  # the workers are verl's 8
    assert {key: trial.user_attrs["config"][key] for key in probed} == probed
    assert best["actor_model_config"]["model_name_or_path"] != "unknown"


def test_optunas_own_cli_reads_the_study(twelve_trials):
    _, out, _ = twelve_trials
    db = out / default_name(out) / "study.db"
    optuna_cli = Path(sys.executable).with_name("optuna")
    proc = subprocess.run(
        [
            str(optuna_cli),
            "trials",
            "--storage",
            f"sqlite:///{db}",
            "--study-name",
            default_name(out),
            "-f",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count('"number"') == 12


def _states(out: Path, name: str) -> list[str]:
    try:
        return [t.state.name for t in load(out, name).trials]
    except Exception:  # the file may not exist yet
        return []


def _probing(out: Path, name: str) -> bool:
    try:
        trials = load(out, name).trials
    except Exception:  # the file may not exist yet
        return False
    return any(t.state.name == "RUNNING" and Attr.CONFIG in t.user_attrs for t in trials)


def tuner_command(out: Path, name: str, trials: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "autotune",
        "run",
        "--space",
        QUICK_SPACE,
        "--trials",
        str(trials),
        "--gain-rounds",  # the back-to-back gain has its own tests (test_interrupt_e2e, test_live_and_gain)
        "0",
        "--out",
        str(out),
        "--study",
        name,
        "--device",
        "cpu",
    ]


def test_sigkill_mid_run_then_resume(tmp_path, capsys):
    name = "killed"
    command = tuner_command(tmp_path, name, trials=4)
    tuner = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # wait until one trial is complete and the next is being probed (claimed: its config is set, so
        # it has params to retry; a trial killed before sampling has nothing to retry)
        assert wait_for(
            lambda: _states(tmp_path, name).count("COMPLETE") >= 1 and _probing(tmp_path, name), 300
        )
    finally:
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.wait()
    before = load(tmp_path, name)
    kept = {t.number for t in before.trials if t.state.name == "COMPLETE"}
    assert kept

    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "recovered trials" in proc.stdout
    after = load(tmp_path, name)
    states = [t.state.name for t in after.trials]
    assert "RUNNING" not in states
    assert states.count("COMPLETE") == 4
    assert kept <= {t.number for t in after.trials if t.state.name == "COMPLETE"}
    interrupted = [t for t in after.trials if t.user_attrs.get("status") == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].state.name == "FAIL"
    retried = [t for t in after.trials if t.user_attrs.get("retry_of") == interrupted[0].number]
    assert len(retried) == 1
    capsys.readouterr()
    assert main(["report", "--study", name, "--out", str(tmp_path)]) in (0, 1)  # in this process: no start-up
    assert "report.html" in capsys.readouterr().out


@pytest.mark.parametrize(("signum", "said"), [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_ctrl_c_or_sigterm_finishes_the_running_probe_then_stops_with_the_report(tmp_path, signum, said):
    name = "interrupted"
    command = tuner_command(tmp_path, name, trials=5)
    out, err = tmp_path / "tuner.out", tmp_path / "tuner.err"  # files: a full pipe cannot block the tuner
    with out.open("w") as stdout_file, err.open("w") as stderr_file:
        tuner = subprocess.Popen(command, cwd=REPO, stdout=stdout_file, stderr=stderr_file, text=True)
        try:
            # run.log, not the study: reading an SQLite study while the tuner creates it races its setup
            log = tmp_path / name / "run.log"
            started = wait_for(
                lambda: (log.exists() and "#0   probing" in log.read_text()) or tuner.poll() is not None, 300
            )
            assert started and tuner.poll() is None, (tuner.poll(), out.read_text(), err.read_text()[-3000:])
            tuner.send_signal(signum)
            tuner.wait(timeout=300)
        finally:
            if tuner.poll() is None:
                tuner.kill()
    stdout = out.read_text()
    assert "finishing the running probe" in stdout and f"stopped by {said}" in stdout, (
        stdout,
        err.read_text(),
    )
    states = _states(tmp_path, name)
    assert states == ["COMPLETE"]  # the running probe finished and was recorded; nothing else started
    assert (tmp_path / name / "report.md").is_file()


def test_report_confirm_reprobes_the_winner(twelve_trials):
    _, out, _ = twelve_trials
    name = default_name(out)
    proc = run_cli(
        "report",
        "--study",
        name,
        "--out",
        str(out),
        "--confirm",
        "--confirm-iterations",
        "2",
        "--device",
        "cpu",
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "confirming trial #" in proc.stdout
    confirmations = load(out, name).user_attrs["confirmations"]
    assert confirmations and all(len(c["samples_per_sec"]) == 2 for c in confirmations.values())
    summary = json.loads((out / name / "summary.json").read_text())
    if "confirmed:" in proc.stdout:  # the confirmation's figures replace the headline in every file
        assert summary["recommended"]["basis"].startswith("confirmed")
        best = yaml.safe_load((out / name / "best_config.yaml").read_text())
        assert best["measured"]["samples_per_sec"] == summary["recommended"]["samples_per_sec"]
