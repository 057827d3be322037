"""Write the fields `trl grpo --config FILE` reads, with TRL 1.16's types, choices and defaults, to
`autotune/formats/trl_schema.json`.

Source: TRL 1.16's own parser, `trl.scripts.grpo.make_parser()` (TRL's HfArgumentParser over
GRPOScriptArguments, GRPOConfig, ModelConfig and DatasetMixtureConfig), in the .venv `./setup.sh test` makes:
each argparse action's conversion (`type=`), choices and default, as the parser built it from the dataclasses'
annotations; and the names of accelerate's launch options (`trl grpo` hands a config key that no dataclass
has to `accelerate launch`). autotune reads TRL files with this file when TRL is not installed
(autotune/formats/trl_read.py).

    .venv/bin/python tools/trl_schema.py            # writes the file
    .venv/bin/python tools/trl_schema.py --check    # exit 1 if the shipped file differs from TRL's parser
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
import sys
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from autotune.formats.trl_read import SCHEMA_FILE  # noqa: E402

TYPES = {int: "int", float: "float", str: "str"}  # argparse type= → the schema's name


def _plain(value: Any) -> Any:
    """A default as JSON holds it (an enum is its value; what JSON cannot hold is its text)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def _kind(action: argparse.Action) -> tuple[str, bool]:
    """The option's conversion of a text value, and whether "none"/"null" text is None (TRL's own
    trl/scripts/_hf_argparser.py: string_to_bool, _accept_none for `T | None`, make_choice_type_function)."""
    if isinstance(action, argparse._StoreFalseAction):
        return "flag", False  # the `--no_X` twin of a bool that defaults to true: same dest as X
    name = getattr(action.type, "__name__", "")
    nullable = "_accept_none" in getattr(action.type, "__qualname__", "")
    if name == "string_to_bool":
        return "bool", False
    if name in TYPES.values():
        return name, nullable
    if action.choices and action.type is not None:
        return "choice", False  # the text of a choice becomes the choice
    return "other", nullable  # a dict, a dataclass: taken as written


def schema() -> dict[str, Any]:
    try:
        import trl
        from accelerate.commands.launch import launch_command_parser
        from trl.scripts.grpo import make_parser
    except ImportError:
        raise SystemExit("TRL 1.16 is not installed in this python: run ./setup.sh test first") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parser = make_parser(prog="trl grpo")
    owner = {f.name: cls.__name__ for cls in parser.dataclass_types for f in dataclasses.fields(cls)}
    enums = {  # fields TrainingArguments.__post_init__ turns into an enum (refusing a value that is none)
        f.name: kind.__name__
        for cls in parser.dataclass_types
        for f in dataclasses.fields(cls)
        for kind in getattr(f.type, "__args__", (f.type,))
        if isinstance(kind, type) and issubclass(kind, enum.Enum)
    }
    fields: dict[str, Any] = {}
    for action in parser._actions:
        if action.dest == "help" or action.dest in fields:
            continue
        kind, nullable = _kind(action)
        fields[action.dest] = {
            "class": owner[action.dest],
            "type": kind,
            "none": nullable,
            "list": action.nargs == "+",
            "choices": [_plain(c) for c in action.choices] if action.choices else None,
            "enum": enums.get(action.dest),
            "default": _plain(action.default),
        }
    launch = sorted({a.dest for a in launch_command_parser()._actions} - {"help"} | {"accelerate_config"})
    return {
        "source": f"TRL {trl.__version__} trl.scripts.grpo.make_parser() (tools/trl_schema.py writes it)",
        "fields": fields,
        "launch_options": launch,
    }


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--check", action="store_true", help="compare with the shipped file instead")
    args = parser.parse_args()
    text = json.dumps(schema(), indent=1) + "\n"
    if args.check:
        same = SCHEMA_FILE.read_text() == text
        print("trl_schema.json matches TRL's parser" if same else "trl_schema.json differs: regenerate")
        return 0 if same else 1
    SCHEMA_FILE.write_text(text)
    print(f"wrote {SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
