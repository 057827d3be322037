"""`autotune worker`: join a study from this or another machine."""

from __future__ import annotations

import argparse
from pathlib import Path

from autotune.commands.arguments import (
    COUNT,
    RANKS,
    add_command,
    add_engine_arguments,
    add_parallel_argument,
    options_from,
)

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = add_command(
        sub,
        "worker",
        "join a study started by `autotune run`, from this or another machine",
        "Probe trials of an existing study until its trial count is reached: the space and "
        "probe settings come from the study, the GPUs from this machine. A worker that dies mid-probe is "
        "noticed by the others (heartbeats on database storages, or the dead process on the same host) "
        "and its trial is retried once. Exit 2 for bad input, 3 when the storage stays unreachable.",
        [
            "autotune worker --study my-study --storage postgresql://tuner@db:5432/optuna",
            "autotune worker --study my-study --storage journal:reports/my-study/study.journal --parallel 2",
        ],
    )
    parser.add_argument("--study", required=True, help="study name (as `autotune run` printed it)")
    parser.add_argument(
        "--storage",
        required=True,
        help="the study's storage: a PostgreSQL URL, or journal:PATH on the same node",
    )
    parser.add_argument("--gpus", type=RANKS, help="GPUs per probe: must equal the study's (default)")
    add_parallel_argument(parser)
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where this worker probes: auto (default) is cuda when a GPU is visible, else cpu",
    )
    parser.add_argument("--trials", type=COUNT, help="complete trials to reach (default: the study's)")
    parser.add_argument("--time-budget", metavar="DURATION", help="launch no new probe after this long")
    parser.add_argument(
        "--out", type=Path, default=Path("reports"), help="where a measurement goes if the storage is away"
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow a local model directory's own Python code to run",
    )
    add_engine_arguments(parser, engine=False)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autotune.run.prepare import parse_duration
    from autotune.run.worker import WorkerOptions, run_worker

    budget = parse_duration(args.time_budget) if args.time_budget else None
    return run_worker(options_from(args, WorkerOptions, time_budget_seconds=budget))
