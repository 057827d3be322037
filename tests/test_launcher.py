"""The launcher survives hangs and crashes (fake probe programs; the real probe is tested end to end)."""

import os
import time
from pathlib import Path

import psutil
import pytest

from autotune.config.knobs import ProbeConfig
from autotune.probe.contract import ProbeSettings
from autotune.probe.launcher import run_probe, runner_path

FAKES = Path(__file__).parent / "fake_runners"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.e2e
def test_hang_ends_as_timeout_and_leaves_no_process(tmp_path, monkeypatch):
    pids_file = tmp_path / "pids.txt"
    monkeypatch.setenv("FAKE_PIDS_FILE", str(pids_file))
    started = time.monotonic()
    result = run_probe(
        ProbeConfig(), ProbeSettings(world_size=2, timeout_seconds=3), program=FAKES / "hang.py"
    )
    elapsed = time.monotonic() - started
    assert result.status == "timeout"
    assert elapsed < 3 + 10
    pids = [int(line) for line in pids_file.read_text().split()]
    assert len(pids) == 4  # two ranks, each with a child of its own
    time.sleep(0.2)
    assert not [pid for pid in pids if _alive(pid)]


@pytest.mark.e2e
def test_crash_ends_as_crashed_with_stderr_tail():
    result = run_probe(ProbeConfig(), ProbeSettings(timeout_seconds=30), program=FAKES / "crash.py")
    assert result.status == "crashed"
    assert "exit code 1" in result.message
    assert "probe exploded on purpose" in result.stderr_tail


def test_runner_program_ships_with_the_package():
    path = runner_path()
    assert path.name == "ppo_probe.py" and path.is_file()
    assert os.access(path, os.R_OK)
