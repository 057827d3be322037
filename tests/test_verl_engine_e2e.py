"""`--engine verl` end to end on a CPU machine, with the stand-in verl of tests/fake_verl (real verl
refuses to run PPO without GPUs): the real backend launches `python -m verl.trainer.main_ppo`, reads what
verl's formats say, classifies its failures, kills what it leaves behind, and `autotune run --engine verl`
completes a study. What this does not check — verl's and vLLM's real figures on a GPU — is
bench/verl_check.py's job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.e2e
STAND_IN = REPO / "tests" / "fake_verl"


def autotune(
    *args: str, script: str = "", timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """The real command line with the stand-in verl importable (and its script, if any)."""
    stand_in = {"PYTHONPATH": str(STAND_IN), "AUTOTUNE_FAKE_VERL": script}
    return run_cli(*args, timeout=timeout, env={**stand_in, **(env or {})})


def probe(*args: str, script: str = "", env: dict | None = None) -> tuple[int, dict]:
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
        env=env,
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
    assert result["peak_memory_source"] == "verl-actor-rss" and result["peak_memory_bytes"] > 0  # on CPU
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


def test_a_failed_generation_stops_as_a_crash_not_as_ok():
    """verl 0.9.1, sync_refill_failed_groups off (the probe pins it), pads the failed generation's samples and
    finishes its steps: not a measurement of the configuration."""
    code, result = probe(script="gen-fail")
    assert code == 1 and result["status"] == "crashed", result
    assert result["message"].startswith("verl: a generation failed, so its step would not train on every")
    assert "ValueError: the stand-in's generation failed" in result["message"]


@pytest.mark.parametrize(
    ("script", "status", "kind"),
    [("gen-fail,stuck", "crashed", None), ("gen-fail,stuck,oom", "oom", "cuda_rollout")],
)
def test_a_generation_refilled_without_end_is_stopped_and_classified(script, status, kind):
    """A sampler that refills the failed prompts forever (replay_buffer.py:465-467) would run to the probe's
    timeout; the backend stops it a few seconds after verl's first report of the failure."""
    code, result = probe("--timeout-per-probe", "120", script=script)
    assert code == 1 and (result["status"], result["oom_kind"]) == (status, kind), result
    assert result["wall_seconds"] < 60 and result["environment"]["stopped"] == "a generation failed"
    if kind:
        assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB" in result["message"]


def fake_cluster(tmp_path: Path) -> Path:
    """A `ray start` cluster's address file where Ray looks for it: $RAY_TMPDIR/ray/ray_current_cluster
    (ray/_common/utils.py:327-349), never the real /tmp/ray. Nothing answers at the address."""
    recorded = tmp_path / "raytmp" / "ray" / "ray_current_cluster"
    recorded.parent.mkdir(parents=True)
    recorded.write_text("127.0.0.1:6379")
    return tmp_path / "raytmp"


def test_the_stand_in_joins_a_recorded_cluster_as_ray_init_does(tmp_path):
    """The control: without an address, ray.init (here the stand-in's) joins the cluster the file names."""
    env = {**os.environ, "PYTHONPATH": str(STAND_IN), "RAY_TMPDIR": str(fake_cluster(tmp_path))}
    env.pop("RAY_ADDRESS", None)
    argv = [sys.executable, "-m", "verl.trainer.main_ppo", "data.train_files=none"]
    joined = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert joined.returncode == 1
    assert "Connecting to existing Ray cluster at address: 127.0.0.1:6379" in joined.stdout
    local = subprocess.run(
        [*argv, "+ray_kwargs.ray_init.address=local"], capture_output=True, text=True, env=env, timeout=60
    )
    assert "Connecting to existing" not in local.stdout  # it went on (to fail on the missing data file)


def test_a_probe_starts_its_own_ray_and_never_joins_one(tmp_path):
    ray_tmpdir = fake_cluster(tmp_path)
    env = {"RAY_TMPDIR": str(ray_tmpdir), "RAY_ADDRESS": "127.0.0.1:6379"}
    code, result = probe(env=env)
    assert code == 0 and result["status"] == "ok", result
    # its Ray lived in the probe's folder: nothing written beside the cluster's address file
    assert sorted(p.name for p in (ray_tmpdir / "ray").iterdir()) == ["ray_current_cluster"]


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
