"""verl itself as the referee on this machine: verl 0.9.1's own trainer (`python -m verl.trainer.main_ppo`, in
.venv-verl) runs on CPU through autotune's plugin (runners/verl_cpu/, autotune/probe/verl/cpu.py). One test
probes with it as a user does (`autotune probe --engine verl --device cpu`); one trains the verl_overrides.txt
autotune exports for two steps, started by the export's own launch line. Each is one verl run, about a
minute and a half on two cores: the slowest tests of the suite, and the only ones where verl trains."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from autotune.config.knobs import ProbeConfig
from autotune.formats.verl import format_value
from autotune.probe.verl.cpu import cpu_environment, cpu_overrides
from autotune.probe.verl.dataset import write_dataset
from autotune.probe.verl.verl_run import METRICS_FILE, TRAIN_FILE, short_run_overrides
from autotune.trainers.export import ExportJob
from autotune.trainers.verl.verl_trainer import VERL
from tests.conftest import REPO, VERL_PYTHON, run_cli
from tools.model_dir import write_model_dir

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.first,  # mostly Ray's and verl's start-up: the suite runs beside it
    pytest.mark.cores(2),  # verl's 30-odd processes on one pinned core would take half as long again
    pytest.mark.skipif(not VERL_PYTHON.exists(), reason="verl's environment: ./setup.sh test"),
]
# GRPO with a KL loss: the actor, its reference (verl's forward-only engine) and the rollout all run
JOB = {"train_batch_size": 4, "rollout_batch_size": 4, "micro_batch_size": 2, "algorithm": "grpo"}
JOB |= {"rollout_n": 2, "max_prompt_length": 32, "max_response_length": 16}
REWARD = REPO / "tests" / "fixtures" / "verl_cpu_reward.py"  # varies between samples: the update trains


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_model_dir("tiny-llama", tmp_path_factory.mktemp("tiny-llama"), weights=True)


def test_a_verl_probe_on_cpu_reports_what_verl_logged():
    """A registry test model: the probe writes it as a folder with random weights for verl to load."""
    sets = [arg for key, value in JOB.items() for arg in ("--set", f"{key}={value}")]
    proc = run_cli(
        *("probe", "--engine", "verl", "--device", "cpu", "--verl-python", str(VERL_PYTHON)),
        *("--model", "tiny-llama", "--warmup", "1", "--iterations", "1", "--json", *sets),
        timeout=600,
    )
    assert proc.stdout.strip(), proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert proc.returncode == 0 and result["status"] == "ok", result.get("stderr_tail", "")[-3000:]
    assert result["environment"]["steps_seen"] == 2  # the warm-up step and the measured one
    # verl's own timing_s/* of the measured step, by phase, and its actor worker's peak memory
    assert {"rollout", "scoring", "update"} <= set(result["phase_seconds"])
    assert result["samples_per_sec"] > 0 and result["iteration_seconds"] > 0
    assert result["peak_memory_source"] == "verl-actor-rss" and result["peak_memory_bytes"] > 0


@pytest.fixture
def run_dir():
    """A short folder: Ray's Unix sockets live under it, and a socket's path holds at most 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="verl-", dir="/tmp") as folder:
        yield Path(folder)


def test_verl_trains_the_exported_overrides_for_two_steps_on_cpu(model, tmp_path, run_dir):
    config = ProbeConfig(**JOB)
    export = VERL.export(ExportJob(config, str(model), "function", gpus=1, measured={}, device="cpu"))
    exported = tmp_path / VERL.export_file
    exported.write_text(export.text)
    write_dataset(run_dir / TRAIN_FILE, config.train_batch_size // config.rollout_n, config.max_prompt_length)
    train = str(run_dir / TRAIN_FILE)
    line = VERL.launch_line(str(exported), 1, export.launch_values, "function")
    places = {"/path/to/train.parquet": train, "/path/to/val.parquet": train, "/path/to/model": str(model)}
    for placeholder, value in {**places, "python -m verl.": f"{VERL_PYTHON} -m verl."}.items():
        line = line.replace(placeholder, value)
    # on this machine: two steps, verl's CPU plugin, a reward that varies
    extra = {**short_run_overrides(2, run_dir), **cpu_overrides(1)}
    extra["reward.custom_reward_function.path"] = str(REWARD)
    line += "".join(f" '{key}={format_value(value)}'" for key, value in extra.items())
    env = {**os.environ, **cpu_environment(os.environ.get("PYTHONPATH"))}
    proc = subprocess.run(
        ["bash", "-c", line], cwd=run_dir, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    steps = [json.loads(row) for row in (run_dir / METRICS_FILE).read_text().splitlines()]
    assert [step["step"] for step in steps] == [1, 2]
    for step in steps:
        data = step["data"]
        assert data["critic/score/mean"] > 0 and data["actor/grad_norm"] > 0  # a reward, and a gradient
        assert data["timing_s/step"] > 0 and data["actor/perf/max_memory_allocated_gb"] > 0
