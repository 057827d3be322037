"""A launch script's `--config-path/--config-name` YAML as Hydra override lines, before the command line's.

    lines = config_file_lines("/home/me/verl/examples/sglang_multiturn/config", "gsm8k_multiturn_grpo",
                              where="run.sh", line=40)
    lines[0]        # Line(40, "++data.max_prompt_length=1024"): one `++key=value` per leaf, in file order

verl's `main_ppo` composes the named file as Hydra does: its `defaults: [ppo_trainer, _self_]` puts the file's
settings over verl's ppo_trainer config, and the command line's overrides over both. Written as `++` lines
placed before the command line's, the file's leaves compose the same way (a mapping merges key by key, a
list or scalar replaces, `${...}` stays an interpolation); its `hydra:` section is Hydra's own and is skipped,
and so is a `???` leaf (merged over a value, it leaves the value). The file is loaded by OmegaConf, as Hydra
loads it. A relative `--config-path` is read from verl/trainer/, as Hydra reads it: `config` is verl's own
config dir, where autotune reads ppo_trainer (no lines) and nothing else. Anything else a file cannot be read
as (defaults naming another config, `_self_` before ppo_trainer, a key or value Hydra's grammar cannot write)
is a UserError naming the file.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from pathlib import Path, PurePath
from typing import Any

from autotune.errors import UserError, single_line
from autotune.formats.hydra_read import Line, parse_value

__all__ = ["config_file_lines"]

_BASE = "ppo_trainer"
_SELF = "_self_"
_MAIN_DIR = "verl/trainer"  # main_ppo.py's folder: Hydra resolves a relative --config-path from there
_VERL_DIRS = ("pkg://verl.trainer.config", "pkg://verl/trainer/config")
_KEY = re.compile(r"[A-Za-z_$][A-Za-z0-9_$-]*")  # Hydra's KEY_SPECIAL: one part of a dotted key
_FIX_DEFAULTS = f"write `defaults: [{_BASE}, {_SELF}]` (autotune reads verl's {_BASE} and files built on it)"


def config_file_lines(config_path: str | None, config_name: str | None, where: str, line: int) -> list[Line]:
    """The file's settings as `++key=value` lines numbered `line` (the command's line in `where`), in file
    order; [] for verl's own ppo_trainer. See the module docstring."""
    at = f"{where}:{line}"
    if config_path is None or _is_verl_dir(config_path):
        if config_name is None or _stem(config_name) == _BASE:
            return []
        raise UserError(
            f"{at}: --config-name={single_line(config_name)!r} names verl's own {_stem(config_name)} config, "
            f"which autotune does not read; use --config-name={_BASE}, or a YAML file of your own with "
            f"`defaults: [{_BASE}, {_SELF}]` and an absolute --config-path"
        )
    if not os.path.isabs(config_path):
        raise UserError(
            f"{at}: --config-path={single_line(config_path)!r}: Hydra reads a relative path from verl's "
            f"{_MAIN_DIR}/ folder, where autotune reads {_BASE} alone; give the absolute path of the folder "
            f"that holds the YAML file (autotune reads {_BASE} and files built on it)"
        )
    path = Path(config_path) / _file_name(config_name or _BASE)
    settings = _load(path, at)
    _check_defaults(settings.pop("defaults", None), path, at)
    settings.pop("hydra", None)
    return [Line(line, text) for text in _overrides(settings, "", path, at)]


def _is_verl_dir(config_path: str) -> bool:
    """verl's own config dir, as Hydra finds it from main_ppo.py (`config`, `./config`, `pkg://...`), or an
    absolute path that ends in verl/trainer/config."""
    if config_path in _VERL_DIRS:
        return True
    if os.path.isabs(config_path):
        return PurePath(config_path).parts[-3:] == ("verl", "trainer", "config")
    return posixpath.normpath(posixpath.join(_MAIN_DIR, config_path)) == f"{_MAIN_DIR}/config"


def _stem(name: str) -> str:
    return name.removesuffix(".yaml").removesuffix(".yml")


def _file_name(name: str) -> str:
    """As Hydra's FileConfigSource: `.yaml` added unless the name ends in it (or `.yml`, version 1.1)."""
    return name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"


def _load(path: Path, at: str) -> dict[Any, Any]:
    """The file as Hydra loads it (OmegaConf.load), interpolations kept as written."""
    import yaml
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not path.is_file():
        raise UserError(
            f"{at}: no such config file {single_line(str(path))!r}; fix --config-path or --config-name"
        )
    try:
        with path.open(encoding="utf-8") as file:
            loaded = OmegaConf.load(file)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError, OmegaConfBaseException) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise UserError(
            f"{at}: {single_line(str(path))!r} is not readable YAML: {reason}; fix the file"
        ) from None
    if not isinstance(loaded, DictConfig):
        raise UserError(
            f"{at}: {single_line(str(path))!r}: its top level is a {type(loaded).__name__}, not a mapping of "
            f"settings; write it as `key: value` lines with `defaults: [{_BASE}, {_SELF}]`"
        )
    container = OmegaConf.to_container(loaded, resolve=False)
    assert isinstance(container, dict)
    return container


def _check_defaults(defaults: Any, path: Path, at: str) -> None:
    """Only [ppo_trainer] or [ppo_trainer, _self_]: the file's settings over verl's (with version_base=None an
    absent `_self_` comes last)."""
    file = single_line(str(path))
    entries = defaults if isinstance(defaults, list) else [defaults]
    names = [_stem(e) if isinstance(e, str) and _stem(e) == _BASE else e for e in entries]
    other = [e for e in names if e not in (_BASE, _SELF)]
    if defaults is None or _BASE not in names:
        shown = "" if defaults is None else f" ({single_line(repr(defaults))})"
        raise UserError(
            f"{at}: {file!r}: its defaults{shown} do not name {_BASE}, so Hydra composes the file without "
            f"verl's config; {_FIX_DEFAULTS}"
        )
    if other:
        raise UserError(
            f"{at}: {file!r}: defaults entry {single_line(repr(other[0]))} is a config autotune does not "
            f"read; move its settings into the file and {_FIX_DEFAULTS}"
        )
    if names not in ([_BASE], [_BASE, _SELF]):
        problem = f"{_SELF} comes before {_BASE}, so verl's defaults override the file's settings"
        if names.count(_BASE) > 1 or names.count(_SELF) > 1:
            problem = "an entry is repeated"
        raise UserError(f"{at}: {file!r}: defaults {single_line(repr(defaults))}: {problem}; {_FIX_DEFAULTS}")


def _overrides(settings: dict[Any, Any], prefix: str, path: Path, at: str) -> list[str]:
    """One `++dotted.key=value` per leaf; a nested mapping is flattened, an empty one is `{}`."""
    texts: list[str] = []
    for key, value in settings.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise UserError(
                f"{at}: {single_line(str(path))!r}: key {single_line(repr(key))} under "
                f"{prefix.rstrip('.') or 'the top level'}: Hydra's override grammar cannot write it; "
                f"rename it (letters, digits, _, - and $)"
            )
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            texts.extend(_overrides(value, f"{dotted}.", path, at))
        elif value != "???":  # OmegaConf's missing value: merged over a value, it leaves the value
            texts.append(f"++{dotted}={_checked(value, dotted, path, at)}")
    return texts


def _checked(value: Any, key: str, path: Path, at: str) -> str:
    """`value` in Hydra's override grammar, checked to parse back to exactly `value`."""
    try:
        text = _written(value)
        same = _same(parse_value(text), value)
    except ValueError:
        same = False
    if not same:
        raise UserError(
            f"{at}: {single_line(str(path))!r}: {key}: {single_line(repr(value))[:200]} cannot be written as "
            f"a Hydra override; set it on the command line instead"
        )
    return text


def _written(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # 0.6, 1e-06, inf, nan: Hydra's FLOAT
    if isinstance(value, str):
        from hydra.core.override_parser.types import Quote, QuotedString

        return QuotedString(text=value, quote=Quote.single).with_quotes()  # `${...}` is kept: OmegaConf's
    if isinstance(value, list):
        return "[" + ",".join(_written(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{_written(item)}" for key, item in value.items()) + "}"
    raise ValueError(f"a {type(value).__name__}")


def _same(parsed: Any, value: Any) -> bool:
    """Equal, and of the same types throughout (True is not 1, 1.0 is not 1)."""
    if type(parsed) is not type(value):
        return False
    if isinstance(value, float) and math.isnan(value):
        return math.isnan(parsed)
    if isinstance(value, list):
        return len(parsed) == len(value) and all(map(_same, parsed, value))
    if isinstance(value, dict):
        return list(parsed) == list(value) and all(_same(parsed[key], value[key]) for key in value)
    return bool(parsed == value)
