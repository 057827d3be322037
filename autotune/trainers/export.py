"""What a trainer hands back for a study's pick: `Trainer.export(job) -> Export`.

    job = ExportJob(config, "llama-2-7b", "function", gpus=2, measured={...}, device="cuda")
    export = VERL.export(job)
    export.text          # verl_overrides.txt
    export.document      # best_config.yaml: the seed's schema, the trainer's blocks, `measured:` last

The report gathers the facts from the chosen trial (`ExportJob`); the trainer turns them into its own file,
best_config.yaml and the notes the report prints beside them. The report renders an `Export` the same way for
every trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.config.knobs import ProbeConfig
    from autotune.formats.verl_defaults import ExportedKnob

__all__ = ["Export", "ExportJob"]


@dataclass(frozen=True)
class ExportJob:
    """The chosen configuration and what its probes recorded: what an export is made from."""

    config: ProbeConfig
    model: str
    reward_model: str
    gpus: int  # those the pick was measured on, over all `nodes`
    measured: dict[str, Any]  # best_config.yaml's `measured:` block (report.data.measured_block)
    device: str  # the device the probes ran on ("cuda", "cpu")
    nodes: int = 1
    card_bytes: float | None = None  # the GPU's total memory, else the memory budget (an emulated card)
    resident_bytes: int | None = None  # training states the probe recorded on the device (None: not recorded)
    rollout_name: str = "vllm"  # the rollout engine the job names
    rollout_measured: bool = False  # the probe ran the trainer's own rollout engine: its pool is measured
    model_parameters: int | None = None  # the actor's (the rollout engine's tensor parallel size needs it)
    attention_heads: int | None = None


@dataclass(frozen=True)
class Export:
    """A trainer's files for the pick, and what the report says beside them."""

    document: dict[str, Any]  # best_config.yaml: the seed's schema, the trainer's blocks, `measured:` last
    text: str  # the trainer's own file (`Trainer.export_file`)
    launch_values: dict[str, Any] = field(default_factory=dict)  # what `Trainer.launch_line` reads
    notes: tuple[str, ...] = ()  # how its sizes map to the seed's, and what the probes measured
    knobs: tuple[ExportedKnob, ...] = ()  # each key its file writes, beside the trainer's default
    knobs_lead: str = ""  # what `knobs`' table shows, for the report
    blocks: tuple[str, ...] = ()  # best_config.yaml's keys that are the trainer's, not the configuration
