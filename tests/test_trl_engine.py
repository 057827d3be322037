"""`--engine trl` and `--target trl` through the real CLI: TRL's own GRPOTrainer probes, and the exported
trl_config.yaml is trained by TRL itself (`trl grpo`), as the report says to launch it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, probe_json, run_cli

pytestmark = pytest.mark.e2e

BUDGET_SPACE = str(REPO / "tests" / "data" / "trl_budget_space.yaml")
BUDGET_GIB = 1.2  # the space's memory_budget_gib
RECIPE = [
    *("--set", "algorithm=grpo", "--set", "rollout_n=4", "--set", "train_batch_size=8"),
    *("--set", "mini_batch_size=4", "--set", "micro_batch_size=2", "--set", "max_prompt_length=16"),
    *("--set", "max_response_length=8"),
]
REWARD = "def reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n"
# runs the command after it and prints the largest peak resident set among its processes (KiB)
PEAK_OF_CHILDREN = (
    "import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
    "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
)


def prompts_of(tokens: int, count: int) -> str:
    """train.jsonl of prompts of about `tokens` tokens, as the probes' (TRL 1.16 truncates none)."""
    from autotune.models.catalog import resolve_model
    from autotune.models.tokenizer import load_tokenizer
    from autotune.probe.rank.prompts import SyntheticPrompts

    tokenizer = load_tokenizer(resolve_model("tiny-llama"))
    texts = SyntheticPrompts(tokenizer, tokens, seed=1)
    rows = [{"prompt": tokenizer.decode(texts[i][:tokens])} for i in range(count)]
    return "".join(json.dumps(row) + "\n" for row in rows)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """tiny-llama with random weights and autotune's tokenizer, saved as a user's local model folder."""
    from autotune.models.catalog import build_causal_lm, resolve_model
    from autotune.models.tokenizer import load_tokenizer

    folder = tmp_path_factory.mktemp("tiny-llama")
    spec = resolve_model("tiny-llama")
    build_causal_lm(spec, dtype="float32").save_pretrained(folder)
    load_tokenizer(spec).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def budget_study(model_folder, tmp_path_factory) -> dict:
    """One study on the binding space, shared by the tests below: TRL's defaults (the hand-made config) peak
    over its 1.2 GiB budget, per_device_train_batch_size 4 and 2 fit. Four trials: the defaults, and three the
    sampler proposes (a larger one than an OOM is inferred, not probed)."""
    work = tmp_path_factory.mktemp("budget-study")
    out = work / "reports"
    run = run_cli(
        "run",
        *("--engine", "trl", "--target", "trl", "--space", BUDGET_SPACE, "--device", "cpu"),
        *("--model", str(model_folder), "--weights", "pretrained", "--trials", "4", "--gain-rounds", "0"),
        *("--out", str(out), "--json"),
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    export = Path(summary["launch"].split("--config ")[1].split()[0])
    return {"summary": summary, "export": export, "folder": export.parent, "work": work}


def test_the_binding_study_records_trls_defaults_as_an_emulated_oom(budget_study):
    trials = pd.read_csv(budget_study["folder"] / "trials.csv")
    seed = trials[trials["seed_config"].notna()].iloc[0]
    assert seed["status"] == "oom" and seed["oom_kind"] == "emulated", seed.to_dict()
    assert seed["micro_batch_size"] == 8 and bool(seed["gradient_checkpointing"])
    summary = budget_study["summary"]
    assert summary["recommended"]["config"]["micro_batch_size"] < 8
    assert summary["recommended"]["peak_memory_gib"] <= 0.9 * BUDGET_GIB
    best = yaml.safe_load((budget_study["folder"] / "best_config.yaml").read_text())
    assert "rollout_engine" not in best and "verl_export" not in best


def test_the_pick_trains_under_trl_grpo_within_the_budget(budget_study, model_folder):
    """TRL trains trl_config.yaml, launched as the report says, for two steps: its peak resident set (the
    largest of `trl grpo`'s processes) stays within the budget, and TRL warns of no deprecated field name."""
    summary, work = budget_study["summary"], budget_study["work"]
    export = budget_study["export"]
    assert export.name == "trl_config.yaml" and not (export.parent / "verl_overrides.txt").exists()
    assert f"model_name_or_path: {model_folder}" in export.read_text()
    data = work / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(prompts_of(96, 32))
    (work / "my_rewards.py").write_text(REWARD)
    launch = summary["launch"].replace("/path/to/dataset", str(data))
    launch = launch.replace("your_module.your_reward", "my_rewards.reward")
    argv = shlex.split(launch)
    assert argv[:2] == ["trl", "grpo"]
    trl = Path(sys.executable).with_name("trl")
    extra = ["--max_steps", "2", "--output_dir", str(work / "trl-out"), "--report_to", "none"]
    trained = subprocess.run(
        [sys.executable, "-c", PEAK_OF_CHILDREN, str(trl), *argv[1:], *extra, "--save_strategy", "no"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(work), "HF_HUB_OFFLINE": "1"},
    )
    said = trained.stdout + trained.stderr
    assert trained.returncode == 0, said[-3000:]
    assert "'train_runtime'" in said and "'step_time'" in said
    # the export's checkpointing field is the current one (TRL 1.16 itself still reads the model's deprecated
    # is_gradient_checkpointing: a warning no config can silence)
    assert "`gradient_checkpointing` is deprecated" not in said, said[-3000:]
    peak_gib = int(said.split("PEAK_KIB ")[1].split()[0]) / 1024**2
    assert peak_gib <= BUDGET_GIB, f"trl grpo peaked at {peak_gib:.3f} GiB over the {BUDGET_GIB} GiB budget"


def test_check_agrees_with_the_probes(budget_study, tmp_path):
    """check reads the study's trl_config.yaml as fitting (its measurement, and the memory model on the
    budget as a card), and TRL's defaults for the same recipe as over it, as the study's probe of them was."""
    from autotune.check import CheckOptions, check

    export, summary = budget_study["export"], budget_study["summary"]
    measured = check(CheckOptions(export))
    assert measured.exit_code == 0 and measured.memory["decided_by"] == "measurement"
    assert measured.memory["fits"] and measured.target.device == "cpu"
    assert measured.memory["measured_peak_gib"] == pytest.approx(
        summary["recommended"]["peak_memory_gib"], 0.01
    )
    on_card = check(CheckOptions(export, memory_gib=BUDGET_GIB))
    assert on_card.memory["decided_by"] == "model" and on_card.memory["fits"]
    data = tmp_path / "train.jsonl"
    data.write_text(prompts_of(96, 16))
    recipe = yaml.safe_load(export.read_text())
    defaults = {k: recipe[k] for k in ("model_name_or_path", "generation_batch_size", "num_generations")}
    defaults.update(max_completion_length=recipe["max_completion_length"], beta=recipe["beta"], use_cpu=True)
    path = tmp_path / "trl_defaults.yaml"
    path.write_text(yaml.safe_dump(defaults))
    over = check(CheckOptions(path, memory_gib=BUDGET_GIB, data=data, model="tiny-llama"))
    assert over.exit_code == 1 and over.memory["verdict"] == "over", [f.line for f in over.findings]
    fix = next(f.fix for f in over.problems if f.check == "memory")
    assert fix.startswith("in TRL's fields, fits with any one of: 1) per_device_train_batch_size 8→")


def test_check_on_a_file_trl_refuses_says_why_in_trls_terms(budget_study, tmp_path, capsys):
    from autotune.cli import main

    path = tmp_path / "trl_config.yaml"
    path.write_text(budget_study["export"].read_text() + "max_prompt_length: 96\nnum_generations: three\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "max_prompt_length=96: Some keys are not used by the HfArgumentParser" in err
    assert "TRL 1.16 does not truncate prompts" in err
    assert "num_generations='three': TRL refuses it: argument --num_generations" in err


def test_two_trl_ranks_train_as_one_job():
    code, result = probe_json("--engine", "trl", "--gpus", "2", *RECIPE, timeout=600)
    assert code == 0 and result["status"] == "ok", result.get("message")
    assert result["environment"]["processes"] == 2  # TRL's own world size, not two separate trainings
    assert len(result["rank_peaks"]) == 2 and result["samples_per_sec"] > 0
    # each round is train 8 / mini 4 = 2 optimizer steps (m=2 on 2 ranks); on CPU the warm-up and one more
    # round set the peak, then 2 rounds are timed
    steps = result["environment"]["step_seconds"]
    assert len(steps) == 8 and result["measured_seconds"] == pytest.approx(sum(steps[4:]))


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
