"""`--engine verl` end to end on a CPU machine, with the stand-in verl of tests/fake_verl (real verl
refuses to run PPO without GPUs): the real backend launches `python -m verl.trainer.main_ppo`, reads what
verl's formats say, classifies its failures, kills what it leaves behind, and `autotune run --engine verl`
completes a study. What this does not check — verl's and vLLM's real figures on a GPU — is
bench/verl_check.py's job."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.e2e
STAND_IN = REPO / "tests" / "fake_verl"


def autotune(*args: str, script: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
    """The real command line with the stand-in verl importable (and its script, if any)."""
    return run_cli(*args, timeout=timeout, env={"PYTHONPATH": str(STAND_IN), "AUTOTUNE_FAKE_VERL": script})


def probe(*args: str, script: str = "") -> tuple[int, dict]:
    proc = autotune(
        "probe",
        "--engine",
        "verl",
        "--verl-python",
        sys.executable,
        "--device",
        "cpu",
        "--json",
        *args,
        script=script,
    )
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


def test_a_verl_probe_reads_the_steps_after_the_warm_up():
    code, result = probe(
        "--iterations", "2", "--set", "micro_batch_size=2", "--set", "gradient_accumulation_steps=4"
    )
    assert code == 0 and result["status"] == "ok", result
    assert result["environment"]["engine"] == "verl" and result["environment"]["steps_seen"] == 3
    assert result["samples_per_sec"] > 0 and set(result["phase_seconds"]) >= {"rollout", "scoring", "update"}
    assert result["peak_memory_source"] == "verl-allocator" and result["peak_memory_bytes"] > 0
    assert result["environment"]["load"]["load_1m_start"] is not None  # the conditions, as the built-in's


def test_an_oom_inside_ray_is_an_oom():
    code, result = probe(
        "--set",
        "micro_batch_size=8",
        "--set",
        "gradient_accumulation_steps=1",
        "--set",
        "max_prompt_length=64",
    )
    assert code == 1 and result["status"] == "oom" and result["oom_kind"] == "cuda_update", result
    assert "update_actor" in result["message"]


def test_a_hung_run_times_out_and_leaves_no_process_behind():
    code, result = probe("--timeout", "5", script="hang")
    assert code == 1 and result["status"] == "timeout", result
    left = subprocess.run(["pgrep", "-f", "time.sleep\\(3600\\)"], capture_output=True, text=True)
    assert left.stdout.strip() == "", "the stand-in's child outlived the probe"


@pytest.mark.parametrize(
    ("script", "said"),
    [("exit0-missing", "verl exited 0 after 1 of 3 steps"), ("gpus0", "verl found 0 GPUs")],
)
def test_a_run_that_ends_without_its_steps_is_a_crash(script, said):
    code, result = probe(script=script)
    assert code == 1 and result["status"] == "crashed" and said in result["message"], result


def test_a_wrong_verl_python_is_one_line_and_exit_2(tmp_path):
    proc = autotune("probe", "--engine", "verl", "--verl-python", str(tmp_path / "nope"))
    assert (
        proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--verl-python" in proc.stderr
    )
    missing = autotune("run", "--engine", "verl", "--space", "cpu-tiny", "--out", str(tmp_path))
    assert missing.returncode == 2 and "needs --verl-python" in missing.stderr


def test_autotune_run_with_the_verl_engine_completes_a_study(tmp_path):
    proc = autotune(
        "run",
        "--engine",
        "verl",
        "--verl-python",
        sys.executable,
        "--space",
        "cpu-tiny",
        "--trials",
        "5",
        "--device",
        "cpu",
        "--out",
        str(tmp_path),
        "--json",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["recommended"]["samples_per_sec"] > 0 and summary["launch"]
    assert "probing with verl 0.9.1" in proc.stderr
    folder = next(tmp_path.glob("cpu-tiny-*"))
    assert (folder / "report.html").is_file() and (folder / "best_config.yaml").is_file()
    # The export is the job verl ran: verl's default share (the probe sets none), not a rule sized on its peak
    overrides = (folder / "verl_overrides.txt").read_text()
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.5" in overrides
    assert "Measured by verl itself (--engine verl)" in (folder / "report.md").read_text()
