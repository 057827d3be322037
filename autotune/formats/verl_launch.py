"""The bash line that starts verl on an exported override file, safe to paste (see `verl_launch_line`)."""

from __future__ import annotations

import shlex
from typing import Any

from autotune.formats.verl import format_value
from autotune.models.names import verl_model_path

__all__ = ["verl_launch_line"]


def verl_launch_line(overrides: str, values: dict[str, Any], reward_model: str = "function") -> str:
    """The command that starts verl on the exported job: the file, then what only the user knows (the data,
    and the model's path where the file has no hub id or directory for it); replace the /path/to/ parts.

    A bash line, safe to paste whatever the file's path: `mapfile` hands verl each line of the file as one
    argument. `$(cat FILE)` splits each line at its spaces and globs it: `key='/my models/x'` (a value in
    Hydra's quotes) would reach verl as two broken words, and `[1,2]` could match a file. `xargs -d '\n'`
    is GNU's only and turns any failure of verl into exit 123. `&&`: where `mapfile` is missing (zsh,
    bash 3) or the file cannot be read, verl does not start on its defaults."""
    extra = ["data.train_files=/path/to/train.parquet", "data.val_files=/path/to/val.parquet"]
    if "actor_rollout_ref.model.path" not in values:
        extra.append("actor_rollout_ref.model.path=/path/to/model")
        if "critic.ppo_micro_batch_size_per_gpu" in values:
            extra.append("critic.model.path=/path/to/model")
    if reward_model != "function":
        reward = verl_model_path(reward_model) or "/path/to/reward_model"
        extra += ["reward_model.enable=true", f"reward_model.model.path={format_value(reward)}"]
    return (
        f"mapfile -t overrides < {shlex.quote(overrides)} && "
        f'python -m verl.trainer.main_ppo "${{overrides[@]}}" {shlex.join(extra)}'
    )
