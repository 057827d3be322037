"""Faults a long sweep meets, each ending in a classified status and a clear message, with every completed
measurement kept and `autotune report` still working: a probe SIGKILLed, a probe that hangs, the storage
away for a while or for good, the output folder full. (The tuner SIGKILLed mid-trial and restarted is in
test_run_e2e.py; bad storages and workers refused in one line, in test_cli_errors.py.)"""

from __future__ import annotations

import errno
import functools
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import psutil
import pytest

from autotune.cli import main
from autotune.errors import Unavailable
from autotune.probe.contract import ProbeSettings
from autotune.probe.launcher import run_probe
from autotune.report.write import write_report
from autotune.space.model import sample_config
from autotune.study.outage import PendingFile
from autotune.study.plan import StudyPlan
from autotune.study.storage import retrying
from autotune.study.trials import finished_trials, open_study, trial_status
from tests.conftest import QUICK_SPACE, REPO
from tests.test_study import BUDGET, FakeProbe, make_tuner

FAKES = Path(__file__).parent / "fake_runners"


# --- storage outages -------------------------------------------------------------------------------------


def test_retry_rides_out_a_short_outage_and_gives_up_with_a_redacted_message(caplog):
    calls, waits = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError("connection refused by postgresql://u:hunter2@db/x")
        return "done"

    assert retrying(flaky, "asking", "postgresql://u:hunter2@db/x", patience=60, sleep=waits.append) == "done"
    assert waits == [1.0, 2.0]  # doubling waits
    assert "retrying" in caplog.text and "hunter2" not in caplog.text

    def down():
        raise OSError("connection refused by postgresql://u:hunter2@db/x")

    with pytest.raises(Unavailable) as caught:
        retrying(
            down, "recording trial #3", "postgresql://u:hunter2@db/x", patience=0.5, sleep=lambda s: None
        )
    message = str(caught.value)
    assert "hunter2" not in message and "u:***@db" in message and "recording trial #3" in message
    assert caught.value.exit_code == 3
    ctrl_c = threading.Event()
    ctrl_c.set()  # a second Ctrl-C: no waiting out the patience
    started = time.monotonic()
    with pytest.raises(Unavailable):
        retrying(down, "asking", "sqlite:///x.db", patience=300, cancel=ctrl_c)
    assert time.monotonic() - started < 5


class StorageOutage:
    """A probe that takes the journal's folder away while it runs, and brings it back after `away_for` s."""

    def __init__(self, folder: Path, away_for: float):
        self.folder, self.away_for, self.probe = folder, away_for, FakeProbe()
        self.hidden = folder.with_name("hidden")
        self.timer: threading.Timer | None = None

    def __call__(self, config, settings, cancel=None):
        if self.folder.exists():
            self.folder.rename(self.hidden)
            self.timer = threading.Timer(self.away_for, self.bring_back)
            self.timer.start()
        return self.probe(config, settings, cancel)

    def bring_back(self) -> None:
        """The folder back now (the timer's end, or a test that has seen what it waited for)."""
        if self.timer is not None:
            self.timer.cancel()
        if self.hidden.exists():
            self.hidden.rename(self.folder)


def _journal_tuner(tmp_path: Path, probe, patience: float):
    folder = tmp_path / "store"
    folder.mkdir(exist_ok=True)
    tuner = make_tuner(tmp_path, probe, storage=f"journal:{folder / 'study.journal'}")
    tuner.patience, tuner.pending = patience, PendingFile(tmp_path / "out" / "pending.jsonl")
    tuner.storage_url = f"journal:{folder / 'study.journal'}"
    return tuner, folder


def test_storage_away_for_a_while_is_ridden_out(tmp_path):
    tuner, folder = _journal_tuner(tmp_path, None, patience=60)
    tuner.probe = StorageOutage(folder, away_for=0.5)  # back before the first retry (1 s)
    trial = tuner.step()
    assert trial.state.name == "COMPLETE" and trial_status(trial) in ("ok", "oom")
    assert not tuner.pending.path.exists()


def test_storage_away_for_good_keeps_the_measurement_and_the_next_run_records_it(tmp_path):
    # patience 0.5 s: the tuner gives up before its first retry (1 s)
    tuner, folder = _journal_tuner(tmp_path, FakeProbe(), patience=0.5)
    tuner.step()  # one trial recorded while the storage is there
    outage = StorageOutage(folder, away_for=60.0)  # away for longer than the tuner's patience
    tuner.probe = outage
    with pytest.raises(Unavailable, match=r"unreachable while recording trial #1.*kept in .*pending\.jsonl"):
        tuner.step()
    assert len(outage.probe.launched) == 1 and not folder.exists()  # it gave up while the storage was away
    outage.bring_back()  # back after the tuner gave up: no need to wait out the outage
    # the next run: a fresh tuner on the same storage records the kept measurement without probing again
    again, _ = _journal_tuner(tmp_path, FakeProbe(), patience=60)
    assert again.replay_pending(tuner.pending.path).trials == [1]
    late = again.study.trials[1]
    assert late.state.name == "COMPLETE" and late.user_attrs["recorded_late"] and again.probe.launched == []
    assert len(finished_trials(again.study)) == 2 and not tuner.pending.path.exists()
    assert write_report(again.study, tmp_path / "report", BUDGET).files


def test_a_kept_measurement_whose_trial_was_failed_meanwhile_comes_back_as_a_new_trial(tmp_path):
    tuner, _ = _journal_tuner(tmp_path, FakeProbe(), patience=60)
    trial = tuner.study.ask()
    config = sample_config(tuner.space, trial)
    tuner.pending.keep(trial.number, trial.params, tuner.decide(config))
    tuner.study.tell(trial, state=optuna.trial.TrialState.FAIL)  # another worker's sweep got there first
    assert tuner.replay_pending().trials == [0]
    recorded = tuner.step()
    assert recorded.user_attrs["replay_of"] == 0 and recorded.user_attrs["config"] == config.to_dict()
    assert len(tuner.probe.launched) == 1  # only the original probe


# --- probes that die or hang ------------------------------------------------------------------------------


@pytest.mark.e2e
def test_hung_probe_is_recorded_as_timeout_and_the_study_reports(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_PIDS_FILE", str(tmp_path / "pids.txt"))
    hang = functools.partial(run_probe, program=FAKES / "hang.py")
    tuner = make_tuner(tmp_path, hang)
    tuner.settings = ProbeSettings(timeout_seconds=2)
    tuner.prune = False
    trial = tuner.step()
    assert trial_status(trial) == "timeout" and trial.state.name == "COMPLETE"
    assert trial.user_attrs["result"]["message"].startswith("probe exceeded its wall-clock timeout")
    result = write_report(tuner.study, tmp_path / "report", BUDGET)
    assert not result.ok and (tmp_path / "report" / "trials.csv").exists()


def _probe_ranks(tuner_pid: int) -> list[psutil.Process]:
    """The probe's rank processes: children of the fork server, or spawned ppo_probe.py processes."""
    ranks = []
    for proc in psutil.Process(tuner_pid).children(recursive=True):
        try:
            parent = proc.parent()
            if "fork_server.py" in " ".join(parent.cmdline()) or "ppo_probe.py" in " ".join(proc.cmdline()):
                ranks.append(proc)
        except psutil.Error:
            continue
    return ranks


@pytest.mark.e2e
def test_probe_killed_by_sigkill_is_crashed_and_the_run_goes_on(tmp_path, capsys):
    command = [sys.executable, "-m", "autotune", "run", "--space", QUICK_SPACE, "--device", "cpu"]
    command += ["--trials", "3", "--out", str(tmp_path), "--study", "killed-probe", "--gain-rounds", "0"]
    tuner = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (ranks := _probe_ranks(tuner.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ranks, "no probe rank appeared"
        os.kill(ranks[0].pid, signal.SIGKILL)
        output = tuner.communicate(timeout=600)[0]
    finally:
        tuner.kill()
    assert tuner.returncode in (0, 1), output[-3000:]
    study = optuna.load_study(
        study_name="killed-probe", storage=f"sqlite:///{tmp_path / 'killed-probe' / 'study.db'}"
    )
    crashed = [t for t in study.trials if trial_status(t) == "crashed"]
    assert len(crashed) == 1 and "SIGKILL" in crashed[0].user_attrs["result"]["message"]
    assert len(finished_trials(study)) == 3  # the run went on to its trial count
    capsys.readouterr()
    assert main(["report", "--study", "killed-probe", "--out", str(tmp_path)]) in (0, 1)
    assert "report.html" in capsys.readouterr().out


# --- the output folder --------------------------------------------------------------------------------------


def _study_with_trials(tmp_path: Path) -> str:
    tuner = make_tuner(tmp_path, FakeProbe())
    StudyPlan.of(tuner.space, tuner.settings, BUDGET, trials=4).save(tuner.study)
    for _ in range(4):
        tuner.step()
    return f"sqlite:///{tmp_path / 'study.db'}"


def test_full_output_folder_is_one_line_exit_3_and_keeps_the_last_report(tmp_path, monkeypatch, capsys):
    storage = _study_with_trials(tmp_path)
    out = tmp_path / "reports"
    assert main(["report", "--study", "t", "--storage", storage, "--out", str(out)]) in (0, 1)
    before = {p.name: p.read_bytes() for p in (out / "t").iterdir()}
    real_write = pathlib.Path.write_text

    def disk_full(self, *args, **kwargs):
        if self.name.endswith(".partial"):
            real_write(self, "half a fi", encoding="utf-8")  # what a full disk leaves behind
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", disk_full)
    capsys.readouterr()
    assert main(["report", "--study", "t", "--storage", storage, "--out", str(out)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left on device" in err and "study is intact" in err
    assert {p.name: p.read_bytes() for p in (out / "t").iterdir()} == before  # no truncated file
    monkeypatch.undo()
    assert main(["report", "--study", "t", "--storage", storage, "--out", str(tmp_path / "other")]) in (0, 1)
    study = open_study(storage, "t", None, create=False)
    assert len(finished_trials(study)) == 4


def test_output_folder_that_is_a_file_is_a_user_error(tmp_path, capsys):
    storage = _study_with_trials(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    assert main(["report", "--study", "t", "--storage", storage, "--out", str(blocker)]) == 2
    assert "cannot create" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "unused", ignore_errors=True)


@pytest.mark.parametrize(
    ("parent_now", "expected", "exits"),
    [
        (4242, "4242", False),  # its parent is alive
        (1, "", True),  # orphaned to init before prctl took effect
        (777, "4242", True),  # orphaned to a subreaper (Ray's raylet, a container's init)
        (777, "", False),  # no parent named: only pid 1 tells
    ],
)
def test_a_rank_whose_parent_died_before_prctl_exits(monkeypatch, parent_now, expected, exits):
    import ctypes

    from autotune.probe.contract import PARENT_VARIABLE
    from autotune.probe.rank import process

    class Exited(Exception):
        pass

    def exit_now(code: int) -> None:
        raise Exited(code)

    class Libc:  # prctl itself would set this test process's own death signal
        @staticmethod
        def prctl(*args: object) -> int:
            return 0

    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: Libc())
    monkeypatch.setattr(os, "getppid", lambda: parent_now)
    monkeypatch.setattr(os, "_exit", exit_now)
    monkeypatch.setenv(PARENT_VARIABLE, expected)
    if exits:
        with pytest.raises(Exited):
            process.die_with_parent()
    else:
        process.die_with_parent()
