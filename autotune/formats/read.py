"""Read any config file autotune knows: the seed schema (the article's YAML, best_config.yaml), verl
overrides (verl_overrides.txt, or a bash launch script's main_ppo command), or TRL's trl_config.yaml.

    target = read_target(Path("best_config.yaml"))     # or verl_overrides.txt
    target.config, target.sharding, target.measured, target.findings   # findings: unknown keys and the like

A file that cannot be read as either format, a knob of the wrong type, or a missing batch knob is a
UserError (exit 2): nothing can be checked. An unknown key is a finding: the file is readable, and a typo must
not hide the other problems.

Both formats follow one layout rule: a file that names no sharding is held as verl holds it by default, FSDP
full-shard over every GPU (`DEFAULT_LAYOUT`); `target.layout_assumed` says so. best_config.yaml's `measured:`
block, when its peak and device are usable, becomes `target.measured`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import yaml

from autotune.config.knobs import DEFAULT_HEADROOM
from autotune.errors import UserError
from autotune.formats.launch_script import looks_like_launch_script
from autotune.formats.seed_yaml import read_seed
from autotune.formats.target import DEFAULT_LAYOUT, Measured, Target, looks_like_overrides
from autotune.formats.trl import looks_like_trl, read_trl_config
from autotune.formats.trl import measured_block as trl_measured_block
from autotune.formats.verl import read_overrides
from autotune.units import GIB

__all__ = ["read_measured", "read_target"]

FSDP_SIZE = "actor_rollout_ref.actor.fsdp_config.fsdp_size"
RESHARD = "actor_rollout_ref.actor.fsdp_config.reshard_after_forward"


def read_target(path: Path, gpus: int | None = None, call: int | None = None) -> Target:
    """A seed-schema YAML, a verl override file or launch script (its `call`-th trainer start), or a TRL
    config, read for `gpus` GPUs (default: what the file says); UserError when it is none or is unusable."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config '{path}' " + ("is a directory" if path.is_dir() else "does not exist"))
    text = path.read_text(encoding="utf-8", errors="replace")
    if looks_like_overrides(text) or looks_like_launch_script(text):
        target = read_overrides(text, where=str(path), path=path, call=call)
        values = target.overrides or {}
        return _default_layout(target) if FSDP_SIZE not in values and RESHARD not in values else target
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        reason = " ".join(str(exc).split())[:200]
        raise UserError(f"config '{path}' is not valid YAML: {reason}") from None
    if not isinstance(data, dict):
        raise UserError(
            f"config '{path}' is neither best_config.yaml's schema (a mapping of knobs) nor verl "
            f"overrides (key=value lines)"
        )
    if looks_like_trl(data):
        target = read_trl_config(data, path, text, gpus)
        target.measured = read_measured(trl_measured_block(text))  # the figures its header carries
        return target
    target = read_seed(data, path, gpus)
    target.measured = read_measured(data.get("measured"))
    return target if _names_sharding(data) else _default_layout(target)


def _names_sharding(data: dict[str, Any]) -> bool:
    """fsdp_config.sharding_strategy at the top level or in actor_model_config (an fsdp_config without it is
    FULL_SHARD already, as torch's default)."""
    actor = data.get("actor_model_config")
    sections = [data.get("fsdp_config"), actor.get("fsdp_config") if isinstance(actor, dict) else None]
    return any(isinstance(s, dict) and s for s in sections)


def _default_layout(target: Target) -> Target:
    sharding, label = DEFAULT_LAYOUT
    config = target.config
    if config is not None and not config.sharded:
        config = dataclasses.replace(config, sharding=sharding)
    return dataclasses.replace(
        target, config=config, sharding=sharding, sharding_label=label, layout_assumed=True
    )


def read_measured(block: Any) -> Measured | None:
    """best_config.yaml's `measured:` block (`autotune.report.data.measured_block`); None when it lacks a
    positive peak or a known device (then the file is judged as any other)."""
    if not isinstance(block, dict):
        return None
    peak, device = _number(block.get("peak_memory_bytes")), block.get("device")
    if peak is None or peak <= 0 or device not in ("cpu", "cuda"):
        return None
    gpus, budget = block.get("gpus"), _number(block.get("budget_gib"))
    headroom = _number(block.get("headroom"))
    return Measured(
        peak_bytes=int(peak),
        device=device,
        gpus=gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else 1,
        budget_bytes=budget * GIB if budget is not None and budget > 0 else None,
        headroom=headroom if headroom is not None and 0 <= headroom < 1 else DEFAULT_HEADROOM,
        gpu=block.get("gpu") if isinstance(block.get("gpu"), str) else None,
        samples_per_sec=_number(block.get("samples_per_sec")),
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)
