"""What the benchmarks share: a space's probe settings, budget and prior memory model, a table of probes by
configuration, and a record of the machine a figure was measured on.

Imported as `from bench import common` by the scripts of this package (run as `python -m bench.<name>` from
the repository root). Cheap to import: the model registry (transformers) and Optuna load on first use.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.memory.architecture import Architecture
from autotune.memory.calibration import MemoryModel
from autotune.probe.contract import ProbeSettings
from autotune.space.model import SearchSpace
from autotune.units import GIB

if TYPE_CHECKING:
    from autotune.memory.budget import Budget

__all__ = [
    "RESULTS",
    "current_key",
    "grid_table",
    "machine",
    "memory_model_for",
    "prior_memory_model",
    "probe_settings",
    "space_budget",
]

RESULTS = Path(__file__).resolve().parent / "results"  # the committed figures files


def probe_settings(
    space: SearchSpace, device: str = "cpu", iterations: int | None = None, **changes: Any
) -> ProbeSettings:
    """The probe `autotune run` launches for `space`: its model, reward model, ranks and probe section.

    Budget rule: the emulated memory budget is the space's `memory_budget_gib`, else none. That is what
    `autotune run` probes with when the space sets a budget (autotune.run.main.prepare); its further
    fallbacks (--memory-budget, the device's whole memory) have no counterpart in a benchmark, and a budget
    of the machine's whole memory would emulate nothing.

    `iterations` replaces the space's measured iterations (a longer probe); the timeout then grows in
    proportion, never below the space's. `changes` replace any other field (dataclasses.replace), e.g.
    `memory_budget_gib=None` where a benchmark needs every peak measured in full.
    """
    probe = space.probe
    count = iterations or probe.iterations
    settings = ProbeSettings(
        model=space.model,
        reward_model=space.reward_model,
        device=device,
        world_size=space.gpus,
        warmup_iterations=probe.warmup,
        iterations=count,
        timeout_seconds=probe.timeout_seconds * max(1.0, count / probe.iterations),
        memory_budget_gib=space.memory_budget_gib,
    )
    return dataclasses.replace(settings, **changes)


def space_budget(space: SearchSpace) -> Budget:
    """The study's budget for `space`: its memory_budget_gib and headroom (feasible: peak <= .limit)."""
    from autotune.memory.budget import Budget

    if space.memory_budget_gib is None:
        raise ValueError(f"space {space.name!r} sets no memory_budget_gib: a benchmark needs one")
    return Budget(int(space.memory_budget_gib * GIB), space.headroom)


def memory_model_for(
    model: str, reward_model: str = "function", gpus: int = 1, device: str = "cpu"
) -> MemoryModel:
    """The uncalibrated (prior) memory model of an actor, a reward model (or function) and a rank count."""
    from autotune.models.catalog import resolve_model, resolve_reward_model

    arch = Architecture.from_specs(resolve_model(model), resolve_reward_model(reward_model))
    return MemoryModel(arch, gpus, device)


def prior_memory_model(space: SearchSpace, device: str = "cpu") -> MemoryModel:
    """The prior memory model of a space, as `autotune run` builds it before its first probe."""
    return memory_model_for(space.model, space.reward_model, space.gpus, device)


def grid_table(path: Path) -> dict[str, dict[str, Any]]:
    """A table of probes (JSON lines with "key" and "result", as bench/search_tables.py writes): ProbeResult
    dicts by config key, in the file's order (a key probed twice: its last probe); {} where the file does
    not exist yet."""
    if not path.exists():
        return {}
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {current_key(row["key"]): row["result"] for row in rows}


def current_key(stored: str) -> str:
    """A table's config key as today's `config_key` writes it: a key written before ProbeConfig gained a
    field (verl's knobs) reads with that field at its default."""
    from autotune.config.knobs import ProbeConfig
    from autotune.study.trials import config_key

    return config_key(ProbeConfig(**json.loads(stored)))


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """The machine and its load now, to print or keep beside a figure (a busy machine is recognisable).

    Versions come from the installed packages' metadata: nothing heavy is imported.
    """
    import psutil

    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "loadavg": list(os.getloadavg()),
    }
