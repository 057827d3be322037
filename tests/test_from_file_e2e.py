"""`autotune run --from FILE` through the real CLI, on a verl launch script and a TRL config at CPU size: the
study holds the file's recipe, measures the gain against the file's own settings, and hands the file back
tuned. The referees: bash (`bash -n`, and bash itself runs the copy to read it), verl 0.9.1's Hydra config
composed from what bash hands the trainer, TRL's own parser, and `autotune check` on the tuned copy."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from autotune.formats.launch_script import read_launch_script
from autotune.formats.trl_read import parse_trl, trl_importable
from autotune.run.from_file import job_space, read_job_file
from autotune.run.prepare import RunOptions
from autotune.run.tuned import write_tuned_file
from autotune.space.loading import space_from_dict
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.e2e

VERL_SCRIPT = REPO / "tests/fixtures/launch/cpu_tiny_llama_grpo_lora.sh"
TRL_CONFIG = REPO / "tests/fixtures/trl/cpu_grpo_config.yaml"
# what the study holds: the same in the tuned copy as in the user's file
RECIPE_KEYS = (
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "algorithm.adv_estimator",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.kl_loss_coef",
    "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.lora_alpha",
    "actor_rollout_ref.model.path",
)


def run_from(source: Path, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    args = ["run", "--from", str(source), "--trials", "4", "--gain-rounds", "1", "--out", str(out), "--json"]
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads(done.stdout)


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory):
    return run_from(VERL_SCRIPT, tmp_path_factory.mktemp("from verl"))  # a space in the output path


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    return run_from(TRL_CONFIG, tmp_path_factory.mktemp("from-trl"))


def hydra_words(script: Path) -> list[str]:
    """What bash hands verl's trainer when it runs the script (autotune's reader: bash, in its sandbox)."""
    return [line.text for line in read_launch_script(script, str(script)).lines]


def test_the_gain_is_measured_against_the_files_own_settings(verl_run):
    done, summary = verl_run
    assert "your settings (cpu_tiny_llama_grpo_lora.sh)" in json.dumps(summary["gain"])
    assert summary["recipe"]["train_batch_size"] == 16 and summary["recipe"]["rollout_n"] == 2
    assert "your file, tuned:" in done.stderr


def test_the_tuned_script_runs_as_the_original_with_the_tuned_values(verl_run, verl_compose):
    _, summary = verl_run
    tuned = Path(summary["tuned_file"]["written"])
    assert tuned.name == "cpu_tiny_llama_grpo_lora.tuned.sh" and tuned.parent.name in summary["study"]
    assert subprocess.run(["bash", "-n", str(tuned)], check=False).returncode == 0
    before, after = verl_compose(hydra_words(VERL_SCRIPT)), verl_compose(hydra_words(tuned))
    for key in RECIPE_KEYS:
        assert _select(after, key) == _select(before, key), key
    changes = summary["tuned_file"]["changes"]
    if not changes:  # the file's own settings measured fastest: handed back unchanged
        assert tuned.read_text() == VERL_SCRIPT.read_text()
    for key, value in changes.items():
        assert str(_select(after, key.lstrip("+"))).lower() == value.lower(), key
    report = (tuned.parent / "report.md").read_text()
    assert "## Your file, tuned" in report
    assert ("cpu_tiny_llama_grpo_lora.sh:" in report) == bool(changes)  # the diff, when there is one


def test_a_pick_that_differs_is_written_into_the_script_and_composes_in_verl(tmp_path, verl_compose):
    """Whatever the run above picked on a busy machine, a pick away from the file's settings (dynamic batch
    size on with its budgets, checkpointing off, a larger micro batch) goes into the script where verl reads
    it: bash hands it to the trainer, and verl's config composes to it."""
    job = read_job_file(VERL_SCRIPT)
    space = space_from_dict(job_space(job, RunOptions(), device="cpu").data, source="job", name="job")
    best = dataclasses.replace(
        job.config,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        gradient_checkpointing=False,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=192,
        log_prob_max_token_len_per_gpu=384,
    )
    tuned = write_tuned_file(job, space, best, tmp_path)
    assert subprocess.run(["bash", "-n", str(tuned.path)], check=False).returncode == 0
    after = verl_compose(hydra_words(tuned.path))
    before = verl_compose(hydra_words(VERL_SCRIPT))
    for key in RECIPE_KEYS:
        assert _select(after, key) == _select(before, key), key
    actor = after.actor_rollout_ref
    assert actor.actor.use_dynamic_bsz is True and actor.actor.ppo_max_token_len_per_gpu == 192
    assert actor.rollout.log_prob_max_token_len_per_gpu == 384
    assert actor.model.enable_gradient_checkpointing is False
    assert any(line.startswith("cpu_tiny_llama_grpo_lora.sh:") and " - " in line for line in tuned.diff)


def test_check_on_the_tuned_script_gives_the_studys_verdict(verl_run):
    _, summary = verl_run
    tuned = summary["tuned_file"]["written"]
    budget = f"{summary['budget']['gib']:.4f}"
    done = run_cli("check", tuned, "--memory-budget", budget, "--json")
    result = json.loads(done.stdout)
    memory = [f for f in result["findings"] if f["check"] == "memory"]
    assert memory and all(f["severity"] == "note" for f in memory), memory  # fits, as the study measured


def test_the_tuned_trl_config_is_read_by_trl_as_the_study_picked(trl_run):
    _, summary = trl_run
    tuned = Path(summary["tuned_file"]["written"])
    assert tuned.name == "cpu_grpo_config.tuned.yaml"
    use_trl = trl_importable()
    before = parse_trl(yaml.safe_load(TRL_CONFIG.read_text()), "original", use_trl=use_trl)
    after = parse_trl(yaml.safe_load(tuned.read_text()), "tuned", use_trl=use_trl)
    for field in ("generation_batch_size", "num_generations", "max_completion_length", "beta"):
        assert after[field] == before[field], field
    picked = summary["recommended"]["config"]
    assert after["per_device_train_batch_size"] == picked["micro_batch_size"]
    mini = after["per_device_train_batch_size"] * after["gradient_accumulation_steps"]
    assert mini == before["per_device_train_batch_size"] * before["gradient_accumulation_steps"]


def _select(config, key: str):
    node = config
    for part in key.split("."):
        node = node[part]
    return node
