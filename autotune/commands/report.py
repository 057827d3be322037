"""`autotune report`: write the report of a study."""

from __future__ import annotations

import argparse
from pathlib import Path

from autotune.commands.arguments import COUNT, GIB, add_command, add_engine_arguments, options_from

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = add_command(
        sub,
        "report",
        "write the report of a study (finished or still running)",
        "Pick the recommended configuration of a study and write best_config.yaml, "
        "verl_overrides.txt (or trl_config.yaml), trials.csv, report.md, report.html and summary.json "
        "into <out>/<study>/. "
        "Exit 0 when a feasible configuration was written, 1 when none is feasible.",
        [
            "autotune report --study my-study",
            "autotune report --study my-study --confirm --memory-budget 40",
        ],
    )
    parser.add_argument("--study", required=True, help="study name")
    parser.add_argument("--storage", help="Optuna storage URL (default: sqlite in <out>/<study>/study.db)")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="output folder (default: reports)")
    parser.add_argument(
        "--memory-budget",
        type=GIB,
        metavar="GIB",
        help="judge feasibility against this budget instead of the study's",
    )
    parser.add_argument(
        "--confirm",
        action="store_true",
        help="re-probe the winner and the hand-made configs in turn, twice each, with more iterations first: "
        "their figures become the report's headline and gain (in every file); if the winner fails, take the "
        "next one",
    )
    parser.add_argument(
        "--confirm-iterations",
        type=COUNT,
        default=6,
        metavar="K",
        help="measured iterations of each --confirm re-probe (default 6)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where --confirm re-probes: auto (default) is cuda when a GPU is visible, else cpu",
    )
    add_engine_arguments(parser, engine=False)
    parser.add_argument(
        "--json", action="store_true", help="print summary.json (the pick, its figures, the gain) alone"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autotune.report.command import ReportOptions, report_study

    return report_study(options_from(args, ReportOptions, memory_budget_gib=args.memory_budget))
