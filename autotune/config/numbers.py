"""Every number a user gives, checked once and the same way: flags, `--set`, search-space YAML, config files.

    parse_int("8", "--gpus", maximum=MAX_RANKS)          # 8; "0", "x", "1e3", "9" * 40 -> UserError
    parse_float("0.5", "--memory-budget")                # 0.5; "nan", "inf", "-1", "1e999" -> UserError
    number_problem(value, integer=True, minimum=1)       # for values YAML already parsed: None or the rule

Non-finite values (nan, inf) are refused everywhere: a nan timeout would mean no timeout at all, a nan
budget a traceback. Upper bounds keep a typo from launching a billion processes or allocating for a year.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any, TypeGuard

from autotune.errors import UserError

__all__ = [
    "MAX_GIB",
    "MAX_INT",
    "MAX_RANKS",
    "MAX_SECONDS",
    "argument",
    "is_int",
    "is_number",
    "number_problem",
    "parse_float",
    "parse_int",
]

MAX_INT = 2**31 - 1  # sizes and counts: what torch indexes with 32-bit integers
MAX_RANKS = 1024  # ranks (GPUs) per probe, or probes at a time: each is a process
MAX_SECONDS = 30 * 86400.0  # timeouts and time budgets: a month
MAX_GIB = 1024.0**2  # memory budgets: a PiB per rank is no budget


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def number_problem(
    value: Any,
    integer: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    open_minimum: bool = False,
    open_maximum: bool = False,
) -> str | None:
    """What is wrong with an already parsed number (a YAML value), as a rule; None when it is fine.

    Whole numbers are always bounded by MAX_INT (said only when that is what is broken)."""
    kind = "a whole number" if integer else "a number"
    if not (is_int(value) if integer else is_number(value)):
        finite = isinstance(value, float) and not integer
        return "must be a finite number" if finite else f"must be {kind}"
    implicit = integer and maximum is None
    maximum = MAX_INT if implicit else maximum
    low_ok = minimum is None or (value > minimum if open_minimum else value >= minimum)
    high_ok = maximum is None or (value < maximum if open_maximum else value <= maximum)
    if low_ok and high_ok:
        return None
    bounds = []
    if minimum is not None:
        bounds.append(f"{'>' if open_minimum else '>='} {_shown(minimum)}")
    if maximum is not None and not (implicit and high_ok):
        bounds.append(f"{'<' if open_maximum else '<='} {_shown(maximum)}")
    return f"must be {kind} " + " and ".join(bounds)


def _shown(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def parse_int(text: str, what: str, minimum: int | None = 1, maximum: int | None = None) -> int:
    """A whole number from the command line, within [minimum, maximum] (MAX_INT by default); else a
    UserError."""
    try:
        value = int(text.strip())
    except (ValueError, AttributeError):
        raise UserError(f"{what}: expected a whole number, but got {text!r}") from None
    _refuse(number_problem(value, True, minimum, maximum), what, text)
    return value


def parse_float(
    text: str,
    what: str,
    minimum: float | None = 0.0,
    maximum: float | None = None,
    open_minimum: bool = True,
) -> float:
    """A finite number from the command line, within the bounds (> minimum by default); else a UserError."""
    try:
        value = float(text.strip())
    except (ValueError, AttributeError):
        raise UserError(f"{what}: expected a number, but got {text!r}") from None
    _refuse(number_problem(value, False, minimum, maximum, open_minimum), what, text)
    return value


def _refuse(problem: str | None, what: str, text: str) -> None:
    if problem is not None:
        raise UserError(f"{what}: {problem}, but got {text!r}")


def argument(parse: Callable[..., Any], **bounds: Any) -> Callable[[str], Any]:
    """An argparse `type=` from `parse_int`/`parse_float` with bounds; argparse names the flag itself."""

    def convert(text: str) -> Any:
        try:
            return parse(text, "value", **bounds)
        except UserError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("value: ")) from None

    convert.__name__ = parse.__name__.removeprefix("parse_")  # argparse says "invalid int value" on errors
    return convert
