"""`autotune lengths`: token lengths of a dataset and the lengths they suggest."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune.commands.arguments import EXIT_OK, add_command

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = add_command(
        sub,
        "lengths",
        "token lengths of a dataset and the max_prompt/response_length they suggest",
        "Tokenize a JSON lines, JSON, Parquet or CSV file with the model's tokenizer; print the "
        "length percentiles, max_prompt_length (p95) and max_response_length (p90) rounded up to a "
        "multiple of 8, and the share each would truncate. Exit 2 for bad input.",
        [
            "autotune lengths data/train.jsonl --model qwen2.5-7b",
            "autotune lengths data/train.parquet --model llama-2-7b --prompt-key question --json",
        ],
    )
    parser.add_argument("data", type=Path, help="a .jsonl, .json, .parquet or .csv file")
    parser.add_argument("--model", required=True, help="registry name or a local model directory")
    parser.add_argument("--prompt-key", help="prompt column (default: prompt, question, instruction, ...)")
    parser.add_argument("--response-key", help="response column (default: response, answer, output, ...)")
    parser.add_argument("--percentiles", default="50,90,95,99", help="comma-separated (default 50,90,95,99)")
    parser.add_argument("--json", action="store_true", help="print a JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autotune.data.lengths import measure_lengths, parse_percentiles, print_report

    percentiles = parse_percentiles(args.percentiles)
    report = measure_lengths(args.data, args.model, args.prompt_key, args.response_key, percentiles)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report)
    return EXIT_OK
