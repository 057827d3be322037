"""autotune reads verl files as verl does: a corpus of override lines and launch scripts, each read by
autotune and composed by Hydra with verl 0.9.1's own config (the session's `verl_compose`). For every file
Hydra accepts, the values that decide memory and the rules are equal; every file Hydra refuses, autotune
refuses too (a UserError, or a problem finding). A few files Hydra accepts are refused by autotune on purpose
(a quoted number where verl wants an int): those are marked."""

from __future__ import annotations

import pytest

from autotune.errors import UserError
from autotune.formats import verl_schema
from autotune.formats.launch_script import read_launch_script
from autotune.formats.verl import AR, need_critic, need_reference, override_lines, read_overrides
from tests.conftest import REPO

EXAMPLES = sorted((REPO / "tests" / "data" / "verl_examples").rglob("*.sh"))
BASE = [  # a job the corpus lines change
    "data.train_batch_size=16",
    f"{AR}.actor.ppo_mini_batch_size=8",
    f"{AR}.actor.ppo_micro_batch_size_per_gpu=2",
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu=4",
    f"{AR}.rollout.name=vllm",
]
# (lines, autotune refuses although Hydra accepts)
CORPUS: dict[str, tuple[list[str], bool]] = {
    "capital False": ([f"{AR}.model.enable_gradient_checkpointing=False"], False),
    "capital True offload": ([f"{AR}.actor.fsdp_config.param_offload=True"], False),
    "lower true kl": ([f"{AR}.actor.use_kl_loss=true", f"{AR}.actor.kl_loss_coef=0.01"], False),
    "kl in reward": (["algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.kl_coef=0.2"], False),
    "underscored int": (["data.max_response_length=16_384"], False),
    "null": ([f"{AR}.rollout.max_model_len=null"], False),
    "float share": ([f"{AR}.rollout.gpu_memory_utilization=0.6"], False),
    "int for a float": ([f"{AR}.rollout.gpu_memory_utilization=1"], False),
    "rloo has no critic": (["algorithm.adv_estimator=rloo"], False),
    "grpo with critic.enable": (["algorithm.adv_estimator=grpo", "critic.enable=true"], False),
    "gae with critic off": (["critic.enable=False"], False),
    "duplicate: the later wins": (["data.max_prompt_length=256", "data.max_prompt_length=1024"], False),
    "++ overrides": (["++data.max_prompt_length=2048"], False),
    "+ adds a new key": (["+trainer.my_note=1"], False),
    "+ on an existing key": (["+data.max_prompt_length=1"], False),
    "interpolation": (
        ["data.max_prompt_length=300", "data.max_response_length=${data.max_prompt_length}"],
        False,
    ),
    "budget interpolated by default": (
        [f"{AR}.actor.use_dynamic_bsz=true", f"{AR}.actor.ppo_max_token_len_per_gpu=30_000"],
        False,
    ),
    "critic's global micro": (["critic.ppo_micro_batch_size=8"], False),
    "deprecated actor micro": ([f"{AR}.actor.ppo_micro_batch_size=64"], False),
    "list value": (["trainer.logger=[console,file]"], False),
    "quoted list is text": (['trainer.logger=\'["console","wandb"]\''], False),
    "empty value of a key not read": (["trainer.project_name="], False),
    "quoted number": (["data.train_batch_size='4'"], True),
    "double-quoted number": (['data.max_prompt_length="512"'], True),
    "empty value": (["data.max_prompt_length="], True),
    "boolean for an int": (["data.max_prompt_length=true"], True),
    "delete a key autotune reads": ([f"~{AR}.rollout.max_num_seqs"], True),
    "unknown key": ([f"{AR}.actor.ppo_micro_batch_size_per_gpux=4"], False),
    "delete a missing key": (["~trainer.no_such_key"], False),
    "broken list": (["data.max_prompt_length=[1,"], False),
}
DECIDING = [
    key for key in verl_schema.READ_KEYS if key not in (f"{AR}.model.path", "reward_model.model.path")
]


def hydra_view(compose, overrides: list[str]) -> dict | None:
    """What verl's composed config holds for the deciding keys; None when Hydra refuses the overrides."""
    from omegaconf import OmegaConf

    try:
        config = compose(overrides)
    except Exception:
        return None
    view = {key: OmegaConf.select(config, key, throw_on_missing=False) for key in DECIDING}
    return {key: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for key, v in view.items()}


def autotune_view(values: dict) -> dict:
    view = {key: verl_schema.effective(key, values) for key in DECIDING}
    return {key: None if value == verl_schema.MISSING else value for key, value in view.items()}


def verls_critic_and_reference(view: dict) -> tuple[bool, bool]:
    """trainer/ppo/utils.py need_critic and need_reference_policy, on Hydra's composed values."""
    enable = view["critic.enable"]
    critic = bool(enable) if enable is not None else view["algorithm.adv_estimator"] == "gae"
    return critic, bool(view["algorithm.use_kl_in_reward"] or view[f"{AR}.actor.use_kl_loss"])


def read(text: str) -> tuple[dict | None, bool]:
    """autotune's values, and whether it refused the file (UserError or a problem finding)."""
    try:
        target = read_overrides(text, where="corpus")
    except UserError as exc:
        assert "\n" not in str(exc) and "corpus:" in str(exc)
        return None, True
    return target.overrides, any(f.severity == "problem" for f in target.findings)


@pytest.mark.parametrize("name", CORPUS)
def test_override_lines_read_as_hydra_composes_them(verl_compose, name):
    lines, refused_on_purpose = CORPUS[name]
    overrides = BASE + lines
    hydra = hydra_view(verl_compose, overrides)
    values, refused = read("\n".join(overrides) + "\n")
    if hydra is None:
        assert refused, f"Hydra refuses {lines}, autotune read them"
        return
    assert refused == refused_on_purpose, f"Hydra accepts {lines}"
    if refused:
        return
    assert autotune_view(values) == hydra
    assert (need_critic(values), need_reference(values)) == verls_critic_and_reference(hydra)


@pytest.mark.e2e  # bash reads the script
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_verls_example_scripts_read_as_hydra_composes_their_arguments(verl_compose, path):
    read_script = read_launch_script(path, str(path))
    words, notes = [line.text for line in read_script.lines], read_script.notes
    hydra = hydra_view(verl_compose, words)
    values, refused = read(path.read_text())
    if hydra is None:  # some examples are newer than 0.9.1: keys 0.9.1 lacks, which autotune names
        assert refused
        target = read_overrides(path.read_text(), where=str(path))
        named = {f.key for f in target.findings if f.severity == "problem"}
        hydra = hydra_view(verl_compose, [w for w in words if w.partition("=")[0] not in named])
    assert hydra is not None
    assert autotune_view(values) == hydra
    assert any("$@" in note for note in notes)  # the examples end in $@: read as no arguments


def test_the_shipped_schema_is_verls_own_config():
    import runpy

    tool = runpy.run_path(str(REPO / "tools" / "verl_schema.py"))
    if tool["YAML_FILE"] is None:
        pytest.skip("verl 0.9.1 is not installed in .venv-verl: ./setup.sh test")
    import json

    assert json.loads((REPO / "autotune" / "formats" / "verl_schema.json").read_text()) == tool["schema"]()


def test_override_lines_keep_their_numbers():
    lines = override_lines("# a comment\n\ndata.train_batch_size=4\n")
    assert [(line.number, line.text) for line in lines] == [(3, "data.train_batch_size=4")]


@pytest.mark.parametrize(
    "text,said",
    [
        (
            "data.train_batch_size='4'\n",
            "corpus:1: \"data.train_batch_size='4'\": data.train_batch_size='4' is text",
        ),
        ("data.max_prompt_length=\n", "corpus:1: 'data.max_prompt_length=': an empty value"),
        ("data.max_prompt_length=[1,\n", "corpus:1: 'data.max_prompt_length=[1,' is not a Hydra override"),
    ],
)
def test_bad_input_is_one_line_naming_the_line_and_the_value(text, said):
    with pytest.raises(UserError) as caught:
        read_overrides(text, where="corpus")
    assert said in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.e2e  # bash reads the script
def test_a_launch_script_is_read_as_bash_expands_it(monkeypatch):
    monkeypatch.setenv("HOME", "/home/user")
    monkeypatch.delenv("BATCH", raising=False)
    text = (
        "set -x\nexport LEN=1024\nBATCH=${BATCH:-64}\nMODEL=$HOME/models/qwen\n"
        "python3 -m verl.trainer.main_ppo \\\n"
        "    data.max_prompt_length=$LEN \\\n"
        '    data.train_batch_size="${BATCH}" \\\n'
        "    data.train_files=$HOME/data/train.parquet \\\n"
        "    'trainer.project_name=$LEN' $@\n"
    )
    target = read_overrides(text, where="run.sh")
    assert target.overrides["data.max_prompt_length"] == 1024
    assert target.overrides["data.train_batch_size"] == 64
    assert target.overrides["data.train_files"] == "/home/user/data/train.parquet"  # the user's HOME
    assert target.overrides["trainer.project_name"] == "$LEN"  # single quotes: bash expands nothing
    assert any('run.sh:5: "$@"' in f.problem for f in target.findings)
    with pytest.raises(UserError, match=r"run.sh:6: data.max_prompt_length is empty where bash runs it"):
        read_overrides(text.replace("=$LEN \\", "=$UNSET_LEN \\"), where="run.sh")


@pytest.mark.e2e  # bash reads the script
def test_an_override_cut_off_from_the_command_is_said():
    text = "python3 -m verl.trainer.main_ppo \\\n  data.max_prompt_length=4 \\\n\n  trainer.nnodes=1\n"
    target = read_overrides(text, where="run.sh")
    assert target.overrides["data.max_prompt_length"] == 4 and "trainer.nnodes" not in target.overrides
    said = "run.sh:4: trainer.nnodes=1 runs as a command of its own"
    assert any(said in f.problem for f in target.findings)


@pytest.mark.e2e
def test_check_refuses_a_quoted_number_in_one_line_with_exit_2(tmp_path):
    from tests.conftest import run_cli

    # (in a bash script the shell strips those quotes and verl gets 4, so this is an override file)
    script = tmp_path / "verl_overrides.txt"
    script.write_text("trainer.nnodes=1\ndata.train_batch_size='4'\n")
    proc = run_cli("check", str(script))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"{script}:2:" in line and "data.train_batch_size='4' is text" in line
