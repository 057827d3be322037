"""One name per idea across commands: a flag that means the same thing in several commands is spelled the same
in each, and its former names still parse (hidden from --help) for a release."""

from __future__ import annotations

import argparse
import re

import pytest

from autotune.cli import build_parser

# idea -> (its one name, names it must not go by in --help, the commands that take it)
IDEAS = {
    "a probe's wall-clock limit": ("--timeout-per-probe", {"--timeout", "--probe-timeout"}, {"run", "probe"}),
    "memory per GPU": ("--memory-budget", {"--memory", "--budget"}, {"run", "probe", "check", "report"}),
    "the card": ("--gpu", {"--card"}, {"run", "probe", "check"}),
    "a JSON answer": ("--json", set(), {"run", "probe", "check", "report", "lengths", "models", "spaces"}),
}


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _shown(parser: argparse.ArgumentParser) -> set[str]:
    """The flags --help shows."""
    return {o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings}


@pytest.mark.parametrize("idea", sorted(IDEAS))
def test_each_idea_has_one_name_in_every_command_that_takes_it(idea):
    name, others, takers = IDEAS[idea]
    commands = _commands()
    for command, parser in commands.items():
        shown = _shown(parser)
        assert not shown & others, (command, shown & others)
        if command in takers:
            assert name in shown, (command, idea)


def test_a_flag_has_one_destination_name_wherever_it_appears():
    """The same flag never stores under two names, nor two flags under one name, across commands."""
    by_flag: dict[str, set[str]] = {}
    by_dest: dict[str, set[str]] = {}
    for parser in _commands().values():
        for action in parser._actions:
            shown = [o for o in action.option_strings if o.startswith("--")]
            if action.help == argparse.SUPPRESS or not shown:
                continue
            for flag in shown:
                by_flag.setdefault(flag, set()).add(action.dest)
                by_dest.setdefault(action.dest, set()).add(flag)
    assert {f: d for f, d in by_flag.items() if len(d) > 1} == {}
    assert {d: f for d, f in by_dest.items() if len(f) > 1 and d != "help"} == {}


def test_the_former_names_still_parse_and_are_hidden():
    parser = build_parser()
    probe = parser.parse_args(["probe", "--timeout", "5"])
    assert probe.timeout_per_probe == 5.0
    check = parser.parse_args(["check", "config.yaml", "--memory", "40"])
    assert check.memory_budget == 40.0
    commands = _commands()
    assert not re.search(r"--timeout(?!-)", commands["probe"].format_help())
    assert not re.search(r"--memory(?!-)", commands["check"].format_help())


def test_a_card_is_a_budget_for_a_run_and_an_unknown_card_names_the_known():
    from autotune.errors import UserError

    parser = build_parser()
    assert parser.parse_args(["run", "--gpu", "a100-40g"]).memory_budget == 40.0
    with pytest.raises(UserError, match=r"unknown GPU 'h999'.*a100-80g"):
        parser.parse_args(["probe", "--gpu", "h999"])
