"""Write the defaults and types of the verl keys autotune reads to `autotune/formats/verl_schema.json`,
and verl's default of every key the export writes (`export_defaults`: the report's table of exported knobs
beside verl's defaults).

Source: verl 0.9.1's `verl/trainer/config/_generated_ppo_trainer.yaml` (the composed default trainer config
verl ships), in the copy `./setup.sh test` installs in .venv-verl.
A value's type is its default's; where the default is null or an interpolation, verl's dataclass's (TYPES).

    .venv/bin/python tools/verl_schema.py            # writes the file
    .venv/bin/python tools/verl_schema.py --check    # exit 1 if the shipped file differs from verl's config
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from autotune.formats.verl_schema import READ_KEYS, SCHEMA_FILE  # noqa: E402

SOURCE = "verl/trainer/config/_generated_ppo_trainer.yaml"
YAML_FILE = next(iter(sorted(REPO.glob(f".venv-verl/lib/python*/site-packages/{SOURCE}"))), None)
AR = "actor_rollout_ref"
# Keys whose default does not say the type (null, or an interpolation): the type verl's dataclass declares.
TYPES = {
    "data.gen_batch_size": "int",  # trainer/ppo/v1/trainer_base.py reads it as a prompt count
    f"{AR}.actor.ppo_micro_batch_size": "int",  # workers/config/actor.py ActorConfig: Optional[int]
    f"{AR}.actor.ppo_micro_batch_size_per_gpu": "int",  # ActorConfig: Optional[int]
    f"{AR}.rollout.log_prob_micro_batch_size": "int",  # workers/config/rollout.py RolloutConfig
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu": "int",  # RolloutConfig: Optional[int]
    f"{AR}.rollout.log_prob_use_dynamic_bsz": "bool",  # RolloutConfig: bool
    f"{AR}.rollout.log_prob_max_token_len_per_gpu": "int",  # RolloutConfig: int
    f"{AR}.rollout.max_model_len": "int",  # RolloutConfig: Optional[int]
    f"{AR}.ref.log_prob_micro_batch_size": "int",  # engine_workers.py init_model: the ref's micro batch
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu": "int",
    f"{AR}.ref.log_prob_use_dynamic_bsz": "bool",
    f"{AR}.ref.log_prob_max_token_len_per_gpu": "int",
    "critic.enable": "bool",  # workers/config/critic.py CriticConfig: Optional[bool]
    "critic.ppo_micro_batch_size": "int",  # CriticConfig: Optional[int]
    "critic.ppo_micro_batch_size_per_gpu": "int",
    "critic.forward_micro_batch_size": "int",
    "critic.forward_micro_batch_size_per_gpu": "int",
    "critic.forward_max_token_len_per_gpu": "int",
    "critic.ppo_mini_batch_size": "int",
    "critic.use_dynamic_bsz": "bool",
    "reward_model.enable": "bool",
    "reward_model.model.path": "str",
}


# Keys the export adds with `+` (verl's YAML lacks them): the default of verl's dataclass.
DATACLASS_DEFAULTS = {
    "critic.fsdp.micro_batch_size_per_gpu": None,  # workers/config/engine.py EngineConfig
    "critic.fsdp.infer_micro_batch_size_per_gpu": None,  # EngineConfig
    "critic.fsdp.use_dynamic_bsz": True,  # EngineConfig
    "critic.ppo_infer_max_token_len_per_gpu": 32768,  # workers/config/critic.py CriticConfig
}


def _select(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise SystemExit(f"{key}: not in verl's {SOURCE}")
        node = node[part]
    return node


def _type(key: str, default: Any) -> str:
    if key in TYPES:
        return TYPES[key]
    if isinstance(default, bool):
        return "bool"
    for kind in (int, float, str):
        if isinstance(default, kind) and not (kind is str and "${" in default):
            return kind.__name__
    raise SystemExit(f"{key}: default {default!r} does not say its type: add it to TYPES")


def schema(yaml_file: Path | None = YAML_FILE) -> dict[str, Any]:
    if yaml_file is None:
        raise SystemExit("verl 0.9.1 is not installed in .venv-verl: run ./setup.sh test first")
    config = yaml.safe_load(yaml_file.read_text())
    keys = {}
    for key in READ_KEYS:
        default = _select(config, key)
        keys[key] = {"type": _type(key, default), "default": default}
    return {
        "source": f"verl 0.9.1 {SOURCE} (tools/verl_schema.py writes this file)",
        "keys": keys,
        "export_defaults": _export_defaults(config),
    }


def _export_defaults(config: dict[str, Any]) -> dict[str, Any]:
    from autotune.formats.verl_table import JOB_ROUTES, ROUTES

    names = sorted({key.name.lstrip("+") for route in (*ROUTES, *JOB_ROUTES) for key in route.keys})
    return {
        name: DATACLASS_DEFAULTS[name] if name in DATACLASS_DEFAULTS else _select(config, name)
        for name in names
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="compare with the shipped file instead")
    args = parser.parse_args()
    text = json.dumps(schema(), indent=1) + "\n"
    if args.check:
        same = SCHEMA_FILE.read_text() == text
        print(
            "verl_schema.json matches verl 0.9.1's config" if same else "verl_schema.json differs: regenerate"
        )
        return 0 if same else 1
    SCHEMA_FILE.write_text(text)
    print(f"wrote {SCHEMA_FILE} ({len(READ_KEYS)} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
