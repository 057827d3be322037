"""`autotune probe`: measure one batch configuration with a short PPO/GRPO run."""

from __future__ import annotations

import argparse
import json

from autotune.commands.arguments import (
    COUNT,
    EXIT_OK,
    EXIT_PROBLEM,
    SECONDS,
    SEED,
    WARMUP,
    add_alias,
    add_cluster_arguments,
    add_command,
    add_device_arguments,
    add_engine_arguments,
    add_model_arguments,
)

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = add_command(
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
            "autotune probe --model qwen2.5-7b --ray auto --nodes 2 --gpus 4 --set micro_batch_size=8",
        ],
    )
    add_model_arguments(parser)
    add_device_arguments(parser)
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="set a knob, e.g. --set mini_batch_size=16 --set micro_batch_size=4 (repeatable; the "
        "accumulation steps follow from them); every rule a config must keep is listed by `autotune check` "
        "and in docs/design.md",
    )
    parser.add_argument("--iterations", type=COUNT, default=2, help="measured iterations (default 2)")
    parser.add_argument(
        "--warmup", type=WARMUP, default=1, help="warm-up iterations, not measured (default 1)"
    )
    parser.add_argument(
        "--timeout-per-probe",
        type=SECONDS,
        default=600.0,
        metavar="S",
        help="wall-clock limit in seconds (default 600); the whole process group is killed after it",
    )
    add_alias(parser, "--timeout", "timeout_per_probe", SECONDS)
    parser.add_argument(
        "--seed", type=SEED, default=0, help="seed of the probe's sampling and prompts (default 0)"
    )
    add_engine_arguments(parser)
    add_cluster_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autotune.probe.cluster.connect import check_flags, on_cluster
    from autotune.trainers.registry import DEFAULT_TRAINER, check_cluster_use, engine_named

    check_flags(args.ray, args.nodes)
    check_cluster_use(args.ray, args.nodes, engine_named(args.engine), DEFAULT_TRAINER)
    with on_cluster(args.ray) as cluster:
        return _probe(args, cluster)


def _probe(args: argparse.Namespace, cluster) -> int:
    from autotune.config.knobs import ProbeConfig, parse_sets, resolve_mini_batch
    from autotune.config.rules import config_findings, model_findings, offload_findings, raise_for
    from autotune.models.catalog import resolve_model, resolve_reward_model
    from autotune.probe.contract import ProbeSettings
    from autotune.report.console import print_probe_result, probing
    from autotune.status import Status
    from autotune.trainers.registry import engine_named, run_probe

    ranks = args.nodes * args.gpus  # --gpus on each node
    config = ProbeConfig(**resolve_mini_batch(parse_sets(args.sets), ranks))
    engine = engine_named(args.engine)
    raise_for(config_findings(config, ranks) + engine.knob_findings(config))  # before the model
    device = _device(args, cluster)
    raise_for(offload_findings(config, device) + engine.knob_findings(config, device))
    spec = resolve_model(args.model, args.weights, args.trust_remote_code)
    resolve_reward_model(args.reward_model)
    raise_for(model_findings(config, spec))
    settings = ProbeSettings(
        engine=args.engine,
        engine_python=engine.python_from(args),
        model=args.model,
        reward_model=args.reward_model,
        weights=args.weights,
        device=device,
        world_size=ranks,
        nodes=args.nodes,
        ray_address=cluster.address if cluster is not None else None,
        placement_timeout=args.placement_timeout,
        warmup_iterations=args.warmup,
        iterations=args.iterations,
        timeout_seconds=args.timeout_per_probe,
        memory_budget_gib=args.memory_budget,
        seed=args.seed,
        trust_remote_code=args.trust_remote_code,
    )
    if engine.trainer is not None:  # what the trainer's own config would refuse, before it starts
        raise_for(engine.trainer.config_findings(config, ranks))
    engine.check_environment(settings)  # verl's or TRL's environment: one line and exit 2 when it cannot run
    with probing(config, settings):
        result = run_probe(config, settings)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_probe_result(result)
    return EXIT_OK if result.status == Status.OK else EXIT_PROBLEM


def _device(args: argparse.Namespace, cluster) -> str:
    """This machine's device, or the Ray cluster's (checked to hold --nodes × --gpus)."""
    if cluster is None:
        from autotune.probe.devices import resolve_device

        return resolve_device(args.device, args.gpus)
    from autotune.probe.cluster.connect import check_fits, cluster_device

    device = cluster_device(args.device, cluster)
    check_fits(cluster, device, args.nodes, args.gpus)
    return device
