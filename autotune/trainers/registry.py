"""The trainer registry: every trainer autotune exports for, and every engine that runs a probe, by name.

    trainer_named("verl").export_file           # "verl_overrides.txt"
    engine_named(settings.engine).run(config, settings, cancel=None)
    trainer_of_file(target)                     # the trainer whose file `target` was read from, or None

The names are what flags take and studies store. Nothing outside this registry compares them: layers ask the
objects (autotune.trainers.base). A third trainer is a package implementing `Trainer` and `ProbeEngine`,
plus its line in TRAINERS and ENGINES.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from autotune.trainers.base import ProbeEngine, Trainer
from autotune.trainers.builtin import BUILTIN
from autotune.trainers.trl.trl_engine import TRL_ENGINE
from autotune.trainers.trl.trl_trainer import TRL
from autotune.trainers.verl.verl_engine import VERL_ENGINE
from autotune.trainers.verl.verl_trainer import VERL

if TYPE_CHECKING:
    from autotune.config.knobs import ProbeConfig
    from autotune.formats.target import Target
    from autotune.probe.contract import ProbeResult, ProbeSettings

__all__ = [
    "BUILTIN",
    "DEFAULT_TRAINER",
    "ENGINES",
    "TRAINERS",
    "ProbeEngine",
    "Trainer",
    "check_cluster_use",
    "engine_named",
    "run_probe",
    "trainer_named",
    "trainer_of_file",
]

TRAINERS: dict[str, Trainer] = {trainer.name: trainer for trainer in (VERL, TRL)}
ENGINES: dict[str, ProbeEngine] = {engine.name: engine for engine in (BUILTIN, VERL_ENGINE, TRL_ENGINE)}
DEFAULT_TRAINER = VERL  # a study `run` did not start, and autotune's own config schema, export for verl


def trainer_named(name: str | None) -> Trainer:
    """The trainer of `--target` or a study's stored target (None: the default)."""
    return DEFAULT_TRAINER if name is None else TRAINERS[name]


def engine_named(name: str | None) -> ProbeEngine:
    """The engine of `--engine` or a study's stored probe settings (None: the built-in probe)."""
    return BUILTIN if name is None else ENGINES[name]


def trainer_of_file(target: Target) -> Trainer | None:
    """The trainer whose own file `target` was read from; None for autotune's schema (best_config.yaml)."""
    return next((t for t in TRAINERS.values() if t.file_kind == target.kind), None)


def run_probe(
    config: ProbeConfig, settings: ProbeSettings, cancel: threading.Event | None = None
) -> ProbeResult:
    """One probe by the engine its settings name, to completion, timeout or failure, classified. Setting
    `cancel` (a second Ctrl-C) kills it at once; the caller records it as interrupted."""
    return engine_named(settings.engine).run(config, settings, cancel)


def check_cluster_use(ray: str | None, nodes: int, engine: ProbeEngine, trainer: Trainer) -> None:
    """What the engine and the trainer allow of --ray and --nodes, said in one line before anything else."""
    from autotune.errors import UserError

    if ray is not None and not engine.on_ray:
        on_ray = " or ".join(f"--engine {e.name}" for e in ENGINES.values() if e.on_ray)
        whose = f"{engine.trainer.label}'s" if engine.trainer is not None else "its"
        raise UserError(
            f"--ray with --engine {engine.name}: {whose} probes run on this machine only; leave --ray out, "
            f"or use {on_ray} on the cluster"
        )
    if nodes > 1 and not trainer.spans_nodes:
        others = ", ".join(t.name for t in TRAINERS.values() if t.spans_nodes)
        raise UserError(
            f"--nodes {nodes} with --target {trainer.name}: the {trainer.label} export is for one machine "
            f"(its multi-node launch is not written); leave --nodes out, or export for {others}"
        )
