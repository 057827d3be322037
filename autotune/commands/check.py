"""`autotune check`: every problem of a config file, with its fix."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune.commands.arguments import COUNT, GIB, RANKS, add_alias, add_command, options_from
from autotune.probe.verl.install import VERL_VERSION

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = add_command(
        sub,
        "check",
        "report every problem of a config (best_config.yaml, verl overrides, trl_config.yaml) with its fix",
        "Reads best_config.yaml's schema (the seed article's, with mini_batch_size or "
        "gradient_accumulation_steps), a verl override file, a verl launch script (what bash hands the "
        "trainer: bash runs it with nothing started), or a TRL config (as `trl grpo --config` reads it): "
        "divisibility, rollout workers vs cores, lengths vs data, predicted memory vs the card, reward "
        "model frozen, rollout batch size. Exit 0 clean, 1 problems found, 2 unreadable input.",
        [
            "autotune check reports/my-study/best_config.yaml",
            "autotune check verl_overrides.txt --gpus 8 --gpu h100-80g --data data/train.jsonl",
            "autotune check trl_config.yaml --gpu a100-40g --data data/train.jsonl",
            "autotune check run_qwen2-7b.sh --gpu h100-80g --call 2",
            "autotune check config.yaml --gpus 2 --trace",
            "autotune check config.yaml --gpus 8 --data data/train.jsonl --trace --trace-lengths max",
            "autotune check config.yaml --gpus 2 --trace --verl-python /opt/verl/bin/python",
        ],
    )
    _add_config_arguments(parser)
    _add_context_arguments(parser)
    _add_trace_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON object")
    parser.set_defaults(handler=run)


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The file to judge, and the GPUs and card it is judged for."""
    parser.add_argument(
        "config",
        type=Path,
        help="a YAML config (best_config.yaml, trl_config.yaml), a verl override file or launch script",
    )
    parser.add_argument(
        "--call",
        type=COUNT,
        metavar="N",
        help="the N-th trainer call of a launch script that starts the trainer more than once",
    )
    parser.add_argument("--gpus", type=RANKS, help="GPUs of the job (default: the config's, else 1)")
    card = parser.add_mutually_exclusive_group()
    card.add_argument("--gpu", help="the card: a100-40g, a100-80g, h100-80g, h200, rtx3090, l40s, ...")
    card.add_argument("--memory-budget", type=GIB, metavar="GIB", help="memory per GPU in GiB")
    add_alias(card, "--memory", "memory_budget", GIB)


def _add_context_arguments(parser: argparse.ArgumentParser) -> None:
    """What the file itself does not say: the data, the model, the machine's cores, a past run's lengths."""
    parser.add_argument("--data", type=Path, help="a dataset to check the lengths against (as `lengths`)")
    parser.add_argument("--model", help="registry name or local directory (default: from the config)")
    parser.add_argument("--cores", type=COUNT, help="physical cores of the training machine")
    parser.add_argument("--prompt-key", help="prompt column of --data")
    parser.add_argument("--response-key", help="response column of --data")
    parser.add_argument(
        "--verl-log",
        type=Path,
        metavar="FILE",
        help="a previous verl run's log (its file logger's JSON lines, or its console output): the memory "
        "verdict takes that run's response lengths, and its prompts' without --data",
    )


def _add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """The traced second opinion on memory (--trace) and where it runs."""
    parser.add_argument(
        "--trace",
        action="store_true",
        help="also trace the training passes of the real model under FakeTensorMode (no GPU, no weights; "
        "about a minute for a 7B model, a few at 70B: its estimate and each pass go to stderr) and print "
        "them beside the memory model's terms, on the verdict's lengths",
    )
    parser.add_argument(
        "--trace-lengths",
        choices=("data", "max"),
        help="with --trace: the lengths its micro batches are packed from: data (the job's, from --data or "
        "--verl-log) or max (the limits, the worst case); default: the memory verdict's",
    )
    parser.add_argument(
        "--verl-python",
        metavar="PATH",
        help=f"with --trace: the python of an environment with verl {VERL_VERSION}; the trace runs there, "
        "its log-probs, entropy and losses by verl's own functions (default: autotune's, in this python)",
    )


def run(args: argparse.Namespace) -> int:
    from autotune.check import CheckOptions, run

    def say(line: str) -> None:  # progress goes to stderr: --json keeps stdout to the JSON object
        print(line, file=sys.stderr, flush=True)

    options = options_from(args, CheckOptions, path=args.config, memory_gib=args.memory_budget, say=say)
    return run(options, as_json=args.json)
