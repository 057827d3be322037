"""Command line: the parsers of every `autotune` command and their dispatch, nothing else.

Each command's work lives in its stage's package (no module imports this one). A user's mistake ends with
one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from autotune import __version__
from autotune.config.numbers import MAX_GIB, MAX_RANKS, MAX_SECONDS, argument, parse_float, parse_int
from autotune.errors import UserError
from autotune.formats.rollout import ROLLOUT_ENGINES
from autotune.probe.contract import ENGINES
from autotune.probe.verl.install import VERL_VERSION

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "add_check_parser",
    "add_device_arguments",
    "add_lengths_parser",
    "add_listing_parsers",
    "add_model_arguments",
    "add_parallel_argument",
    "add_worker_parser",
    "build_parser",
    "main",
]

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
T = TypeVar("T", bound="DataclassInstance")


class _Parser(argparse.ArgumentParser):
    """argparse, but its usage errors are one line with exit code 2 like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message} (see {self.prog} --help)")

    def parse_known_args(self, args=None, namespace=None):
        # argparse strips a lone `--` from `--flag=--` and stores [] without calling the flag's type.
        for arg in sys.argv[1:] if args is None else args:
            if arg.startswith("--") and arg.endswith("=--"):
                self.error(f"argument {arg[:-3]}: expected a value, got '--'")
        return super().parse_known_args(args, namespace)


RANKS = argument(parse_int, maximum=MAX_RANKS)  # --gpus, --parallel: each rank or slot is a process
COUNT = argument(parse_int)  # trials, iterations, cores
GIB = argument(parse_float, maximum=MAX_GIB)  # memory budgets per rank
SECONDS = argument(parse_float, maximum=MAX_SECONDS)  # timeouts
SEED = argument(parse_int, minimum=0, maximum=2**32 - 1)  # numpy and torch take 32-bit seeds
WARMUP = argument(parse_int, minimum=0, maximum=1000)
ROUNDS = argument(parse_int, minimum=0, maximum=20)  # back-to-back rounds: each costs a probe per config


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
        help="ranks per probe: GPUs on CUDA, gloo processes on CPU "
        + ("(default: the space's)" if override else "(default 1)"),
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: cuda when a GPU is visible, else cpu",
    )
    parser.add_argument(
        "--memory-budget",
        type=GIB,
        metavar="GIB",
        help="per-rank memory budget in GiB: on CUDA a per-process memory fraction emulates a "
        "smaller card (a real OOM); on CPU the peak RSS is compared (an emulated OOM)"
        + ("; default: the space's, else the device's memory" if override else ""),
    )


def add_engine_arguments(parser: argparse.ArgumentParser, engine: bool = True) -> None:
    """--engine (what runs a probe) and --verl-python (the verl environment it uses)."""
    if engine:
        parser.add_argument(
            "--engine",
            choices=ENGINES,
            default="builtin",
            help="what runs a probe: builtin (autotune's own PPO/GRPO iteration; CPU or GPU) or verl "
            "(python -m verl.trainer.main_ppo itself for the warm-up and measured steps, with vLLM's pool; "
            "GPU machines, --verl-python)",
        )
    parser.add_argument(
        "--verl-python",
        metavar="PATH",
        help=f"the python of an environment with verl {VERL_VERSION} (e.g. /opt/verl/bin/python), for "
        f"--engine verl" + ("" if engine else " studies"),
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="autotune",
        description="Find fast, memory-safe batch settings for verl PPO/GRPO.",
        epilog=examples_text(
            [
                "autotune run --space cpu-tiny --trials 12    # the embedded CPU default, about 5 minutes",
                "autotune run --model llama-2-7b --gpus 2 --time-budget 8h",
                "autotune check reports/<study>/best_config.yaml --gpus 4",
            ]
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        parser_class=_Parser,
        metavar="COMMAND",
        help="one of the commands below; `autotune COMMAND --help` lists its options",
    )

    probe = add_command(
        sub,
        "probe",
        "measure one batch configuration with a short PPO/GRPO run",
        "Warm-up, then K measured iterations, in child processes (one per rank). Knobs not set keep their "
        "defaults; mini_batch_size sets the accumulation steps (mini = micro × steps × GPUs), as the spaces "
        "do. "
        "Exit 0 when the probe measured ok, 1 for oom/timeout/crashed, 2 for bad input.",
        [
            "autotune probe --model tiny-llama --device cpu --set train_batch_size=16 "
            "--set mini_batch_size=8",
            "autotune probe --model qwen2.5-7b --gpus 2 --set micro_batch_size=8 --set use_lora=true --json",
        ],
    )
    add_model_arguments(probe)
    add_device_arguments(probe)
    probe.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="set a knob, e.g. --set mini_batch_size=16 --set micro_batch_size=4 (repeatable; the "
        "accumulation steps follow from them); every rule a config must keep is listed by `autotune check` "
        "and in docs/design.md",
    )
    probe.add_argument("--iterations", type=COUNT, default=2, help="measured iterations (default 2)")
    probe.add_argument(
        "--warmup", type=WARMUP, default=1, help="warm-up iterations, not measured (default 1)"
    )
    probe.add_argument(
        "--timeout",
        type=SECONDS,
        default=600.0,
        metavar="S",
        help="wall-clock limit in seconds (default 600); the whole process group is killed after it",
    )
    probe.add_argument(
        "--seed", type=SEED, default=0, help="seed of the probe's sampling and prompts (default 0)"
    )
    add_engine_arguments(probe)
    probe.add_argument("--json", action="store_true", help="print the result as JSON")
    probe.set_defaults(handler=_cmd_probe)

    run = add_command(
        sub,
        "run",
        "search batch settings with an Optuna study of probes",
        "Open (or resume) a study over a search space, probe configurations until --trials are "
        "complete (a line per trial, also in <out>/<study>/run.log), re-measure the leaders, probe the "
        "recommended and the hand-made configs back to back for the gain, then write the report and "
        "summary.json. Running the same command again resumes the study. Ctrl-C finishes the running probes "
        "and stops; a second Ctrl-C kills them. Exit 0 with a feasible configuration, 1 with none, 2 for bad "
        "input, 3 when the storage or the output folder fails (nothing measured is lost), 130 when stopped "
        "by Ctrl-C or SIGTERM (the report holds what was measured; run again to resume).",
        [
            "autotune run --space cpu-tiny --trials 12",
            "autotune run --model llama-2-7b --gpus 2 --time-budget 8h",
            "autotune run --space seed-4xa100-40g-13b-fsdp --parallel 2 "
            "--storage journal:reports/13b.journal",
        ],
    )
    run.add_argument(
        "--space",
        default="default",
        help="a shipped space's name (see `autotune spaces`) or a YAML file (default: default)",
    )
    add_model_arguments(run, override=True)
    add_device_arguments(run, override=True)
    run.add_argument(
        "--trials",
        type=COUNT,
        default=20,
        help="complete trials to reach, probed or pruned (default 20)",
    )
    run.add_argument(
        "--train-batch-size",
        type=COUNT,
        metavar="N",
        help="fix the recipe's train batch (samples per PPO iteration) to N, whatever the space says; "
        "gpus×rollout_n×2^k",
    )
    run.add_argument(
        "--mini-batch-size",
        type=COUNT,
        metavar="N",
        help="fix the recipe's mini batch (samples per optimizer step: micro × accumulation × GPUs) to N, "
        "whatever the space says; gpus×rollout_n×2^k, dividing the train batch",
    )
    run.add_argument(
        "--tune",
        type=recipe_knobs,
        action="extend",
        metavar="KNOB[,KNOB]",
        help="also search these recipe knobs (train_batch_size, mini_batch_size, max_prompt_length, "
        "max_response_length) over the range the space gives them: that changes the algorithm, not only "
        "the speed, and the report says so. By default the recipe is held fixed and only the system "
        "(rollout and micro batches, workers, checkpointing, sharding, offload) is searched",
    )
    run.add_argument(
        "--timeout-per-probe",
        type=SECONDS,
        metavar="S",
        help="wall-clock limit per probe (default: the space's)",
    )
    run.add_argument(
        "--data",
        type=Path,
        help="a dataset (as `autotune lengths`): the length knobs are "
        "bounded below by its p95/p90 suggestions and the probes' prompts are its prompts",
    )
    run.add_argument("--prompt-key", help="prompt column of --data")
    run.add_argument("--response-key", help="response column of --data")
    run.add_argument(
        "--time-budget",
        metavar="DURATION",
        help="launch no new probe after this long, e.g. 8h or 90m (overnight sweeps)",
    )
    add_parallel_argument(run)
    run.add_argument(
        "--storage",
        help="Optuna storage: sqlite:///PATH, journal:PATH (several processes on one node) or a "
        "PostgreSQL URL (several machines); default: <out>/<study>/study.db, or study.journal with "
        "--parallel",
    )
    run.add_argument(
        "--study",
        help="study name (default: <space>-<model>-<gpus>gpu-<id>: another job, another id)",
    )
    run.add_argument("--out", type=Path, default=Path("reports"), help="output folder (default: reports)")
    run.add_argument("--seed", type=SEED, default=0, help="sampler seed (default 0)")
    run.add_argument(
        "--gain-rounds",
        type=ROUNDS,
        default=2,
        metavar="N",
        help="at the end, probe the recommended and each hand-made config in turn N times each for the gain "
        "(default 2; 0 skips it: the gain then rests on first measurements, and the report says so)",
    )
    run.add_argument(
        "--search-unexported",
        action="store_true",
        help="search the rollout batch too, which verl does not read (by default it is held at one value: "
        "the export carries no key for it); the report then splits the gain into verl's knobs and the rest",
    )
    run.add_argument(
        "--rollout-engine",
        choices=ROLLOUT_ENGINES,
        default="vllm",
        help="verl's rollout engine the export names (actor_rollout_ref.rollout.name; default vllm)",
    )
    run.add_argument(
        "--json",
        action="store_true",
        dest="json",
        help="print the run's summary (the pick, its figures, the gain, the files, the verl launch line; as "
        "<out>/<study>/summary.json) as JSON on stdout; progress goes to stderr",
    )
    add_engine_arguments(run)
    run.set_defaults(handler=_cmd_run)

    report = add_command(
        sub,
        "report",
        "write the report of a study (finished or still running)",
        "Select the Pareto-best configuration of a study and write best_config.yaml, "
        "verl_overrides.txt, trials.csv, report.md and report.html into <out>/<study>/. "
        "Exit 0 when a feasible configuration was written, 1 when none is feasible.",
        [
            "autotune report --study my-study",
            "autotune report --study my-study --confirm --memory-budget 40",
        ],
    )
    report.add_argument("--study", required=True, help="study name")
    report.add_argument("--storage", help="Optuna storage URL (default: sqlite in <out>/<study>/study.db)")
    report.add_argument("--out", type=Path, default=Path("reports"), help="output folder (default: reports)")
    report.add_argument(
        "--memory-budget",
        type=GIB,
        metavar="GIB",
        help="judge feasibility against this budget instead of the study's",
    )
    report.add_argument(
        "--confirm",
        action="store_true",
        help="re-probe the winner and the hand-made configs in turn, twice each, with more iterations first: "
        "their figures become the report's headline and gain (in every file); if the winner fails, take the "
        "next one",
    )
    report.add_argument(
        "--confirm-iterations",
        type=COUNT,
        default=6,
        metavar="K",
        help="measured iterations of each --confirm re-probe (default 6)",
    )
    report.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where --confirm re-probes: auto (default) is cuda when a GPU is visible, else cpu",
    )
    add_engine_arguments(report, engine=False)
    report.set_defaults(handler=_cmd_report)

    add_worker_parser(sub)
    add_lengths_parser(sub)
    add_check_parser(sub)

    add_listing_parsers(sub)
    return parser


def add_listing_parsers(sub: argparse._SubParsersAction) -> None:
    """`models` and `spaces`: what `--model` and `--space` accept."""
    models = add_command(
        sub,
        "models",
        "list the registry's model names with parameter counts",
        "The model names --model and --reward-model accept (besides a local Hugging Face "
        "model directory): role, architecture, parameters, layers, hidden size and vocabulary. On a "
        "terminal a table; in a pipe plain columns, one model a line.",
        ["autotune models", "autotune models --json"],
    )
    models.add_argument("--json", action="store_true", help="print a JSON list, one object per model")
    models.set_defaults(handler=_cmd_models)
    spaces = add_command(
        sub,
        "spaces",
        "list the shipped search spaces (`autotune run --space NAME`)",
        "The search spaces shipped with autotune, one a line: name, model and GPUs, "
        "description. `autotune run --space NAME` uses one; --space also takes a YAML file of your own.",
        ["autotune spaces", "autotune spaces --json"],
    )
    spaces.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list, one object per space (name, description, model, reward_model, gpus, "
        "memory_budget_gib, path)",
    )
    spaces.set_defaults(handler=_cmd_spaces)


def recipe_knobs(text: str) -> list[str]:
    """--tune's value: recipe knobs, comma-separated (argparse reports a wrong one in one line)."""
    from autotune.space.model import RECIPE_KNOBS, SYSTEM_KNOBS

    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected recipe knobs, e.g. --tune {RECIPE_KNOBS[0]}")
    for name in names:
        if name not in RECIPE_KNOBS:
            kind = "a system knob, searched by its range in the space" if name in SYSTEM_KNOBS else "unknown"
            raise argparse.ArgumentTypeError(
                f"{name!r} is not a recipe knob ({kind}): --tune takes {', '.join(RECIPE_KNOBS)}"
            )
    return names


def add_parallel_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--parallel",
        type=RANKS,
        default=1,
        metavar="P",
        help="probes at a time, each on its own GPUs (P x --gpus must be visible); on CPU, P concurrent "
        "probes sharing the cores (default 1)",
    )


def add_worker_parser(sub: argparse._SubParsersAction) -> None:
    worker = add_command(
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
    worker.add_argument("--study", required=True, help="study name (as `autotune run` printed it)")
    worker.add_argument(
        "--storage",
        required=True,
        help="the study's storage: a PostgreSQL URL, or journal:PATH on the same node",
    )
    worker.add_argument("--gpus", type=RANKS, help="GPUs per probe: must equal the study's (default)")
    add_parallel_argument(worker)
    worker.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where this worker probes: auto (default) is cuda when a GPU is visible, else cpu",
    )
    worker.add_argument("--trials", type=COUNT, help="complete trials to reach (default: the study's)")
    worker.add_argument("--time-budget", metavar="DURATION", help="launch no new probe after this long")
    worker.add_argument(
        "--out", type=Path, default=Path("reports"), help="where a measurement goes if the storage is away"
    )
    worker.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow a local model directory's own Python code to run",
    )
    add_engine_arguments(worker, engine=False)
    worker.set_defaults(handler=_cmd_worker)


def add_lengths_parser(sub: argparse._SubParsersAction) -> None:
    lengths = add_command(
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
    lengths.add_argument("data", type=Path, help="a .jsonl, .json, .parquet or .csv file")
    lengths.add_argument("--model", required=True, help="registry name or a local model directory")
    lengths.add_argument("--prompt-key", help="prompt column (default: prompt, question, instruction, ...)")
    lengths.add_argument("--response-key", help="response column (default: response, answer, output, ...)")
    lengths.add_argument("--percentiles", default="50,90,95,99", help="comma-separated (default 50,90,95,99)")
    lengths.add_argument("--json", action="store_true", help="print a JSON object")
    lengths.set_defaults(handler=_cmd_lengths)


def add_check_parser(sub: argparse._SubParsersAction) -> None:
    check = add_command(
        sub,
        "check",
        "report every problem of a config (best_config.yaml or verl overrides) with its fix",
        "Reads best_config.yaml's schema (the seed article's, with mini_batch_size or "
        "gradient_accumulation_steps) or a verl override file: divisibility, rollout workers vs cores, "
        "lengths vs data, predicted memory vs the card, reward model frozen, rollout batch size. Exit 0 "
        "clean, 1 problems found, 2 unreadable input.",
        [
            "autotune check reports/my-study/best_config.yaml",
            "autotune check verl_overrides.txt --gpus 8 --gpu h100-80g --data data/train.jsonl",
        ],
    )
    check.add_argument("config", type=Path, help="a YAML config or a verl override file (key=value lines)")
    check.add_argument("--gpus", type=RANKS, help="GPUs of the job (default: the config's, else 1)")
    card = check.add_mutually_exclusive_group()
    card.add_argument("--gpu", help="the card: a100-40g, a100-80g, h100-80g, h200, rtx3090, l40s, ...")
    card.add_argument("--memory", type=GIB, metavar="GIB", help="memory per GPU in GiB")
    check.add_argument("--data", type=Path, help="a dataset to check the lengths against (as `lengths`)")
    check.add_argument("--model", help="registry name or local directory (default: from the config)")
    check.add_argument("--cores", type=COUNT, help="physical cores of the training machine")
    check.add_argument("--prompt-key", help="prompt column of --data")
    check.add_argument("--response-key", help="response column of --data")
    check.add_argument("--json", action="store_true", help="print a JSON object")
    check.set_defaults(handler=_cmd_check)


def _cmd_lengths(args: argparse.Namespace) -> int:
    from autotune.data.lengths import measure_lengths, parse_percentiles, print_report

    percentiles = parse_percentiles(args.percentiles)
    report = measure_lengths(args.data, args.model, args.prompt_key, args.response_key, percentiles)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report)
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    from autotune.check import CheckOptions, run

    return run(options_from(args, CheckOptions, path=args.config, memory_gib=args.memory), as_json=args.json)


def _cmd_probe(args: argparse.Namespace) -> int:
    from autotune.config.knobs import ProbeConfig, parse_sets, resolve_mini_batch
    from autotune.config.rules import (
        config_findings,
        engine_findings,
        model_findings,
        offload_findings,
        raise_for,
    )
    from autotune.models.registry import resolve_model, resolve_reward_model
    from autotune.probe.contract import ProbeSettings
    from autotune.probe.devices import resolve_device
    from autotune.probe.launcher import run_probe
    from autotune.report.console import print_probe_result, probing
    from autotune.status import Status

    config = ProbeConfig(**resolve_mini_batch(parse_sets(args.sets), args.gpus))
    raise_for(config_findings(config, args.gpus) + engine_findings(config, args.engine))  # before the model
    device = resolve_device(args.device, args.gpus)
    raise_for(offload_findings(config, device))
    spec = resolve_model(args.model, args.weights, args.trust_remote_code)
    resolve_reward_model(args.reward_model)
    raise_for(model_findings(config, spec))
    if args.engine == "verl":
        from autotune.probe.verl.install import check_verl_python

        check_verl_python(args.verl_python)
    settings = ProbeSettings(
        engine=args.engine,
        verl_python=args.verl_python,
        model=args.model,
        reward_model=args.reward_model,
        weights=args.weights,
        device=device,
        world_size=args.gpus,
        warmup_iterations=args.warmup,
        iterations=args.iterations,
        timeout_seconds=args.timeout,
        memory_budget_gib=args.memory_budget,
        seed=args.seed,
        trust_remote_code=args.trust_remote_code,
    )
    with probing(config, settings):
        result = run_probe(config, settings)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_probe_result(result)
    return EXIT_OK if result.status == Status.OK else EXIT_PROBLEM


def _cmd_run(args: argparse.Namespace) -> int:
    from autotune.run.main import run_study
    from autotune.run.prepare import RunOptions, parse_duration

    budget = parse_duration(args.time_budget) if args.time_budget else None
    return run_study(
        options_from(args, RunOptions, memory_budget_gib=args.memory_budget, time_budget_seconds=budget)
    )


def _cmd_worker(args: argparse.Namespace) -> int:
    from autotune.run.prepare import parse_duration
    from autotune.run.worker import WorkerOptions, run_worker

    budget = parse_duration(args.time_budget) if args.time_budget else None
    return run_worker(options_from(args, WorkerOptions, time_budget_seconds=budget))


def _cmd_report(args: argparse.Namespace) -> int:
    from autotune.report.command import ReportOptions, report_study

    return report_study(options_from(args, ReportOptions, memory_budget_gib=args.memory_budget))


def _cmd_models(args: argparse.Namespace) -> int:
    # listing, not registry: the list needs neither torch nor transformers (seconds to import)
    from autotune.models.listing import model_rows, print_model_table

    rows = model_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_model_table(rows)
    return EXIT_OK


def _cmd_spaces(args: argparse.Namespace) -> int:
    from autotune.space.shipped import space_lines, space_rows

    rows = space_rows()
    print(json.dumps(rows, indent=2) if args.json else space_lines(rows))
    return EXIT_OK


def options_from(args: argparse.Namespace, cls: type[T], **renamed: Any) -> T:
    """A command's options dataclass from the parsed arguments: each field from the argument of the same name,
    `renamed` for those whose flag has another name or needs converting."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**{**given, **renamed})


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from autotune.study.storage import scrub, transient

        if not transient(exc):
            raise
        # A storage or file error outside the retried paths: one line, no password, nothing measured lost.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(
            f"error: storage or output unavailable ({type(exc).__name__}: {scrub(first)}); every completed "
            f"trial is kept: run the same command again when it is back",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
