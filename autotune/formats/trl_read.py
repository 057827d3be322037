"""Read a TRL config (the YAML `trl grpo --config FILE` takes) as TRL 1.16 reads it.

    values = parse_trl(data, where="trl_config.yaml")   # every field, after GRPOConfig's own checks
    values["per_device_train_batch_size"]               # "4" in the file is 4, as TRL makes it

`trl grpo` (trl/cli/commands/training.py, trl/scripts/utils.py TrlParser) sets each key of the file as the
default of its argparse option (TRL's HfArgumentParser, trl/scripts/_hf_argparser.py, over
GRPOScriptArguments, GRPOConfig, ModelConfig and DatasetMixtureConfig), parses no arguments, and builds the
dataclasses, whose __post_init__ checks them. So a text value is converted by the option's `type=` (int,
float, string_to_bool, "none" as None for an optional number, a choice) and any other value is taken as
written; a key that no dataclass has goes to `accelerate launch` as an option, which refuses what it does not
know. Where TRL is importable, its own parser does all of that (the path the tests prove); elsewhere the same
rules run over `trl_schema.json` (written from TRL's parser by tools/trl_schema.py). Either way a refusal is
a UserError: one line naming the file, the field and the value.

On top of TRL, autotune refuses a value TRL would carry in the wrong type (`num_generations: 8.0`, `bf16: 1`,
a choice that is not one), which TRL's parser lets through to fail or mislead later.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import io
import json
import re
import warnings
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from autotune.errors import UserError
from autotune.swap import swapped

__all__ = ["SCHEMA_FILE", "fields", "launch_options", "parse_trl", "trl_importable"]

SCHEMA_FILE = Path(__file__).with_name("trl_schema.json")
NOT_IN_TRL_1_16 = {  # fields older TRL had, with what 1.16 does instead
    "max_prompt_length": "TRL 1.16 does not truncate prompts (the field was removed)",
}


@functools.cache
def _schema() -> dict[str, Any]:
    text = resources.files("autotune.formats").joinpath("trl_schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def fields() -> dict[str, dict[str, Any]]:
    """Every field `trl grpo` reads: its dataclass, conversion ("int", "float", "bool", "str", "choice",
    "flag", "other"), whether it is a list, its choices, its enum and its default."""
    result: dict[str, dict[str, Any]] = _schema()["fields"]
    return result


def launch_options() -> frozenset[str]:
    """Keys `trl grpo` hands to `accelerate launch` (plus TRL's own `accelerate_config`)."""
    return frozenset(_schema()["launch_options"])


@functools.cache
def trl_importable() -> bool:
    try:
        import trl.scripts.grpo  # noqa: F401
    except Exception:
        return False
    return True


def parse_trl(data: dict[str, Any], where: str, use_trl: bool | None = None) -> dict[str, Any]:
    """Every field's value as `trl grpo --config` would set it (GRPOConfig's __post_init__ applied on one
    process), or a UserError in TRL's words. `use_trl`: TRL's own parser (default: when importable) or the
    shipped schema's rules."""
    data = dict(data)
    data_of = dict(data)
    env = data.pop("env", {})
    if not isinstance(env, dict):  # TrlParser.parse_args_and_config
        raise UserError(f"config '{where}': env={env!r}: `env` field should be a dict in the YAML file.")
    known = fields()
    unknown = [key for key in data if key not in known and key not in launch_options()]
    data = {key: value for key, value in data.items() if key in known}
    found = ([_unknown(unknown, data_of)] if unknown else []) + _conversions(data)
    if len(found) > 1 or unknown:  # every problem at once (TRL's parser stops at its first)
        raise UserError(f"config '{where}': " + "; ".join(found))
    use_trl = trl_importable() if use_trl is None else use_trl
    try:
        values = _by_trl(data) if use_trl else _by_schema(data)
    except _Refused as exc:
        names = exc.names or _named(str(exc), data) or sorted(data)
        shown = ", ".join(f"{name}={_shown(data, exc.values, name)}" for name in names)
        raise UserError(f"config '{where}': {shown}: TRL refuses it: {_one_line(str(exc))}") from None
    for name, value in data.items():
        problem = _wrong_type(name, values[name])
        if problem:
            raise UserError(f"config '{where}': {name}={value!r}: {problem}")
    return values


def _unknown(unknown: list[str], data: dict[str, Any]) -> str:
    shown = ", ".join(f"{key}={data[key]!r}" for key in unknown)
    why = [NOT_IN_TRL_1_16[key] for key in unknown if key in NOT_IN_TRL_1_16]
    for key in unknown:
        close = difflib.get_close_matches(key, [*fields(), *launch_options()], n=1, cutoff=0.8)
        if close and key not in NOT_IN_TRL_1_16:
            why.append(f"fix: {close[0]} for {key}?")
    return (
        f"{shown}: Some keys are not used by the HfArgumentParser: {sorted(unknown)} (not a field of TRL "
        f"1.16's GRPOConfig, ModelConfig or script arguments, nor an accelerate launch option"
        f"{'; ' + '; '.join(why) if why else ''})"
    )


def _conversions(data: dict[str, Any]) -> list[str]:
    """Each value TRL's parser cannot convert (its option's `type=`, as the schema says), in TRL's words."""
    found = []
    for name, value in data.items():
        try:
            _convert(name, value)
        except _Refused as exc:
            found.append(f"{name}={value!r}: TRL refuses it: {_one_line(str(exc))}")
    return found


class _Refused(Exception):
    def __init__(self, message: str, names: list[str] | None = None, values: dict[str, Any] | None = None):
        super().__init__(message)
        self.names = names or []
        self.values = values or {}


def _shown(data: dict[str, Any], derived: dict[str, Any], name: str) -> str:
    if name in data:
        return repr(data[name])
    return f"{derived[name]!r} (derived)" if name in derived else "(TRL's default)"


def _named(message: str, data: dict[str, Any]) -> list[str]:
    """The fields a message names: those of the file first, in the message's order."""
    found = [m.group(1) for m in re.finditer(r"\b([a-z][a-z0-9_]*)\b", message) if m.group(1) in fields()]
    ordered = list(dict.fromkeys(found))
    return [n for n in ordered if n in data] + [n for n in ordered if n not in data]


def _one_line(text: str) -> str:
    return " ".join(text.split())[:400]


# --- TRL's own parser --------------------------------------------------------------------------------------


@contextlib.contextmanager
def _as_on_a_gpu() -> Iterator[None]:
    """TrainingArguments refuses bf16 where this machine has no GPU; the file is judged for the machine it is
    for, so its bf16 is checked as a GPU would take it (the machine's own check is TRL's at launch)."""
    import transformers.training_args as training_args

    # TrainingArguments.__post_init__ asks its module's function, by name, whether this machine's GPU takes
    # bf16 (transformers/training_args.py: `if not self.use_cpu and not is_torch_bf16_gpu_available() and
    # not is_torch_xla_available()`), and no field of the file can answer for the machine it is for: the
    # module's name answers yes while TRL's parser runs, then is what it was.
    with swapped(training_args, "is_torch_bf16_gpu_available", lambda *_, **__: True):
        yield


def _by_trl(data: dict[str, Any]) -> dict[str, Any]:
    from trl.scripts.grpo import make_parser

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        parser = make_parser(prog="trl grpo")

        def error(message: str) -> None:
            match = re.match(r"argument --([A-Za-z0-9_]+)", message)
            raise _Refused(message, [match.group(1)] if match else [])

        parser.error = error  # argparse would print and exit
        parser.set_defaults_with_config(**data)
        try:
            with _as_on_a_gpu(), contextlib.redirect_stderr(io.StringIO()):
                *outputs, _ = parser.parse_args_into_dataclasses(args=[], return_remaining_strings=True)
        except _Refused:
            raise
        except Exception as exc:  # a dataclass's __post_init__: TRL's own check
            said = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            raise _Refused(said) from None
    import dataclasses
    import enum

    values: dict[str, Any] = {}
    for output in outputs:
        for f in dataclasses.fields(output):
            value = getattr(output, f.name)
            values[f.name] = value.value if isinstance(value, enum.Enum) else value
    return values


# --- the same rules over the shipped schema ----------------------------------------------------------------


def string_to_bool(v: str) -> bool:
    """trl/scripts/_hf_argparser.py string_to_bool (TRL's copy of transformers' parser)."""
    if v.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if v.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {v} but expected one of yes/no, true/false, t/f, y/n, 1/0 "
        "(case insensitive)."
    )


_CONVERT: dict[str, Any] = {"int": int, "float": float, "bool": string_to_bool}


def _option(name: str) -> str:
    dashed = name.replace("_", "-")
    return f"--{name}" + (f"/--{dashed}" if dashed != name else "")


def _convert(name: str, value: Any) -> Any:
    """argparse's conversion of a text default (`_get_value`): the option's type, as TRL's parser
    (trl/scripts/_hf_argparser.py) set it; choices are not checked; a value that is not text is kept."""
    spec = fields()[name]
    if not isinstance(value, str):
        return value
    kind = spec["type"]
    if kind == "choice":
        return value  # make_choice_type_function maps a choice's text to the choice: the same text here
    if spec["none"] and value.lower() in ("none", "null"):  # TRL's _accept_none, for `T | None`
        return None
    convert = _CONVERT.get(kind)
    if convert is None:
        return value
    try:
        return convert(value)
    except argparse.ArgumentTypeError as exc:
        raise _Refused(f"argument {_option(name)}: {exc}", [name]) from None
    except (TypeError, ValueError):
        said = f"argument {_option(name)}: invalid {convert.__name__} value: {value!r}"
        raise _Refused(said, [name]) from None


def _by_schema(data: dict[str, Any]) -> dict[str, Any]:
    v = {name: spec["default"] for name, spec in fields().items()}
    v.update({name: _convert(name, value) for name, value in data.items()})
    # transformers TrainingArguments.__post_init__: the deprecated alias, then the enums
    if v["activation_checkpointing"] is None and v["gradient_checkpointing"] is not None:
        v["activation_checkpointing"] = v["gradient_checkpointing"]
    v["gradient_checkpointing"] = v["activation_checkpointing"]
    if v["activation_checkpointing"] is None:
        v["activation_checkpointing"] = v["gradient_checkpointing"] = False
    for name, spec in fields().items():
        if spec["enum"] and spec["choices"] and v[name] not in spec["choices"]:
            raise _Refused(
                f"{v[name]} is not a valid {spec['enum']}, please select one of {spec['choices']}", [name]
            )
    # trl/trainer/base_config.py _BaseConfig.__post_init__
    if v["bf16"] is None:
        v["bf16"] = not v["fp16"]
    try:
        _grpo_rules(v)
    except (TypeError, ArithmeticError) as exc:  # a value of the wrong type, or 0, met TRL's arithmetic
        raise _Refused(f"{type(exc).__name__}: {exc}") from None
    return v


def _grpo_rules(v: dict[str, Any]) -> None:
    """trl/trainer/grpo_config.py GRPOConfig.__post_init__ (TRL 1.16): its checks in order, one process."""
    if v["log_completions_hub_repo"] is not None and not v["log_completions"]:
        raise _Refused(
            "log_completions_hub_repo is set, but log_completions is False. Enable log_completions to upload "
            "completions to the Hub, or unset log_completions_hub_repo."
        )
    if v["auto_find_batch_size"]:
        raise _Refused(
            "auto_find_batch_size is not supported by GRPO, because the generation batch must contain full "
            "prompt groups of num_generations completions, and reducing the batch size on out-of-memory "
            "breaks this invariant. Set auto_find_batch_size=False and lower per_device_train_batch_size "
            "instead."
        )
    micro, steps, generation = (
        v["per_device_train_batch_size"],
        v["steps_per_generation"],
        v["generation_batch_size"],
    )
    if generation is None and steps is None:
        v["steps_per_generation"] = v["gradient_accumulation_steps"]
        v["generation_batch_size"] = micro * v["steps_per_generation"]
    elif generation is not None and steps is None:
        if generation % micro != 0:
            raise _Refused(
                f"generation_batch_size ({generation}) must be divisible by the global batch size ({micro})."
            )
        v["steps_per_generation"] = generation // micro
    elif generation is None and steps is not None:
        v["generation_batch_size"] = micro * steps
    else:
        raise _Refused(
            "'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time"
        )
    if v["do_eval"] and v["eval_strategy"] != "no":
        generations = v["num_generations_eval"] or v["num_generations"]
        if v["per_device_eval_batch_size"] % generations != 0:
            raise _Refused(
                f"The global eval batch size ({v['per_device_eval_batch_size']} * 1) must be divisible by "
                f"the number of generations used for evaluation ({generations})."
            )
    if v["generation_batch_size"] % v["num_generations"] != 0:
        raise _Refused(
            f"generation_batch_size ({v['generation_batch_size']}) must be divisible by num_generations "
            f"({v['num_generations']}).",
            values={"generation_batch_size": v["generation_batch_size"]},
        )
    if v["num_generations"] < 2:
        raise _Refused(
            "GRPO requires at least 2 generations per prompt to calculate the advantages. You provided "
            f"{v['num_generations']}, which is less than the minimum required."
        )


# --- what autotune refuses on top of TRL -------------------------------------------------------------------

_WANTS = {
    "int": ("a whole number", lambda x: isinstance(x, int) and not isinstance(x, bool)),
    "float": ("a number", lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)),
    "bool": ("true or false", lambda x: isinstance(x, bool)),
}


def _wrong_type(name: str, value: Any) -> str | None:
    """Why a value TRL carried is not what its field declares (None: it is, or the field takes anything)."""
    spec = fields()[name]
    if value is None or (spec["list"] and isinstance(value, list)):
        return None
    if spec["type"] in _WANTS:
        said, ok = _WANTS[spec["type"]]
        if not ok(value):
            return f"TRL's {spec['class']} wants {said} here; TRL would carry this value as it is"
    if spec["choices"] and isinstance(value, str) and value not in spec["choices"]:
        return f"not one of TRL's choices: {', '.join(map(str, spec['choices']))}"
    return None
