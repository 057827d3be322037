"""The input surface under random and adversarial values (Hypothesis): every numeric flag, `--set` knob,
search-space field, config file and verl override line either is accepted as a valid value or refused with
one short line (a UserError, exit 2): never a traceback, never a hang, nothing written. Passwords with any
URL-special character never reach a message.

Everything runs in this process and stops before a probe would launch: no process is started."""

from __future__ import annotations

import copy
import math
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from autotune.check import CheckOptions, check
from autotune.cli import build_parser, main
from autotune.config.knobs import (
    KNOB_NAMES,
    MINI_BATCH,
    ProbeConfig,
    mini_batch_size,
    parse_sets,
    resolve_mini_batch,
)
from autotune.config.rules import config_findings, raise_for
from autotune.errors import UserError
from autotune.formats.verl import format_overrides, verl_keys, verl_overrides
from autotune.space.loading import load_space, space_from_dict
from autotune.space.specs import SpaceError
from autotune.study.storage import redact, remember_password, scrub

BOUNDED = settings(
    max_examples=40,
    deadline=5000,  # a hang guard: an example that takes 5 s fails
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e999", "0", "-0", "1_000", "0x10", " 3 ", "", "½", "1e3"]),
    st.text(max_size=12),
)
NUMERIC_FLAGS = [
    ("probe", "--gpus"),
    ("probe", "--memory-budget"),
    ("probe", "--timeout-per-probe"),
    ("probe", "--iterations"),
    ("probe", "--warmup"),
    ("probe", "--seed"),
    ("run", "--gpus"),
    ("run", "--trials"),
    ("run", "--timeout-per-probe"),
    ("run", "--memory-budget"),
    ("run", "--parallel"),
    ("run", "--seed"),
    ("report", "--confirm-iterations"),
    ("report", "--memory-budget"),
    ("check", "--gpus"),
    ("check", "--memory-budget"),
    ("check", "--cores"),
]
REQUIRED = {"report": ["--study", "s"], "check": ["config.yaml"]}


def one_line(error: UserError) -> None:
    """One line, short for each problem it names (a config may break several rules at once)."""
    text = str(error)
    problems = max(1, text.count("; fix:"))
    assert text and "\n" not in text and len(text) < 400 * problems and "Traceback" not in text, text


@pytest.mark.parametrize(("command", "flag"), NUMERIC_FLAGS)
@BOUNDED
@given(text=NUMBERS)
def test_a_numeric_flag_is_a_finite_number_in_range_or_one_line(command, flag, text):
    try:
        args = build_parser().parse_args([command, *REQUIRED.get(command, []), f"{flag}={text}"])
    except UserError as error:
        one_line(error)
        return
    value = getattr(args, flag.lstrip("-").replace("-", "_"))
    assert isinstance(value, (int, float)) and math.isfinite(value)
    assert value >= 0 and value <= 2**32


@BOUNDED
@given(text=st.one_of(NUMBERS, st.from_regex(r"[0-9.]{1,6}[smhd]{1,2}[0-9]{0,3}", fullmatch=True)))
def test_a_time_budget_is_a_positive_duration_of_at_most_a_month_or_one_line(text):
    from autotune.run.prepare import parse_duration

    try:
        seconds = parse_duration(text)
    except UserError as error:
        one_line(error)
        return
    assert 0 < seconds <= 30 * 86400


@BOUNDED
@given(key=st.sampled_from([*KNOB_NAMES, MINI_BATCH]), text=NUMBERS, gpus=st.integers(1, 8))
@example(key="sharding", text="0\n0", gpus=1)  # a newline in a value once broke the message into two lines
def test_a_set_knob_gives_a_valid_config_or_one_line(key, text, gpus):
    try:
        config = ProbeConfig(**resolve_mini_batch(parse_sets([f"{key}={text}"]), gpus))
        raise_for(config_findings(config, gpus, cores=8))
    except UserError as error:
        one_line(error)
        return
    value = getattr(config, key) if key != MINI_BATCH else mini_batch_size(config, gpus)
    assert value is None or isinstance(value, (bool, str)) or math.isfinite(value)


YAML_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-5, 2**40), max_size=3),
    st.dictionaries(
        st.sampled_from(["min", "max", "step", "choices", "x"]), st.integers(-5, 2**40), max_size=3
    ),
)
SPACE = dict(load_space("cpu-tiny").raw)
SPACE_FIELDS = [key for key in SPACE if key != "knobs"] + [f"knobs.{knob}" for knob in SPACE["knobs"]]


@BOUNDED
@given(field=st.sampled_from(SPACE_FIELDS), value=YAML_VALUES)
def test_a_space_field_gives_a_valid_space_or_one_line_per_mistake(field, value):
    data = copy.deepcopy(SPACE)
    section, _, key = field.rpartition(".")
    (data[section] if section else data)[key] = value
    try:
        space = space_from_dict(data, source="space.yaml", cores=8)
    except SpaceError as error:
        assert error.errors and all(line.startswith("space.yaml: ") for line in error.errors)
        assert all("\n" not in line and len(line) < 600 for line in error.errors)
        return
    except UserError as error:
        one_line(error)
        return
    assert space.size() >= 1


CONFIG = yaml.safe_load((Path(__file__).parent / "data" / "seed_scenario_3.yaml").read_text())


@BOUNDED
@given(
    key=st.sampled_from([*CONFIG, "actor_model_config.lora_r", "kl_coef", "unknown_key"]), value=YAML_VALUES
)
@example(key="max_prompt_length", value=-(2**63) - 1)  # once a traceback: numpy's int64 overflowed
def test_a_config_file_is_checked_or_refused_in_one_line(tmp_path_factory, key, value):
    data = copy.deepcopy(CONFIG)
    section, _, name = key.rpartition(".")
    (data[section] if section else data)[name] = value
    path = tmp_path_factory.mktemp("config") / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        result = check(CheckOptions(path=path, cores=8, gpu="rtx3090"))
    except UserError as error:
        one_line(error)
        return
    assert result.exit_code in (0, 1)


KEYS = sorted(verl_keys())
BASE_OVERRIDES = verl_overrides(ProbeConfig(), 1).values


@BOUNDED
@given(
    key=st.one_of(st.sampled_from(KEYS), st.from_regex(r"[a-z_]{1,8}(\.[a-z_]{1,8}){0,3}", fullmatch=True)),
    value=st.one_of(NUMBERS, st.sampled_from(["true", "null", "[a,b]", "'q'", "2" * 40])),
)
def test_a_verl_override_line_is_checked_or_refused_in_one_line(tmp_path_factory, key, value):
    path = tmp_path_factory.mktemp("verl") / "verl_overrides.txt"
    path.write_text(format_overrides(BASE_OVERRIDES) + f"{key}={value}\n")
    try:
        result = check(CheckOptions(path=path, cores=8))
    except UserError as error:
        one_line(error)
        return
    assert result.exit_code in (0, 1)


SPECIAL = "/?#@:[]!$&'()*+,;=% \"\\`{}|^~<>"
PASSWORDS = st.text(alphabet=string.ascii_letters + string.digits + SPECIAL, min_size=4, max_size=24)


@settings(max_examples=200, deadline=None)
@given(password=PASSWORDS)
def test_a_password_with_any_url_special_character_is_redacted(password):
    url = f"postgresql+psycopg2://autotune:{password}@127.0.0.1:1/db"
    assume(password not in url.replace(password, "", 1))  # a password that is also part of the host
    assert password not in redact(url)
    remember_password(url)
    assert password not in scrub(f"connection to {url} failed; password was {password}")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(password=PASSWORDS)
def test_a_storage_that_cannot_be_opened_never_shows_its_password(tmp_path_factory, capsys, password):
    url = f"postgresql+psycopg2://autotune:{password}@127.0.0.1:1/db"
    assume(password not in url.replace(password, "", 1))
    out = tmp_path_factory.mktemp("out")
    assert main(["report", "--study", "s", "--storage", url, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    # The same message for another password: a password that is part of its fixed words ("sqli" in
    # "sqlite:///PATH") is found there without having leaked
    other = url.replace(f":{password}@", ":Zz0Zz0@")
    assert main(["report", "--study", "s", "--storage", other, "--out", str(out)]) == 2
    assume(password not in capsys.readouterr().err)
    assert password not in err and err.count("\n") == 1 and "Traceback" not in err
    assert list(out.iterdir()) == []
