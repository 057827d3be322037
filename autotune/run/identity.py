"""What a study's measurements depend on beyond the configurations: its identity, and the fingerprint that
names it. Another job (another model, device, recipe, budget, data or passes) gets another study; a worker
brings its part (`machine_identity`) and is refused where it differs."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from autotune.memory.budget import Budget
from autotune.probe.contract import ProbeSettings
from autotune.run.job_data import PROMPTS_LIMIT
from autotune.trainers.registry import BUILTIN, engine_named

__all__ = ["identity_fingerprint", "machine_identity", "study_identity"]


def study_identity(
    actor: Any,
    reward: Any,
    settings: ProbeSettings,
    device: str,
    budget: Budget,
    lengths: Any,
    recipe: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a study's measurements depend on, beyond the configurations themselves (the recipe too: trials
    of another T or mini batch train another algorithm, and must not be mixed into the selection; and whose
    passes the probe runs on which lengths: a probe of verl's packed passes measures another job than one of
    padded rows)."""
    prompts = None
    if lengths is not None and lengths.prompt_texts:
        prompts = _digest(json.dumps(lengths.prompt_texts[:PROMPTS_LIMIT]))
    responses = (settings.lengths or {}).get("responses")
    return {
        **machine_identity(actor, reward, device, settings.world_size, settings.nodes),
        "budget_bytes": budget.bytes,
        "iterations": f"{settings.warmup_iterations} warm-up + {settings.iterations} measured",
        "prompts": prompts or "synthetic",
        "passes": settings.passes,
        "responses": _digest(json.dumps(responses)) if responses else "at the limit",
        # the built-in probe's studies carry no engine key, so that their fingerprints stay as they were
        **({"engine": settings.engine} if engine_named(settings.engine) is not BUILTIN else {}),
        **({"recipe": recipe} if recipe is not None else {}),
    }


def machine_identity(actor: Any, reward: Any, device: str, gpus: int, nodes: int = 1) -> dict[str, Any]:
    """The part of a study's identity each worker brings: its models (by fingerprint: the architecture and
    weights, not the folder's name), its device and its ranks per probe (and the nodes they span: ranks
    that talk over a network time differently)."""
    from autotune.models.catalog import fingerprint

    return {
        "model": fingerprint(actor),
        "reward_model": fingerprint(reward) if reward is not None else "function",
        "device": device,
        "gpus": gpus,
        **({"nodes": nodes} if nodes > 1 else {}),  # older studies: one node
    }


def identity_fingerprint(identity: dict[str, Any]) -> str:
    return _digest(json.dumps(identity, sort_keys=True))[:8]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]
