"""A launch script's --config-path/--config-name YAML, read as `++` override lines before the command line's:
the values autotune reads from them, and (the referee) the values Hydra composes from the same file over
verl 0.9.1's own ppo_trainer config, with the same command-line overrides after it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from autotune.errors import UserError
from autotune.formats.hydra_read import Line, parse_value, read_lines
from autotune.formats.verl import AR, verl_keys
from autotune.formats.verl_config_file import config_file_lines
from tests.conftest import REPO, VERL_HOW, verl_config_dir

FIXTURE = REPO / "tests" / "fixtures" / "launch" / "config" / "gsm8k_multiturn_grpo.yaml"
# Values of each kind the grammar must carry back exactly, over keys verl has and keys it lacks
EXTRA_AR = """\
  actor:
    optim:
      lr: 3.0e-06
      weight_decay: 0
  model:
    override_config: {}
"""
EXTRA_TOP = r"""
trainer:
  logger: ['console', 'wandb']
  project_name: "it's a \\ \"test\" \\"
  experiment_name: ???
  default_local_dir: ${trainer.project_name}/ckpt, run=1 [a]
  autotune_note:
    nested: {}
    when: 2024-01-01
    items: [1, 2.5, null, true, {a: x}, [b, 'c d']]
"""


def _with_extra(text: str) -> str:
    return text.replace("  rollout:\n", EXTRA_AR + "  rollout:\n", 1) + EXTRA_TOP


def read(lines: list[Line], where: str = "run.sh") -> dict[str, Any]:
    values, findings = read_lines(lines, where, verl_keys())
    assert findings == [], findings
    return values


def test_fixture_values_as_the_yaml_has_them():
    lines = config_file_lines(str(FIXTURE.parent), "gsm8k_multiturn_grpo", "run.sh", 12)
    assert all(line.number == 12 and line.text.startswith("++") for line in lines)
    values = read(lines)
    assert values["data.max_prompt_length"] == 1024
    assert values["data.return_raw_chat"] is True
    assert values[f"{AR}.rollout.name"] == "sglang"
    assert values[f"{AR}.rollout.multi_turn.enable"] is True
    assert values[f"{AR}.rollout.multi_turn.max_assistant_turns"] == 5
    assert not any(key.startswith(("hydra", "defaults")) for key in values)
    # the command line's overrides come after, and win
    assert read([*lines, Line(20, "data.max_prompt_length=2048")])["data.max_prompt_length"] == 2048
    # .yaml in the name is the same file
    assert config_file_lines(str(FIXTURE.parent), "gsm8k_multiturn_grpo.yaml", "run.sh", 12) == lines


@pytest.mark.parametrize(
    ("path", "name"),
    [(None, None), ("config", None), ("./config", "ppo_trainer"), ("config/", "ppo_trainer.yaml"),
     (None, "ppo_trainer"), ("pkg://verl.trainer.config", None), ("/src/verl/verl/trainer/config", None)],
)  # fmt: skip
def test_verls_own_ppo_trainer_is_no_lines(path, name):
    assert config_file_lines(path, name, "run.sh", 3) == []


def test_every_kind_of_value_parses_back_to_the_yaml(tmp_path):
    (tmp_path / "job.yaml").write_text(_with_extra(FIXTURE.read_text()))
    lines = config_file_lines(str(tmp_path), "job", "run.sh", 1)
    loaded = _leaves(OmegaConf.to_container(OmegaConf.load(tmp_path / "job.yaml"), resolve=False))
    written = {line.text[2:].partition("=")[0]: parse_value(line.text.partition("=")[2]) for line in lines}
    expected = {k: v for k, v in loaded.items() if not k.startswith(("hydra", "defaults")) and v != "???"}
    assert list(written) == list(expected)  # one line per leaf, in file order
    for key, value in expected.items():
        assert _same(written[key], value), key
    assert "trainer.experiment_name" not in written  # ???: verl's value stays
    assert written["trainer.autotune_note.nested"] == {}
    assert written["trainer.default_local_dir"] == "${trainer.project_name}/ckpt, run=1 [a]"
    values = read(lines)
    assert values[f"{AR}.actor.optim.lr"] == 3e-06
    assert values["+trainer.autotune_note.items"] == [1, 2.5, None, True, {"a": "x"}, ["b", "c d"]]


# --- the referee: Hydra composes the same file over verl 0.9.1's ppo_trainer ------------------------------

COMMAND_LINE = [
    "data.max_prompt_length=2048",  # the file's, overridden
    f"{AR}.rollout.name=vllm",
    "trainer.n_gpus_per_node=4",
    f"{AR}.rollout.multi_turn.max_assistant_turns=3",
]


@pytest.fixture
def verl_dir() -> Path:
    config_dir = verl_config_dir()
    if config_dir is None or not (config_dir / "ppo_trainer.yaml").is_file():
        pytest.skip(f"verl 0.9.1's config files were not found (VERL_CONFIG_DIR unset); to run: {VERL_HOW}")
    version_file = config_dir.parent.parent / "version" / "version"
    version = version_file.read_text().strip() if version_file.is_file() else "unknown"
    if version != "0.9.1":
        pytest.skip(f"found verl {version} at {config_dir}; autotune reads verl 0.9.1 ({VERL_HOW})")
    return config_dir.resolve()


@pytest.mark.parametrize("extra", [False, True], ids=["fixture", "every kind of value"])
def test_hydra_composes_what_autotune_reads(verl_dir, tmp_path, extra):
    text = FIXTURE.read_text().replace("file://verl/trainer/config", f"file://{verl_dir}")
    assert f"file://{verl_dir}" in text
    if extra:
        text = _with_extra(text)
    (tmp_path / "gsm8k_multiturn_grpo.yaml").write_text(text)

    composed = _leaves(_compose(tmp_path, "gsm8k_multiturn_grpo", COMMAND_LINE))
    file_lines = config_file_lines(str(tmp_path), "gsm8k_multiturn_grpo", "run.sh", 5)
    values = read([*file_lines, *(Line(6 + i, text) for i, text in enumerate(COMMAND_LINE))])

    assert len(values) >= len(file_lines)
    for name, value in values.items():
        key = name.removeprefix("+")
        assert key in composed, key
        assert _same(value, composed[key]), (key, value, composed[key])
    assert values["data.max_prompt_length"] == 2048
    assert values[f"{AR}.rollout.multi_turn.enable"] is True
    if extra:
        assert composed["trainer.experiment_name"] != "???"  # a ??? in the file leaves verl's value


def _compose(config_dir: Path, name: str, overrides: list[str]) -> Any:
    """Hydra's composition of config_dir/name, as main_ppo's `--config-path/--config-name` would. Hydra
    allows one initialisation at a time: the session's `verl_compose` may hold one, put back afterwards."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    held = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return OmegaConf.to_container(compose(name, overrides=overrides), resolve=False)
    finally:
        GlobalHydra.instance().clear()
        if held is not None:
            GlobalHydra.instance().initialize(held)


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """dotted key -> value, for every leaf (an empty mapping is a leaf)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


# --- what autotune refuses ----------------------------------------------------------------------------------


def _yaml(tmp_path: Path, text: str, name: str = "job.yaml") -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("defaults:\n  - ppo_megatron_trainer\n  - _self_\n", "'ppo_megatron_trainer'"),
        ("defaults:\n  - ppo_trainer\n  - override hydra/launcher: basic\n", "override hydra/launcher"),
        ("defaults:\n  - _self_\n  - ppo_trainer\n", "_self_ comes before ppo_trainer"),
        ("defaults:\n  - ppo_trainer\n  - ppo_trainer\n", "repeated"),
        ("data:\n  max_prompt_length: 1\n", "do not name ppo_trainer"),
        ("defaults: [_self_]\n", "do not name ppo_trainer"),
        ("- a\n- b\n", "not a mapping"),
        ("data: [1\n", "not readable YAML"),
        ("defaults: [ppo_trainer]\ndata:\n  max prompt: 1\n", "'max prompt'"),
        ("defaults: [ppo_trainer]\ndata:\n  max_prompt_length: 1\n  max_prompt_length: 2\n", "not readable"),
    ],
)
def test_a_file_autotune_cannot_read_is_one_line(tmp_path, text, says):
    with pytest.raises(UserError) as raised:
        config_file_lines(_yaml(tmp_path, text), "job", "run.sh", 9)
    message = str(raised.value)
    assert message.startswith("run.sh:9: ") and "\n" not in message, message
    assert says in message and "job.yaml" in message, message


@pytest.mark.parametrize(
    ("path", "name", "says"),
    [
        ("examples/config", "job", "--config-path='examples/config'"),
        ("../../examples", None, "absolute path"),
        ("config", "ppo_megatron_trainer", "--config-name='ppo_megatron_trainer'"),
        (None, "gsm8k_multiturn_grpo", "verl's own gsm8k_multiturn_grpo"),
    ],
)
def test_relative_paths_and_verls_other_configs_are_one_line(path, name, says):
    with pytest.raises(UserError) as raised:
        config_file_lines(path, name, "run.sh", 4)
    message = str(raised.value)
    assert message.startswith("run.sh:4: ") and "\n" not in message and says in message, message


def test_a_missing_file_names_its_path(tmp_path):
    with pytest.raises(UserError) as raised:
        config_file_lines(str(tmp_path), "nowhere", "run.sh", 2)
    message = str(raised.value)
    assert str(tmp_path / "nowhere.yaml") in message and "\n" not in message, message
    with pytest.raises(UserError, match=r"ppo_trainer\.yaml"):  # no name: main_ppo's own, ppo_trainer
        config_file_lines(str(tmp_path), None, "run.sh", 2)
