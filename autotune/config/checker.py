"""One way to validate YAML (search spaces, config files): collect every mistake, then report them at once.

    check = Checker("space.yaml")
    gpus = check.integer("gpus", data.get("gpus", 1), minimum=1)   # None when wrong, the mistake recorded
    for key, guess in check.unknown_keys("knobs", data["knobs"], KNOBS): ...   # recorded as errors
    if check.errors: raise SpaceError(check.errors)    # "space.yaml: gpus=0: must be a whole number >= 1"

`unknown_keys(..., record=False)` only returns the unknown keys, for a caller that reports them another way
(`autotune check` makes them findings: a typo must not hide the other problems).
"""

from __future__ import annotations

import difflib
from typing import Any

import yaml

from autotune.config.numbers import number_problem

__all__ = ["MISSING", "Checker", "show"]

MISSING = object()  # a key the file does not have


class Checker:
    """Collects every mistake as `<source>: <key.path>=<value>: <rule>` (no prefix when `source` is "")."""

    def __init__(self, source: str):
        self.source = source
        self.errors: list[str] = []

    def error(self, path: str, value: Any, rule: str) -> None:
        where = f"{path}={show(value)}" if path else show(value)
        if value is MISSING:
            where = path
        self.errors.append(f"{self.source}: {where}: {rule}" if self.source else f"{where}: {rule}")

    def unknown_keys(
        self, path: str, data: dict, known: tuple[str, ...], hint: str = "", record: bool = True
    ) -> list[tuple[str, str | None]]:
        """(full key, closest known key or None) for every key of `data` not in `known`."""
        unknown = []
        for key in data:
            if key in known:
                continue
            close = difflib.get_close_matches(str(key), known, n=1)
            full = f"{path}.{key}" if path else str(key)
            unknown.append((full, close[0] if close else None))
            if record:
                guess = f" (did you mean {close[0]}?)" if close else ""
                self.error(full, data[key], f"unknown key{guess}; known keys: {', '.join(known)}{hint}")
        return unknown

    def integer(
        self, path: str, value: Any, minimum: int | None = None, maximum: int | None = None
    ) -> int | None:
        problem = number_problem(value, True, minimum, maximum)
        if problem:
            self.error(path, value, problem)
            return None
        return value

    def number(
        self,
        path: str,
        value: Any,
        low: float | None = None,
        high: float | None = None,
        open_low: bool = True,
        open_high: bool = False,
    ) -> float | None:
        problem = number_problem(value, False, low, high, open_low, open_high)
        if problem:
            self.error(path, value, problem)
            return None
        return float(value)

    def text(self, path: str, value: Any, required: bool = False) -> str | None:
        if not isinstance(value, str) or (required and not value.strip()):
            self.error(path, value, "must be a non-empty string" if required else "must be a string")
            return None
        return value

    def boolean(self, path: str, value: Any) -> bool | None:
        if not isinstance(value, bool):
            self.error(path, value, "must be true or false")
            return None
        return value

    def mapping(self, path: str, value: Any) -> dict | None:
        if not isinstance(value, dict):
            self.error(path, value, "must be a mapping (key: value, ...)")
            return None
        return value


def show(value: Any) -> str:
    """A value as the YAML file spells it, shortened."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # quoted where YAML would read it as something else ("4", "true", "", "a\nb")
        plain = value.strip() and value.isprintable() and isinstance(_plain_yaml(value), str)
        return value if plain else repr(value)
    if isinstance(value, (dict, list)):
        text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1_000_000).strip()
    else:
        text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _plain_yaml(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
