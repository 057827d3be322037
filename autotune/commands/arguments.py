"""What several commands share: argument types with their limits, the model, device, engine and parallel
arguments, a command's parser (one-line summary, details, examples) and its options dataclass."""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from autotune.config.numbers import MAX_GIB, MAX_RANKS, MAX_SECONDS, argument, parse_float, parse_int
from autotune.formats.trl import TRL_VERSION
from autotune.probe.verl.install import VERL_VERSION
from autotune.trainers.registry import BUILTIN, ENGINES

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "COUNT",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "GIB",
    "RANKS",
    "ROUNDS",
    "SECONDS",
    "SEED",
    "WARMUP",
    "add_alias",
    "add_cluster_arguments",
    "add_command",
    "add_device_arguments",
    "add_engine_arguments",
    "add_model_arguments",
    "add_parallel_argument",
    "examples_text",
    "options_from",
]

EXIT_OK, EXIT_PROBLEM = 0, 1
T = TypeVar("T", bound="DataclassInstance")

RANKS = argument(parse_int, maximum=MAX_RANKS)  # --gpus, --parallel: each rank or slot is a process
COUNT = argument(parse_int)  # trials, iterations, cores
GIB = argument(parse_float, maximum=MAX_GIB)  # memory budgets per rank
SECONDS = argument(parse_float, maximum=MAX_SECONDS)  # timeouts
SEED = argument(parse_int, minimum=0, maximum=2**32 - 1)  # numpy and torch take 32-bit seeds
WARMUP = argument(parse_int, minimum=0, maximum=1000)
ROUNDS = argument(parse_int, minimum=0, maximum=20)  # back-to-back rounds: each costs a probe per config


def add_alias(parser: Any, old: str, dest: str, kind: Any = None) -> None:
    """A flag's former name, kept working for a release and hidden from --help (one name per idea)."""
    parser.add_argument(old, dest=dest, type=kind, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_model_arguments(parser: argparse.ArgumentParser, override: bool = False) -> None:
    """--model, --reward-model, --weights, --trust-remote-code (override=True: default to the space's)."""
    space = "override the space's: " if override else ""
    parser.add_argument(
        "--model",
        default=None if override else "tiny-llama",
        help=f"{space}registry name (see `autotune models`) or a local Hugging Face model directory",
    )
    parser.add_argument(
        "--reward-model",
        default=None if override else "function",
        help=f"{space}registry name, local directory, or 'function' for a rule-based reward",
    )
    parser.add_argument(
        "--weights",
        choices=("random", "pretrained"),
        default="random",
        help="random weights of the real architecture (default; nothing is downloaded), or a "
        "local directory's own weights",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow a local model directory's own Python code to run",
    )


def add_device_arguments(parser: argparse.ArgumentParser, override: bool = False) -> None:
    """--gpus, --device, --memory-budget; with override=True --gpus and the budget default to the space's."""
    parser.add_argument(
        "--gpus",
        type=RANKS,
        default=None if override else 1,
        help="ranks per probe (per node with --nodes): GPUs on CUDA, gloo processes on CPU "
        + ("(default: the space's)" if override else "(default 1)"),
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: cuda when a GPU is visible, else cpu",
    )
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument(
        "--memory-budget",
        type=GIB,
        metavar="GIB",
        help="per-rank memory budget in GiB: on CUDA a per-process memory fraction emulates a "
        "smaller card (a real OOM); on CPU a rank stops where its peak RSS passes it (an emulated OOM)"
        + ("; default: the space's, else the device's memory" if override else ""),
    )
    budget.add_argument(
        "--gpu",
        metavar="CARD",
        action=CardBudget,
        help="the card to budget for (a100-40g, a100-80g, h100-80g, h200, rtx3090, ...): its memory "
        "becomes --memory-budget, as `autotune check --gpu` judges against it",
    )


class CardBudget(argparse.Action):
    """--gpu CARD: the card's memory as --memory-budget (an unknown card is one line listing the known)."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        from autotune.memory.gpus import gpu_memory_gib

        namespace.memory_budget = gpu_memory_gib(str(value))


def add_engine_arguments(parser: argparse.ArgumentParser, engine: bool = True) -> None:
    """--engine (what runs a probe), --verl-python and --trl-python (the environments those engines use)."""
    if engine:
        parser.add_argument(
            "--engine",
            choices=tuple(ENGINES),
            default=BUILTIN.name,
            help="what runs a probe: builtin (autotune's own PPO/GRPO iteration; CPU or GPU), verl "
            "(python -m verl.trainer.main_ppo itself for the warm-up and measured steps, with vLLM's pool; "
            "GPU machines, --verl-python) or trl (TRL's GRPOTrainer itself; CPU or GPU, --trl-python)",
        )
    parser.add_argument(
        "--verl-python",
        metavar="PATH",
        help=f"the python of an environment with verl {VERL_VERSION} (e.g. /opt/verl/bin/python), for "
        f"--engine verl" + ("" if engine else " studies"),
    )
    parser.add_argument(
        "--trl-python",
        metavar="PATH",
        help=f"the python of an environment with TRL {TRL_VERSION} and autotune, for --engine trl"
        + ("" if engine else " studies")
        + " (default: this one)",
    )


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """--ray (probes on a Ray cluster), --nodes (a probe over several of its nodes), --placement-timeout."""
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the probes on this Ray cluster: its head's HOST:PORT, or auto (the cluster this machine "
        "belongs to); each probe's ranks are Ray actors, placed by Ray on nodes with the GPUs they need "
        '(needs Ray: pip install "autotune-rl[ray]"; autotune installed on every node)',
    )
    parser.add_argument(
        "--nodes",
        type=RANKS,
        default=1,
        metavar="N",
        help="nodes one probe spans, with --gpus GPUs on each (ranks = N x --gpus, one process group); "
        "N > 1 needs --ray (default 1)",
    )
    parser.add_argument(
        "--placement-timeout",
        type=SECONDS,
        default=300.0,
        metavar="S",
        help="with --ray: how long a probe waits for the cluster to place its ranks before the run stops "
        "(exit 3, resumable; default 300)",
    )


def add_parallel_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--parallel",
        type=RANKS,
        default=1,
        metavar="P",
        help="probes at a time, each on its own GPUs (P x --gpus must be visible, or fit the --ray "
        "cluster); on CPU, P concurrent probes sharing the cores (default 1)",
    )


def add_command(
    sub: argparse._SubParsersAction, name: str, summary: str, details: str, examples: Sequence[str]
) -> argparse.ArgumentParser:
    """A command's parser. `summary` is its line in `autotune --help` and the first line of its own help;
    `details` follow it; `examples` (whole command lines) close it."""
    return sub.add_parser(
        name,
        help=summary,
        description=f"{summary[0].upper()}{summary[1:]}.\n\n{textwrap.fill(details, 100)}",
        epilog=examples_text(examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def examples_text(examples: Sequence[str]) -> str:
    return "examples:\n" + "\n".join(f"  {example}" for example in examples)


def options_from(args: argparse.Namespace, cls: type[T], **renamed: Any) -> T:
    """A command's options dataclass from the parsed arguments: each field from the argument of the same name,
    `renamed` for those whose flag has another name or needs converting."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**{**given, **renamed})
