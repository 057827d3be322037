"""`autotune run --from FILE`, the logic: the space a file makes (its recipe held, its own system values the
first trial), what the flags override, the one-line refusals, and which keys the tuned copy changes. Files
here are verl override files and TRL configs (no bash runs: fast tier); launch scripts are the e2e tests'
(tests/test_from_file_e2e.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from autotune.config.knobs import ProbeConfig
from autotune.errors import UserError
from autotune.formats.tuned_file import tune_launch_script, tune_override_file
from autotune.formats.tuned_values import trl_changes, verl_changes
from autotune.run.from_file import job_space, read_job_file
from autotune.run.prepare import RunOptions
from autotune.space.loading import space_from_dict

AR = "actor_rollout_ref"
OVERRIDES = f"""\
algorithm.adv_estimator=grpo
data.train_batch_size=8
data.max_prompt_length=32
data.max_response_length=16
{AR}.model.path=tiny-llama
{AR}.model.lora_rank=8
{AR}.model.lora_alpha=16
{AR}.actor.ppo_mini_batch_size=4
{AR}.actor.ppo_micro_batch_size_per_gpu=3
{AR}.actor.use_kl_loss=true
{AR}.actor.kl_loss_coef=0.001
{AR}.actor.fsdp_config.param_offload=true
{AR}.rollout.n=2
{AR}.rollout.tensor_model_parallel_size=1
{AR}.rollout.log_prob_micro_batch_size_per_gpu=4
trainer.n_gpus_per_node=1
trainer.nnodes=1
"""
TRL = """\
model_name_or_path: tiny-llama
num_generations: 4
generation_batch_size: 16
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
max_completion_length: 16
beta: 0.04
gradient_checkpointing: true
use_cpu: true
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def verl_job(tmp_path):
    return read_job_file(write(tmp_path, "job_overrides.txt", OVERRIDES))


def test_the_recipe_is_the_files_and_its_own_settings_are_the_first_trial(verl_job):
    made = job_space(verl_job, RunOptions(), device="cpu")
    data = made.data
    knobs = data["knobs"]
    assert (knobs["train_batch_size"], knobs["mini_batch_size"]) == (16, 8)  # prompts × rollout.n
    assert (knobs["max_prompt_length"], knobs["max_response_length"]) == (32, 16)
    assert (data["algorithm"], data["rollout_n"], data["kl_coef"]) == ("grpo", 2, 0.001)
    assert data["lora"] == {"enabled": True, "r": 8, "alpha": 16}
    assert knobs["micro_batch_size"] == {"min": 1, "max": 8}
    (seed,) = data["seed_configs"]
    assert seed["name"].startswith("your settings (job_overrides.txt")
    assert seed["log_prob_micro_batch_size"] == 4 and seed["gradient_checkpointing"] is True
    space = space_from_dict(data, source="job", name="job")  # the space accepts what the file makes
    assert space.seed_configs[0].config.train_batch_size == 16


def test_a_micro_batch_off_the_grid_is_probed_at_the_nearest_and_said(verl_job):
    made = job_space(verl_job, RunOptions(), device="cpu")
    seed = made.data["seed_configs"][0]
    assert seed["micro_batch_size"] == 2  # 3 is no power of two: 2 divides the GPU's 8
    assert "micro 3→2" in seed["name"]
    assert any("micro 3→2" in note for note in made.notes)


def test_offload_is_held_off_on_cpu_and_kept_on_cuda(verl_job):
    on_cpu = job_space(verl_job, RunOptions(), device="cpu")
    assert on_cpu.data["knobs"]["param_offload"] is False
    assert any("param_offload: held off on cpu" in note for note in on_cpu.notes)
    assert job_space(verl_job, RunOptions(), device="cuda").data["knobs"]["param_offload"] is True


def test_flags_override_the_file_and_each_is_said(verl_job):
    options = RunOptions(model="small-llama", gpus=2, train_batch_size=32, mini_batch_size=16)
    made = job_space(verl_job, options, device="cpu")
    assert made.data["model"] == "small-llama" and made.data["gpus"] == 2
    assert made.data["knobs"]["train_batch_size"] == 32
    assert made.overridden == [
        "--gpus 2 (the file: 1)",
        "--train-batch-size 32 (the file: 16)",
        "--mini-batch-size 16 (the file: 8)",
        "--model small-llama (the file: tiny-llama)",
    ]


def test_a_model_that_is_not_here_names_the_flag_and_its_registry_twin(tmp_path):
    job = read_job_file(write(tmp_path, "o.txt", OVERRIDES.replace("tiny-llama", "Qwen/Qwen2-7B-Instruct")))
    with pytest.raises(UserError, match=r"--model qwen2-7b .*--model small-llama --gpus 1"):
        job_space(job, RunOptions(), device="cpu")


def test_a_step_too_large_for_a_cpu_is_refused_with_the_rehearsal_flags(tmp_path):
    big = OVERRIDES.replace("data.max_response_length=16", "data.max_response_length=4096")
    job = read_job_file(write(tmp_path, "big.txt", big))
    with pytest.raises(UserError, match=r"16 samples × 4128 tokens = 66,048 tokens.*--train-batch-size"):
        job_space(job, RunOptions(), device="cpu")
    job_space(job, RunOptions(), device="cuda")  # the job's GPUs run it


@pytest.mark.parametrize(
    ("text", "name", "message"),
    [
        ("knobs: {}\nmodel: tiny-llama\n", "space.yaml", "this is a search space; run it with --space"),
        (
            OVERRIDES.replace(f"{AR}.rollout.n=2\n", "").replace("data.train_batch_size=8\n", ""),
            "o.txt",
            "does not give the batch sizes",
        ),
        ("micro_batch_size: 2\ntrain_batch_size: 8\n", "best_config.yaml", None),
    ],
)
def test_files_that_are_no_trainers_job_are_one_line(tmp_path, text, name, message):
    with pytest.raises(UserError) as caught:
        read_job_file(write(tmp_path, name, text))
    assert "\n" not in str(caught.value)
    if message:
        assert message in str(caught.value)
    with pytest.raises(UserError, match="no such file"):
        read_job_file(tmp_path / "missing.sh")


def test_call_is_for_launch_scripts(tmp_path):
    with pytest.raises(UserError, match=r"--call 2: .* is not a launch script"):
        read_job_file(write(tmp_path, "o.txt", OVERRIDES), call=2)


def test_a_trl_config_makes_a_trl_space_without_verls_knobs(tmp_path):
    job = read_job_file(write(tmp_path, "trl.yaml", TRL))
    assert job.trainer.name == "trl"
    knobs = job_space(job, RunOptions(), device="cpu").data["knobs"]
    assert (knobs["train_batch_size"], knobs["mini_batch_size"]) == (16, 8)
    assert "use_dynamic_bsz" not in knobs and "log_prob_micro_batch_size" not in knobs
    assert knobs["sharding"] == "replicate"


# --- the keys the tuned copy changes -----------------------------------------------------------------------


def test_verl_changes_write_only_the_searched_knobs_that_differ(verl_job):
    best = dataclasses.replace(verl_job.config, micro_batch_size=4, gradient_accumulation_steps=2)
    best = ProbeConfig(**{**best.__dict__, "gradient_checkpointing": False, "log_prob_micro_batch_size": 4})
    values = verl_job.target.overrides
    changes = verl_changes(best, 1, ["micro_batch_size", "log_prob_micro_batch_size"], values)
    # the rollout's log-prob micro batch is the file's 4 already; the reference's is unset in the file
    assert changes == {
        f"{AR}.actor.ppo_micro_batch_size_per_gpu": "4",
        f"{AR}.ref.log_prob_micro_batch_size_per_gpu": "4",
    }
    with_ckpt = verl_changes(best, 1, ["gradient_checkpointing"], values)
    assert with_ckpt == {f"{AR}.model.enable_gradient_checkpointing": "false"}


def test_a_deprecated_global_micro_batch_is_nulled_beside_the_new_key(verl_job):
    values = {**verl_job.target.overrides, f"{AR}.actor.ppo_micro_batch_size": 8}
    values.pop(f"{AR}.actor.ppo_micro_batch_size_per_gpu")
    best = dataclasses.replace(verl_job.config, micro_batch_size=4, gradient_accumulation_steps=2)
    changes = verl_changes(best, 1, ["micro_batch_size"], values)
    assert changes[f"{AR}.actor.ppo_micro_batch_size"] == "null"
    assert changes[f"{AR}.actor.ppo_micro_batch_size_per_gpu"] == "4"


def test_trl_changes_keep_the_files_name_for_checkpointing(tmp_path):
    job = read_job_file(write(tmp_path, "trl.yaml", TRL))
    best = ProbeConfig(
        **{**job.config.__dict__, "micro_batch_size": 8, "gradient_accumulation_steps": 1},
    )
    best = ProbeConfig(**{**best.__dict__, "gradient_checkpointing": False})
    changes = trl_changes(best, ["micro_batch_size", "gradient_checkpointing"], yaml.safe_load(TRL))
    assert changes == {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "gradient_checkpointing": False,
    }


def test_a_plus_key_is_found_without_its_plus_and_added_with_it():
    script = "python3 -m verl.trainer.main_ppo \\\n    a.b=1 \\\n    +critic.fsdp.x=2\n"
    tuned = tune_launch_script(script, {"++critic.fsdp.x": "4", "++critic.fsdp.y": "5"}, call_line=1)
    assert "+critic.fsdp.x=4" in tuned and "++critic.fsdp.y=5" in tuned
    assert tune_override_file("+critic.fsdp.x=2\n", {"++critic.fsdp.x": "4"}) == "+critic.fsdp.x=4\n"


def test_dynamic_batch_size_turned_off_is_written_where_the_file_has_it_on(verl_job):
    values = {**verl_job.target.overrides, f"{AR}.actor.use_dynamic_bsz": True}
    best = dataclasses.replace(verl_job.config, micro_batch_size=2, gradient_accumulation_steps=4)
    changes = verl_changes(best, 1, ["use_dynamic_bsz", "micro_batch_size"], values)
    assert changes[f"{AR}.actor.use_dynamic_bsz"] == "false"
    assert changes[f"{AR}.actor.ppo_micro_batch_size_per_gpu"] == "2"


def test_trl_accumulation_keeps_the_files_mini_batch_whatever_the_rehearsal(tmp_path):
    job = read_job_file(write(tmp_path, "trl.yaml", TRL))  # 2 × 4 = 8 samples per process and step
    rehearsal = dataclasses.replace(job.config, micro_batch_size=4, gradient_accumulation_steps=4)
    changes = trl_changes(rehearsal, ["micro_batch_size"], yaml.safe_load(TRL))
    assert changes == {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}
    with pytest.raises(ValueError, match="does not divide"):
        trl_changes(
            dataclasses.replace(rehearsal, micro_batch_size=16), ["micro_batch_size"], yaml.safe_load(TRL)
        )


def test_a_job_over_several_nodes_is_not_probed_on_one_machine_unasked(tmp_path):
    job = read_job_file(write(tmp_path, "o.txt", OVERRIDES.replace("trainer.nnodes=1", "trainer.nnodes=2")))
    with pytest.raises(UserError, match=r"spans 2 nodes .*--nodes 2"):
        job_space(job, RunOptions(), device="cpu")
    rehearsal = job_space(job, RunOptions(gpus=1), device="cpu")
    assert rehearsal.overridden[0] == "--gpus 1 (the file: 2)"


def test_a_trl_config_without_a_model_takes_the_flags(tmp_path):
    job = read_job_file(write(tmp_path, "trl.yaml", TRL.replace("model_name_or_path: tiny-llama\n", "")))
    with pytest.raises(UserError, match="names no model: pass --model"):
        job_space(job, RunOptions(), device="cpu")
    assert job_space(job, RunOptions(model="tiny-llama"), device="cpu").data["model"] == "tiny-llama"
