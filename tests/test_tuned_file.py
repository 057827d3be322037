"""The user's own file handed back with the tuned values (autotune.formats.tuned_file): only the tuned values
change, in place where the file sets them and added where it does not.

Launch scripts are verl's own (tests/fixtures/launch). bash is the referee: `bash -n` accepts each tuned
script, and running it with a stub `python3` first on PATH gives the trainer the original's argv with only the
tuned values changed. Those tests start bash, so they are e2e (tests/conftest.py), though they take a
second; the fast tier checks the same edits as text."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.config.knobs import ProbeConfig
from autotune.formats.trl import trl_config_text
from autotune.formats.tuned_file import (
    MAX_DIFF_LINES,
    short_diff,
    tune_launch_script,
    tune_override_file,
    tune_yaml_config,
    tuned_path,
)
from autotune.formats.verl import parse_overrides

BASE = ProbeConfig(  # tests/test_trl_export.py's, without importing TRL here
    algorithm="grpo",
    rollout_n=4,
    train_batch_size=16,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    max_prompt_length=32,
    max_response_length=16,
)
LAUNCH = Path(__file__).parent / "fixtures" / "launch"
MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
MINI = "actor_rollout_ref.actor.ppo_mini_batch_size"
SEQS = "actor_rollout_ref.rollout.max_num_seqs"
# fixture -> (keys it sets, with new values; keys it does not set, with their values)
CASES = {
    "plain_grpo_qwen2-7b.sh": ({MICRO: "8", "actor_rollout_ref.rollout.n": "4"}, {SEQS: "256"}),
    # the mini batch is `${mini_batch_size}`, set by `$(( total_procs ))`; checkpointing is set twice
    "tee_log_and_arith_vars_lora_tuning.sh": (
        {MINI: "8", "actor_rollout_ref.model.enable_gradient_checkpointing": "false"},
        {MICRO: "2", "actor_rollout_ref.rollout.enforce_eager": "true"},
    ),
    # the overrides are in bash arrays, with comments between them; the command starts with Hydra options
    "bash_arrays_dollar_at_npu_grpo.sh": (
        {MICRO: "4", "actor_rollout_ref.rollout.n": "16", "trainer.nnodes": "1"},
        {SEQS: "128"},
    ),
    "ppo_critic_deepseek7b.sh": (
        {
            "critic.ppo_micro_batch_size_per_gpu": "8",
            "actor_rollout_ref.rollout.gpu_memory_utilization": "0.6",
        },
        {"critic.forward_micro_batch_size_per_gpu": "16"},
    ),
}


def call_line(text: str) -> int:
    return next(number for number, line in enumerate(text.split("\n"), 1) if "verl.trainer.main_ppo" in line)


def tuned(name: str) -> tuple[str, str, dict[str, str], dict[str, str]]:
    text = (LAUNCH / name).read_text()
    changed, added = CASES[name]
    return text, tune_launch_script(text, {**changed, **added}, call_line(text)), changed, added


# --- launch scripts: the text ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_tuned_script_differs_only_in_the_tuned_overrides(name):
    text, result, changed, added = tuned(name)
    gone = [line for line in text.splitlines() if line not in result.splitlines()]
    new = [line for line in result.splitlines() if line not in text.splitlines()]
    assert gone and all(any(f"{key}=" in line for key in changed) for line in gone)
    for key, value in changed.items():
        assert f"{key}=" not in "".join(gone) or f"{key}={value}" in result
    inserted = [line for line in new if any(line.strip().startswith(f"{key}=") for key in added)]
    assert [line.strip() for line in inserted] == [f"{key}={value} \\" for key, value in added.items()]
    assert len(new) == len(gone) + len(added)
    assert result.endswith("\n") == text.endswith("\n")  # the NPU script has no final newline, and keeps none
    assert "\r" not in result


def test_a_value_is_replaced_whole_and_every_occurrence_of_the_key_changes():
    text, result, _, _ = tuned("tee_log_and_arith_vars_lora_tuning.sh")
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=${mini_batch_size}" in text
    assert "    actor_rollout_ref.actor.ppo_mini_batch_size=8 \\\n" in result
    assert result.count("actor_rollout_ref.model.enable_gradient_checkpointing=false \\\n") == 2
    assert "mini_batch_size=$(( total_procs ))" in result  # the variable itself is the user's
    assert "actor_rollout_ref.actor.ppo_micro_batch_size=${mini_batch_size}" in result  # a longer key stays


def test_overrides_in_a_bash_array_change_and_new_ones_follow_the_hydra_options():
    text, result, _, _ = tuned("bash_arrays_dollar_at_npu_grpo.sh")
    assert '    trainer.nnodes="${NNODES}"\n' in text and "    trainer.nnodes=1\n" in result
    assert (
        "    # PPO Training Parameters\n    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4\n"
        in result
    )
    # argparse refuses an override before an option when another override follows it: after the options
    assert (
        "python3 -m verl.trainer.main_ppo \\\n    --config-path=config \\\n"
        "    --config-name='ppo_trainer.yaml' \\\n    actor_rollout_ref.rollout.max_num_seqs=128 \\\n"
        "    custom_reward_function.path="
    ) in result


def test_overrides_in_a_quoted_string_change_inside_it():
    """SAPO keeps its overrides in multi-line strings (`ROLLOUT_CONFIG="..."`), expanded unquoted, and starts
    verl through srun with `--config-path=./config --config-name=$CONFIG_NAME`."""
    text = (LAUNCH / "function_case_if_slurm_string_configs_sapo.sh").read_text()
    changes = {"actor_rollout_ref.rollout.n": "4", "data.train_batch_size": "64", SEQS: "32"}
    result = tune_launch_script(text, changes, call_line(text))
    assert [line.split(": ", 1)[1] for line in short_diff(text, result, "sapo")] == [
        "-     actor_rollout_ref.rollout.n=$n_resp_per_prompt \\",
        "+     actor_rollout_ref.rollout.n=4 \\",
        "+         actor_rollout_ref.rollout.max_num_seqs=32 \\",
        "-         data.train_batch_size=$train_batch_size \\",
        "+         data.train_batch_size=64 \\",
    ]
    assert "--config-name=$CONFIG_NAME \\\n        actor_rollout_ref.rollout.max_num_seqs=32 \\\n" in result


SCRIPT = """#!/bin/bash
# a.b.micro=1 in a comment stays
N=4
cat > notes.txt <<'EOF'
a.b.micro=2 in a heredoc stays
EOF
OVERRIDES="a.b.micro=$N x.a.b.micro=5"
python3 -m verl.trainer.main_ppo \\
    +a.b.micro=$((N * 2)) \\
    ++a.b.micro=${MICRO:-4} \\
    "a.b.micro=4" \\
    a.b.micro="$N" \\
    'a.b.micro=7' \\
    $OVERRIDES $@ 2>&1 | tee log.txt
echo done"""


def test_every_override_word_of_the_key_changes_and_nothing_else():
    result = tune_launch_script(SCRIPT, {"a.b.micro": "16"}, 8)
    assert result == (
        SCRIPT.replace("+a.b.micro=$((N * 2))", "+a.b.micro=16")
        .replace("++a.b.micro=${MICRO:-4}", "++a.b.micro=16")
        .replace('"a.b.micro=4"', '"a.b.micro=16"')
        .replace('a.b.micro="$N"', "a.b.micro=16")
        .replace("'a.b.micro=7'", "'a.b.micro=16'")
        .replace('"a.b.micro=$N x', '"a.b.micro=16 x')
    )
    assert "# a.b.micro=1 in a comment stays" in result and "a.b.micro=2 in a heredoc stays" in result
    assert "x.a.b.micro=5" in result  # a longer key that ends in this one


def test_a_new_key_goes_after_the_module_word_in_the_command_at_or_after_the_call_line():
    script = "echo verl.trainer.main_ppo\nset -x\n  torchrun -m verl.trainer.main_ppo a=1 $@\n"
    result = tune_launch_script(script, {"x.y": "2", "x.z": "null"}, 2)
    assert result == (
        "echo verl.trainer.main_ppo\nset -x\n"
        "  torchrun -m verl.trainer.main_ppo \\\n      x.y=2 \\\n      x.z=null a=1 $@\n"
    )
    assert shlex.split(result.split("\n", 2)[2].replace("\\\n", "")) == shlex.split(
        "torchrun -m verl.trainer.main_ppo x.y=2 x.z=null a=1 $@"
    )
    by_path = tune_launch_script("python3 verl/trainer/main_ppo.py a=1\n", {"x.y": "2"}, 1)
    assert by_path == "python3 verl/trainer/main_ppo.py \\\n    x.y=2 a=1\n"


def test_a_value_bash_would_split_is_quoted_for_bash():
    result = tune_launch_script("python3 -m verl.trainer.main_ppo \\\n    a.b=1\n", {"a.b": "[x, y]"}, 1)
    assert shlex.split(result.replace("\\\n", "")) == ["python3", "-m", "verl.trainer.main_ppo", "a.b=[x, y]"]
    quoted = tune_launch_script('V="a.b=1 c.d=2"\n', {"a.b": "'it''s'"}, 1)
    assert quoted == "V=\"a.b='it''s' c.d=2\"\n"
    with pytest.raises(ValueError, match="space"):
        tune_launch_script('V="a.b=1 c.d=2"\n', {"a.b": "[x, y]"}, 1)


def test_line_endings_and_a_missing_final_newline_are_kept():
    crlf = "set -x\r\npython3 -m verl.trainer.main_ppo \\\r\n    a.b=1 \\\r\n    c.d=2"
    result = tune_launch_script(crlf, {"a.b": "5", "x.y": "6"}, 2)
    assert (
        result == "set -x\r\npython3 -m verl.trainer.main_ppo \\\r\n    x.y=6 \\\r\n    a.b=5 \\\r\n    c.d=2"
    )
    lf = "python3 -m verl.trainer.main_ppo \\\n    a.b=1\n"
    assert "\r" not in tune_launch_script(lf, {"x.y": "6"}, 1)


@pytest.mark.parametrize(
    "name",
    [
        "case_sets_module_and_array_dynamo.sh",  # python3 -m "${target_module}", set in a case
        "dapo_recipe_arith_ray_job_submit.sh",  # recipe.dapo.main_dapo, through ray job submit
    ],
)
def test_a_command_without_the_module_word_is_a_value_error(name):
    text = (LAUNCH / name).read_text()
    start = next(number for number, row in enumerate(text.split("\n"), 1) if "python3 -m" in row)
    with pytest.raises(ValueError, match="main_ppo"):
        tune_launch_script(text, {"not.in.the.script": "2"}, start)


def test_the_module_word_before_the_call_line_does_not_count():
    script = "python3 -m verl.trainer.main_ppo a=1\necho done\n"
    with pytest.raises(ValueError, match="line 2"):
        tune_launch_script(script, {"x.y": "2"}, 2)


# --- launch scripts: bash runs them ------------------------------------------------------------------------

STUB = """#!{python}
import json, os, sys
with open(os.environ["ARGV_FILE"], "a") as out:
    out.write(json.dumps(sys.argv[1:]) + "\\n")
"""
NOOP = "#!/bin/sh\nexit 0\n"  # `mkdir -p logs` under `set -e` would end the NPU script before its launch


def trainer_argv(script: Path, tmp_path: Path) -> list[str]:
    """The argv the script's `python3` receives, run by bash with only the stubs on PATH."""
    stubs = tmp_path / "stubs"
    if not stubs.exists():
        stubs.mkdir()
        (stubs / "python3").write_text(STUB.format(python=sys.executable))
        (stubs / "mkdir").write_text(NOOP)
        for stub in stubs.iterdir():
            stub.chmod(0o755)
    argv_file = tmp_path / f"{script.name}.argv"
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": str(stubs), "ARGV_FILE": str(argv_file), "HOME": str(home)}
    bash = shutil.which("bash")
    assert bash
    subprocess.run(
        [bash, str(script)], cwd=home, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=30
    )
    calls = argv_file.read_text().splitlines() if argv_file.exists() else []
    assert len(calls) == 1, f"{script.name}: python3 was started {len(calls)} times"
    return json.loads(calls[0])


def key_of(word: str) -> str:
    return word.split("=", 1)[0].lstrip("+")


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(CASES))
def test_bash_accepts_a_tuned_script_and_starts_the_trainer_with_only_the_tuned_values_changed(
    name, tmp_path
):
    text, result, changed, added = tuned(name)
    original, tuned_script = tmp_path / name, tmp_path / tuned_path(Path(name), tmp_path).name
    original.write_bytes(text.encode())
    tuned_script.write_bytes(result.encode())
    checked = subprocess.run(["bash", "-n", str(tuned_script)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr

    before, after = trainer_argv(original, tmp_path), trainer_argv(tuned_script, tmp_path)
    assert after[:2] == ["-m", "verl.trainer.main_ppo"]
    for key, value in changed.items():
        assert any(key_of(word) == key for word in before), f"{key} is not set by {name}"
        assert [word for word in after if key_of(word) == key][-1].split("=", 1)[1] == value
    for key, value in added.items():
        assert not any(key_of(word) == key for word in before)
        assert [word for word in after if key_of(word) == key] == [f"{key}={value}"]
    expected = [
        f"{word.split('=', 1)[0]}={changed[key_of(word)]}"
        if "=" in word and key_of(word) in changed
        else word
        for word in before
    ]
    assert [word for word in after if key_of(word) not in added] == expected


# --- verl override files -----------------------------------------------------------------------------------

OVERRIDES = """# written by autotune
data.train_batch_size=16
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4

# the user's own choice, later in the file: the one Hydra applies
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
trainer.logger=[console,file]"""


def test_an_override_file_changes_the_last_line_that_sets_a_key_and_appends_the_others():
    changes = {
        MICRO: "8",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space": "8",
        "actor_rollout_ref.rollout.gpu_memory_utilization": "0.7",
    }
    result = tune_override_file(OVERRIDES, changes)
    assert result == (
        OVERRIDES.replace("swap_space=4", "swap_space=8").replace(f"{MICRO}=2", f"{MICRO}=8")
        + "\nactor_rollout_ref.rollout.gpu_memory_utilization=0.7\n"
    )
    assert f"{MICRO}=4\n" in result  # the earlier line, which Hydra overrides anyway
    assert parse_overrides(result) == {  # Hydra reads the tuned values; the `+` stays the user's
        **parse_overrides(OVERRIDES),
        MICRO: 8,
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space": 8,
        "actor_rollout_ref.rollout.gpu_memory_utilization": 0.7,
    }


def test_an_override_file_keeps_its_line_endings():
    assert tune_override_file("a.b=1\r\nc.d=2\r\n", {"c.d": "3", "e.f": "4"}) == "a.b=1\r\nc.d=3\r\ne.f=4\r\n"
    assert tune_override_file("", {"e.f": "4"}) == "e.f=4\n"
    assert tune_override_file("a.b=1\n", {}) == "a.b=1\n"


# --- TRL config YAML ---------------------------------------------------------------------------------------

TRL_YAML = """# my GRPO run
model_name_or_path: Qwen/Qwen2.5-0.5B   # the policy
per_device_train_batch_size: 4  # per GPU
'gradient_accumulation_steps': 2
report_to:
  - wandb
  # a comment after the list
logging_steps: 10
learning_rate: 1.0e-06"""


def test_a_trl_yaml_changes_values_in_place_keeping_comments_and_appends_new_keys():
    changes = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "report_to": ["none"]}
    changes |= {"use_vllm": True, "vllm_gpu_memory_utilization": 0.3, "output_dir": "out # here"}
    result = tune_yaml_config(TRL_YAML, changes)
    assert yaml.safe_load(result) == {**yaml.safe_load(TRL_YAML), **changes}
    assert "per_device_train_batch_size: 8  # per GPU\n" in result
    assert "'gradient_accumulation_steps': 1\n" in result
    assert "report_to: [none]\n  # a comment after the list\nlogging_steps: 10\n" in result
    assert result.startswith("# my GRPO run\nmodel_name_or_path: Qwen/Qwen2.5-0.5B   # the policy\n")
    assert result.endswith(
        "learning_rate: 1.0e-06\nuse_vllm: true\nvllm_gpu_memory_utilization: 0.3\noutput_dir: 'out # here'\n"
    )


def test_autotunes_own_trl_export_round_trips():
    text = trl_config_text(BASE, gpus=2, model="Qwen/Qwen2.5-0.5B", device="cuda")
    changes = {
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 4,
        "dataloader_num_workers": 0,
    }
    result = tune_yaml_config(text, changes)
    assert yaml.safe_load(result) == {**yaml.safe_load(text), **changes}
    assert len(short_diff(text, result, "trl_config.yaml")) == 6  # three lines out, three in
    assert tune_yaml_config(text, {}) == text


def test_a_yaml_that_is_not_a_flat_mapping_is_a_value_error():
    with pytest.raises(ValueError, match="mapping"):
        tune_yaml_config("- a\n- b\n", {"x": 1})
    with pytest.raises(ValueError, match="by hand"):
        tune_yaml_config("{a: 1, b: 2}\n", {"a": 3})


# --- names and diffs ---------------------------------------------------------------------------------------


def test_tuned_path_keeps_the_suffix_after_tuned(tmp_path):
    assert tuned_path(Path("/x/run.sh"), tmp_path) == tmp_path / "run.tuned.sh"
    assert tuned_path(Path("trl_config.yaml"), tmp_path) == tmp_path / "trl_config.tuned.yaml"
    assert tuned_path(Path("a.b/launch"), tmp_path) == tmp_path / "launch.tuned"
    assert tuned_path(Path("my.run.sh"), tmp_path) == tmp_path / "my.run.tuned.sh"


def test_short_diff_shows_the_changed_lines_with_their_numbers():
    assert short_diff("a\nb\nc\n", "a\nB\nc\nd\n", "f.sh") == ["f.sh:2: - b", "f.sh:2: + B", "f.sh:4: + d"]
    assert short_diff("same\n", "same\n", "f") == []
    many = short_diff("\n".join(map(str, range(100))), "\n".join(f"x{i}" for i in range(100)), "f")
    assert len(many) == MAX_DIFF_LINES and many[-1] == "... and 161 more changed lines"
