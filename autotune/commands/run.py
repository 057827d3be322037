"""`autotune run`: search batch settings with an Optuna study of probes."""

from __future__ import annotations

import argparse
from pathlib import Path

from autotune.commands.arguments import (
    COUNT,
    ROUNDS,
    SECONDS,
    SEED,
    add_cluster_arguments,
    add_command,
    add_device_arguments,
    add_engine_arguments,
    add_model_arguments,
    add_parallel_argument,
    options_from,
)
from autotune.formats.rollout import ROLLOUT_ENGINES
from autotune.trainers.registry import TRAINERS

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = add_command(
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
            "autotune run --from run_qwen2-7b.sh --model small-llama --gpus 1 --trials 8",
            "autotune run --engine trl --target trl --space trl-cpu-tiny --trials 8",
            "autotune run --model llama-2-7b --gpus 2 --time-budget 8h",
            "autotune run --space seed-4xa100-40g-13b-fsdp --parallel 2 "
            "--storage journal:reports/13b.journal",
            "autotune run --model qwen2-7b --ray auto --nodes 2 --gpus 8 --parallel 2",
        ],
    )
    parser.add_argument(
        "--space",
        help="a shipped space's name (see `autotune spaces`) or a YAML file (default: default)",
    )
    parser.add_argument(
        "--from",
        dest="from_file",
        type=Path,
        metavar="FILE",
        help="start from your own job: a verl launch script (read by running it in bash, with nothing "
        "started), a verl override file, or a TRL config YAML. Its recipe is held, its system settings are "
        "the baseline of the gain, and <out>/<study>/<stem>.tuned.<ext> is your file with the tuned values",
    )
    parser.add_argument(
        "--call",
        type=COUNT,
        metavar="N",
        help="with --from: the N-th trainer call of a launch script that starts the trainer more than once",
    )
    add_model_arguments(parser, override=True)
    add_device_arguments(parser, override=True)
    parser.add_argument(
        "--trials",
        type=COUNT,
        default=20,
        help="complete trials to reach, probed or pruned (default 20)",
    )
    _add_recipe_arguments(parser)
    add_parallel_argument(parser)
    add_cluster_arguments(parser)
    _add_output_arguments(parser)
    add_engine_arguments(parser)
    parser.set_defaults(handler=run)


def _add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """What the run may change of the space: the trials, the recipe, probe time, the data."""
    parser.add_argument(
        "--train-batch-size",
        type=COUNT,
        metavar="N",
        help="fix the recipe's train batch (samples per PPO iteration) to N, whatever the space says; "
        "gpus×rollout_n×2^k",
    )
    parser.add_argument(
        "--mini-batch-size",
        type=COUNT,
        metavar="N",
        help="fix the recipe's mini batch (samples per optimizer step: micro × accumulation × GPUs) to N, "
        "whatever the space says; gpus×rollout_n×2^k, dividing the train batch",
    )
    parser.add_argument(
        "--tune",
        type=recipe_knobs,
        action="extend",
        metavar="KNOB[,KNOB]",
        help="also search these recipe knobs (train_batch_size, mini_batch_size, max_prompt_length, "
        "max_response_length) over the range the space gives them: that changes the algorithm, not only "
        "the speed, and the report says so. By default the recipe is held fixed and only the system "
        "(rollout and micro batches, workers, checkpointing, sharding, offload) is searched",
    )
    parser.add_argument(
        "--timeout-per-probe",
        type=SECONDS,
        metavar="S",
        help="wall-clock limit per probe (default: the space's)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        help="a dataset (as `autotune lengths`): the length knobs are "
        "bounded below by its p95/p90 suggestions and the probes' prompts are its prompts",
    )
    parser.add_argument("--prompt-key", help="prompt column of --data")
    parser.add_argument("--response-key", help="response column of --data")
    parser.add_argument(
        "--verl-log",
        type=Path,
        metavar="FILE",
        help="a previous verl run's log (file logger JSON lines or console output): the probes take its "
        "response lengths (and its prompts' without --data), and the report its generation share of a step",
    )
    parser.add_argument(
        "--time-budget",
        metavar="DURATION",
        help="launch no new probe after this long, e.g. 8h or 90m (overnight sweeps)",
    )


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the study and its report go, and what the end of the run does."""
    parser.add_argument(
        "--storage",
        help="Optuna storage: sqlite:///PATH, journal:PATH (several processes on one node) or a "
        "PostgreSQL URL (several machines); default: <out>/<study>/study.db, or study.journal with "
        "--parallel",
    )
    parser.add_argument(
        "--study",
        help="study name (default: <space>-<model>-<gpus>gpu-<id>: another job, another id)",
    )
    parser.add_argument("--out", type=Path, default=Path("reports"), help="output folder (default: reports)")
    parser.add_argument("--seed", type=SEED, default=0, help="sampler seed (default 0)")
    parser.add_argument(
        "--gain-rounds",
        type=ROUNDS,
        default=2,
        metavar="N",
        help="at the end, probe the recommended and each hand-made config in turn N times each for the gain "
        "(default 2; 0 skips it: the gain then rests on first measurements, and the report says so)",
    )
    parser.add_argument(
        "--search-unexported",
        action="store_true",
        help="search the rollout batch too, which verl does not read (by default it is held at one value: "
        "the export carries no key for it); the report then splits the gain into verl's knobs and the rest",
    )
    parser.add_argument(
        "--target",
        choices=tuple(TRAINERS),
        help="the trainer the export is for: verl (best_config.yaml and verl_overrides.txt; default) or trl "
        "(best_config.yaml and trl_config.yaml for TRL's GRPOTrainer); with --from, the file's trainer",
    )
    parser.add_argument(
        "--rollout-engine",
        choices=ROLLOUT_ENGINES,
        default="vllm",
        help="verl's rollout engine the export names (actor_rollout_ref.rollout.name; default vllm)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        dest="json",
        help="print the run's summary (the pick, its figures, the gain, the files, the verl launch line; as "
        "<out>/<study>/summary.json) as JSON on stdout; progress goes to stderr",
    )


def run(args: argparse.Namespace) -> int:
    from autotune.run.main import run_study
    from autotune.run.prepare import RunOptions, parse_duration

    budget = parse_duration(args.time_budget) if args.time_budget else None
    check_from_flags(args)
    return run_study(
        options_from(
            args,
            RunOptions,
            space=args.space or "default",
            target=args.target or "verl",
            memory_budget_gib=args.memory_budget,
            time_budget_seconds=budget,
        )
    )


def check_from_flags(args: argparse.Namespace) -> None:
    """--from brings its own space and recipe: the flags that would replace them are refused in one line."""
    from autotune.errors import UserError

    if args.from_file is None:
        if args.call is not None:
            raise UserError(
                f"--call {args.call} picks a trainer call of --from's launch script: add --from FILE"
            )
        return
    given = (("--space", args.space), ("--tune", args.tune), ("--target", args.target))
    clashing = [flag for flag, value in given if value]
    if clashing:
        raise UserError(
            f"--from {args.from_file} takes the job, its recipe and its trainer from the file: drop "
            f"{' and '.join(clashing)}"
        )


def recipe_knobs(text: str) -> list[str]:
    """--tune's value: recipe knobs, comma-separated (argparse reports a wrong one in one line)."""
    from autotune.space.specs import RECIPE_KNOBS, SYSTEM_KNOBS

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
