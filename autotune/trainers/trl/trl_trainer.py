"""TRL 1.16 as a trainer (`--target trl`) and as the engine of a probe (`--engine trl`).

Its files are GRPOConfig YAML read by TRL's own parser (autotune.formats.trl, formats.trl_read); its export
is trl_config.yaml; it holds states as accelerate's config says, which the export does not write, so a study
for it replicates and does not offload. Its probe is TRL's GRPOTrainer (autotune.probe.trl_backend), whose LM
head and loss are fused (`Passes.TRL_FUSED`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from autotune.config.passes import Passes
from autotune.errors import UserError
from autotune.formats.trl import TRL_KIND, TRL_VERSION
from autotune.trainers.base import Trainer

if TYPE_CHECKING:
    from autotune.config.knobs import ProbeConfig
    from autotune.config.rules import Finding
    from autotune.formats.target import Target
    from autotune.space.model import SearchSpace
    from autotune.trainers.export import Export, ExportJob

__all__ = ["TRL", "TrlTrainer"]

CHECKPOINTING_ALIASES = {"gradient_checkpointing", "activation_checkpointing"}  # transformers' two names


class TrlTrainer(Trainer):
    name = "trl"
    label = "TRL"
    file_kind = TRL_KIND
    export_file = "trl_config.yaml"
    keys_name = "TRL's GRPOConfig fields"
    file_description = f"TRL {TRL_VERSION}'s GRPOConfig fields"
    passes = Passes.TRL
    file_passes = Passes.TRL_FUSED
    spans_nodes = False  # accelerate's multi-node launch is not written
    shards_states = False
    offloads_states = False
    token_budgets = False
    launch_edits = "the /path/to/ parts and the reward"

    def defaults(self) -> dict[str, Any]:
        from autotune.formats.defaults import trl_defaults

        return trl_defaults()

    def unread_knobs(self) -> tuple[str, ...]:
        from autotune.formats.trl import not_trl_knobs

        return not_trl_knobs()

    def export(self, job: ExportJob) -> Export:
        """trl_config.yaml, and best_config.yaml without verl's blocks."""
        from autotune.formats.seed_yaml import seed_document
        from autotune.formats.trl import trl_config_text
        from autotune.models.names import verl_model_path
        from autotune.trainers.export import Export

        model = verl_model_path(job.model)
        text = trl_config_text(job.config, job.gpus, model, job.device, job.measured)
        document = seed_document(job.config, job.model, job.reward_model, job.measured, gpus=job.gpus)
        return Export(document=document, text=text)

    def launch_line(self, path: str, gpus: int, values: dict[str, Any], reward_model: str) -> str:
        from autotune.formats.trl import launch_line

        return launch_line(path, gpus)

    def config_findings(self, config: ProbeConfig, gpus: int) -> list[Finding]:
        from autotune.formats.trl import trl_findings

        return trl_findings(config, gpus)

    def check_space(self, space: SearchSpace) -> None:
        from autotune.trainers.trl.space_check import check_trl_space

        check_trl_space(space)

    def tuned_changes(
        self, best: ProbeConfig, gpus: int, knobs: list[str], target: Target, text: str
    ) -> dict:
        from autotune.formats.tuned_values import trl_changes

        return dict(trl_changes(best, knobs, yaml.safe_load(text) or {}))

    def tuned_text(self, text: str, changes: dict[str, Any], target: Target, path: Path) -> str:
        from autotune.formats.tuned_file import tune_yaml_config

        return tune_yaml_config(text, changes) if changes else text

    def check_copy(
        self, source: Path, original: Target, path: Path, copy: Target, changes: dict[str, Any], gpus: int
    ) -> None:
        """TRL's parser reads every field the original sets as the original, but the changed ones, which read
        their new values (fields TRL derives, such as steps_per_generation, follow them and are the recipe
        check's)."""
        from autotune.formats.trl_read import parse_trl

        where = f"the tuned copy {path}"
        written = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
        before = parse_trl(written, str(source))
        after = parse_trl(yaml.safe_load(path.read_text(encoding="utf-8")) or {}, where)
        allowed = set(changes) | (CHECKPOINTING_ALIASES if CHECKPOINTING_ALIASES & set(changes) else set())
        wrong = [
            key for key in written if key in before and key not in allowed and before[key] != after.get(key)
        ]
        wrong += [key for key, value in changes.items() if after.get(key) != value]
        if wrong:
            shown = ", ".join(f"{key}={after.get(key)!r}" for key in wrong[:3])
            raise UserError(f"{where}: TRL reads {shown}, which the study did not set; it was not kept")


TRL = TrlTrainer()
