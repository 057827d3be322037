"""`autotune spaces`: the shipped search spaces."""

from __future__ import annotations

import argparse
import json

from autotune.commands.arguments import EXIT_OK, add_command

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = add_command(
        sub,
        "spaces",
        "list the shipped search spaces (`autotune run --space NAME`)",
        "The search spaces shipped with autotune, one a line: name, model and GPUs, "
        "description. `autotune run --space NAME` uses one; --space also takes a YAML file of your own.",
        ["autotune spaces", "autotune spaces --json"],
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list, one object per space (name, description, model, reward_model, gpus, "
        "memory_budget_gib, path)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autotune.space.shipped import space_lines, space_rows

    rows = space_rows()
    print(json.dumps(rows, indent=2) if args.json else space_lines(rows))
    return EXIT_OK
