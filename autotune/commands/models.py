"""`autotune models`: the registry's model names."""

from __future__ import annotations

import argparse
import json

from autotune.commands.arguments import EXIT_OK, add_command

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = add_command(
        sub,
        "models",
        "list the registry's model names with parameter counts",
        "The model names --model and --reward-model accept (besides a local Hugging Face "
        "model directory): role, architecture, parameters, layers, hidden size and vocabulary. On a "
        "terminal a table; in a pipe plain columns, one model a line.",
        ["autotune models", "autotune models --json"],
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list, one object per model")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # listing, not registry: the list needs neither torch nor transformers (seconds to import)
    from autotune.models.listing import model_rows, print_model_table

    rows = model_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_model_table(rows)
    return EXIT_OK
