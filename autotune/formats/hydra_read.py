"""Hydra override lines read with hydra-core's own parser, as `python -m verl.trainer.main_ppo` reads them.

    values, findings = read_lines([Line(1, "data.max_response_length=16_384")], where="run.sh")
    values["data.max_response_length"]      # 16384

Values are Hydra's typed values: `True`/`false` booleans, `null` None, `16_384` an int, quotes text, `[a,b]`
lists, `${...}` an interpolation (followed by autotune.formats.verl_schema where a value is needed). Keys are
stored as Hydra composes them into verl's struct config (verl_keys.txt): `key` and `++key` set a key verl has;
`+key` and `++key` add one it lacks (stored as `+key`, the name the export writes); a later duplicate wins;
`~key` removes the key (refused for a key autotune reads: verl's fallback without it is not modelled). What
Hydra refuses at composition (an unknown key, `+` on an existing key, `~` of a missing one) is a finding; a
line Hydra cannot parse, or a value of the wrong type for a key autotune reads
(verl_schema.json), is a UserError naming the line and the value: nothing can be read from it.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.config.rules import Finding
from autotune.errors import UserError, single_line
from autotune.formats import verl_schema

if TYPE_CHECKING:
    from hydra.core.override_parser.overrides_parser import OverridesParser

__all__ = ["Line", "parse_value", "read_lines"]


@dataclass(frozen=True)
class Line:
    """One override, as Hydra receives it, and where it came from (1-based line of the file)."""

    number: int
    text: str


@functools.cache
def _parser() -> OverridesParser:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse_value(text: str) -> Any:
    """A value in Hydra's grammar (`16_384` -> 16384, `False` -> False); ValueError when Hydra refuses it."""
    from hydra.errors import HydraException

    try:
        return _parser().parse_override(f"x={text}").value()
    except HydraException as exc:
        raise ValueError(_reason(exc)) from None


def _reason(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]


def read_lines(lines: list[Line], where: str, known: frozenset[str]) -> tuple[dict[str, Any], list[Finding]]:
    """The overrides' values by key (see the module docstring) and what verl's struct config would refuse.
    `known`: every key of verl's composed config."""
    from hydra.errors import HydraException

    values: dict[str, Any] = {}
    findings: list[Finding] = []
    for line in lines:
        try:
            override = _parser().parse_override(line.text)
        except HydraException as exc:
            raise UserError(
                f"{where}:{line.number}: {single_line(line.text)!r} is not a Hydra override: {_reason(exc)}"
            ) from None
        key = override.key_or_group
        if override.package is not None or "/" in key:
            raise UserError(
                f"{where}:{line.number}: {single_line(line.text)!r}: a config group or package override; "
                f"autotune reads verl's default trainer config (ppo_trainer) with key=value overrides only"
            )
        value = None if override.is_delete() else override.value()
        _check_type(line, key, value, where)
        name, finding = _compose(override, key, known, values, line, where)
        if finding is not None:
            findings.append(finding)
        values.pop(name, None)  # a later duplicate wins, and takes the later place
        if override.is_delete():
            if verl_schema.kind(key):  # verl then falls back in its own code, key by key: not modelled
                raise UserError(
                    f"{where}:{line.number}: {single_line(line.text)!r}: autotune reads {key}, and cannot "
                    f"tell what verl does without it; set a value instead"
                )
            continue
        values[name] = value
    return values, findings


def _check_type(line: Line, key: str, value: Any, where: str) -> None:
    if isinstance(value, str) and not value.strip() and verl_schema.kind(key):
        raise UserError(f"{where}:{line.number}: {single_line(line.text)!r}: an empty value for {key}")
    wrong = verl_schema.type_error(key, value)
    if wrong:
        raise UserError(f"{where}:{line.number}: {single_line(line.text)!r}: {key}={value!r} is {wrong}")


def _compose(
    override: Any, key: str, known: frozenset[str], values: dict[str, Any], line: Line, where: str
) -> tuple[str, Finding | None]:
    """The name the value is stored under, and Hydra's refusal when composing it into verl's struct config
    (hydra/_internal/config_loader_impl.py `_apply_overrides_to_config`)."""
    exists = key in known
    at = f"{where}:{line.number}"
    if override.is_delete():
        if exists or f"+{key}" in values:
            return (key if exists else f"+{key}"), None
        return key, _refused(at, key, f"~{key}: Hydra cannot delete a key verl's config does not have", known)
    if override.is_add():
        if exists:
            problem = f"+{key}: verl's config has {key} already, and Hydra refuses to add it again"
            return key, Finding("verl", f"{at}: {problem}", f"write {key}=... (or ++{key}=...)", key=key)
        return f"+{key}", None
    if override.is_force_add():
        return (key if exists else f"+{key}"), None
    if exists:
        return key, None
    return key, _refused(
        at, key, f"unknown key {key}: verl 0.9.1's config has no such key, so verl refuses the file", known
    )


def _refused(at: str, key: str, problem: str, known: frozenset[str]) -> Finding:
    """A key verl's config lacks, with the closest one it has."""
    parent = key.rpartition(".")[0]
    siblings = [k for k in known if k.rpartition(".")[0] == parent] or sorted(known)
    close = difflib.get_close_matches(key, siblings, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    fix = f"rename it to {close[0]}" if close else "remove it, or write +key=value to add a key on purpose"
    return Finding("verl", f"{at}: {problem}{hint}", fix, key=key)
