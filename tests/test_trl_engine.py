"""`--engine trl` and `--target trl` through the real CLI: TRL's own GRPOTrainer probes, and the exported
trl_config.yaml is trained by TRL itself (`trl grpo`), as the report says to launch it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, probe_json, run_cli

pytestmark = pytest.mark.e2e

TRL_SPACE = str(REPO / "tests" / "data" / "trl_quick_space.yaml")
RECIPE = [
    *("--set", "algorithm=grpo", "--set", "rollout_n=4", "--set", "train_batch_size=8"),
    *("--set", "mini_batch_size=4", "--set", "micro_batch_size=2", "--set", "max_prompt_length=16"),
    *("--set", "max_response_length=8"),
]
REWARD = "def reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n"


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """tiny-llama with random weights and autotune's tokenizer, saved as a user's local model folder."""
    from autotune.models.registry import build_causal_lm, resolve_model
    from autotune.models.tokenizer import load_tokenizer

    folder = tmp_path_factory.mktemp("tiny-llama")
    spec = resolve_model("tiny-llama")
    build_causal_lm(spec, dtype="float32").save_pretrained(folder)
    load_tokenizer(spec).save_pretrained(folder)
    return folder


def test_a_trl_study_exports_a_config_that_trl_trains(model_folder, tmp_path):
    out = tmp_path / "reports"
    run = run_cli(
        "run",
        *("--engine", "trl", "--target", "trl", "--space", TRL_SPACE, "--device", "cpu"),
        *("--model", str(model_folder), "--weights", "pretrained", "--trials", "6", "--gain-rounds", "0"),
        *("--out", str(out), "--json"),
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    export = Path(summary["launch"].split("--config ")[1].split()[0])
    assert export.name == "trl_config.yaml" and not (export.parent / "verl_overrides.txt").exists()
    assert f"model_name_or_path: {model_folder}" in export.read_text()
    assert summary["recommended"]["config"]["algorithm"] == "grpo"

    # `autotune check` reads the export back
    check = run_cli("check", str(export))
    assert check.returncode == 0, check.stdout + check.stderr

    # TRL trains it, launched as the report says, with the user's parts filled in
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"count the words in sentence number {i} please"} for i in range(32)]
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "my_rewards.py").write_text(REWARD)
    launch = summary["launch"].replace("/path/to/dataset", str(data))
    launch = launch.replace("your_module.your_reward", "my_rewards.reward")
    argv = shlex.split(launch)
    assert argv[:2] == ["trl", "grpo"]
    trl = Path(sys.executable).with_name("trl")
    extra = ["--max_steps", "2", "--output_dir", str(tmp_path / "trl-out"), "--report_to", "none"]
    trained = subprocess.run(
        [str(trl), *argv[1:], *extra, "--save_strategy", "no", "--logging_steps", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"},
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "'train_runtime'" in trained.stdout + trained.stderr
    assert "'step_time'" in trained.stdout + trained.stderr


def test_two_trl_ranks_train_as_one_job():
    code, result = probe_json("--engine", "trl", "--gpus", "2", *RECIPE, timeout=600)
    assert code == 0 and result["status"] == "ok", result.get("message")
    assert result["environment"]["processes"] == 2  # TRL's own world size, not two separate trainings
    assert len(result["rank_peaks"]) == 2 and result["samples_per_sec"] > 0
    # 1 warm-up and 2 measured rounds, each of train 8 / mini 4 = 2 optimizer steps (m=2 on 2 ranks)
    assert len(result["environment"]["step_seconds"]) == 6


def test_a_trl_probe_over_its_budget_is_an_emulated_oom():
    code, result = probe_json("--engine", "trl", "--memory-budget", "0.1", "--iterations", "1", *RECIPE)
    assert code == 1 and result["status"] == "oom" and result["oom_kind"] == "emulated", result.get("message")


def test_a_trl_probe_that_crashes_is_a_crash(model_folder, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in model_folder.iterdir():
        target = broken / item.name
        target.write_bytes(b"not weights" if item.suffix == ".safetensors" else item.read_bytes())
    code, result = probe_json(
        "--engine", "trl", "--model", str(broken), "--weights", "pretrained", "--iterations", "1", *RECIPE
    )
    assert code == 1 and result["status"] == "crashed", result.get("message")
    assert "safetensors" in result["stderr_tail"].lower() or "error" in result["stderr_tail"].lower()


def test_a_trl_python_that_cannot_run_trl_is_one_line_and_exit_2(tmp_path):
    proc = run_cli("probe", "--engine", "trl", "--trl-python", str(tmp_path / "nope"), *RECIPE)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "--trl-python" in proc.stderr
