"""What autotune asks of a trainer it tunes jobs for, and of an engine that runs its probes.

    trainer = trainer_named("trl")            # autotune.trainers.registry
    trainer.passes                            # Passes.TRL: the built-in probe runs TRL's way for its jobs
    trainer.mini_batch(target)                # samples per optimizer step, as its file counts them

A `Trainer` is a training framework autotune exports for (`--target`): its files, its defaults, the knobs it
has no key for, its launch line and the checks of a tuned copy. A `ProbeEngine` is what runs one probe
(`--engine`): the built-in PPO iteration, or a trainer itself. Layers above ask these objects; none compares
trainer names. A third trainer is a package implementing both plus a line in the registry.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from autotune.config.passes import Passes

if TYPE_CHECKING:
    from rich.console import Console

    from autotune.config.knobs import ProbeConfig
    from autotune.config.rules import Finding
    from autotune.formats.target import Target
    from autotune.probe.contract import ProbeResult, ProbeSettings
    from autotune.space.model import SearchSpace
    from autotune.trainers.export import Export, ExportJob

__all__ = ["ProbeEngine", "Trainer"]


class Trainer(ABC):
    """A trainer autotune exports for (see the module docstring)."""

    name: ClassVar[str]  # --target's value, and what a study stores
    label: ClassVar[str]  # how prose names it ("verl", "TRL")
    file_kind: ClassVar[str]  # formats.target.Target.kind of its own config files
    export_file: ClassVar[str]  # the file a study writes in its keys
    keys_name: ClassVar[str]  # what its keys are called ("verl's keys")
    file_description: ClassVar[str]  # what its export file holds ("Hydra overrides for verl 0.9.1")
    passes: ClassVar[Passes]  # whose passes the built-in probe runs for its jobs
    file_passes: ClassVar[Passes]  # whose passes price its own file (what it runs when it trains)
    spans_nodes: ClassVar[bool]  # its export can start a job over several machines
    shards_states: ClassVar[bool]  # its export writes how states are sharded (else: replicated)
    offloads_states: ClassVar[bool]  # its export writes parameter and optimizer offload
    token_budgets: ClassVar[bool]  # it has log-prob micro batches and token budgets of its own
    launch_edits: ClassVar[str] = "the /path/to/ parts"  # what a user edits in its launch line

    @abstractmethod
    def defaults(self) -> dict[str, Any]:
        """Its own default of each system knob the pick weighs (formats.defaults)."""

    @abstractmethod
    def unread_knobs(self) -> tuple[str, ...]:
        """autotune's knobs it has no key for: searching them changes nothing in the job handed over."""

    def mini_batch(self, target: Target) -> int:
        """Samples per optimizer step, as its file says it: micro batch × accumulation steps × processes."""
        assert target.config is not None
        c = target.config
        return c.micro_batch_size * c.gradient_accumulation_steps * (target.gpus or 1)

    def nodes(self, target: Target) -> Any:
        """The machines its file's job spans (what the file says, unchecked)."""
        return 1

    def config_findings(self, config: ProbeConfig, gpus: int) -> list[Finding]:
        """What its own config object refuses of `config`, said before it starts (beyond autotune's rules)."""
        return []

    def check_space(self, space: SearchSpace) -> None:
        """UserError, one line, for a space it cannot run as the study would measure it."""
        return None

    @abstractmethod
    def tuned_changes(
        self, best: ProbeConfig, gpus: int, knobs: list[str], target: Target, text: str
    ) -> dict:
        """Its keys a tuned copy of its file writes, with their values: the searched knobs only."""

    @abstractmethod
    def tuned_text(self, text: str, changes: dict[str, Any], target: Target, path: Path) -> str:
        """The file's text with `changes` written in; ValueError where it cannot be edited so."""

    @abstractmethod
    def check_copy(
        self, source: Path, original: Target, path: Path, copy: Target, changes: dict[str, Any], gpus: int
    ) -> None:
        """UserError unless the copy at `path` reads back, by its own parser, as the original (`source`, read
        as `original`) with `changes`; `gpus`: the job's."""

    @abstractmethod
    def export(self, job: ExportJob) -> Export:
        """Its file for a study's pick, best_config.yaml with its blocks, and the notes beside them."""

    @abstractmethod
    def launch_line(self, path: str, gpus: int, values: dict[str, Any], reward_model: str) -> str:
        """The bash line that starts it on its exported file at `path` (`values`: the export's keys)."""

    def same_config_line(self) -> str:
        """best_config.yaml's header: where the same configuration is in its keys."""
        return f"{self.export_file} has the same config in {self.keys_name}."


class ProbeEngine(ABC):
    """What runs one probe (`--engine`)."""

    name: ClassVar[str]  # --engine's value, and what a study's probe settings store
    on_ray: ClassVar[bool] = True  # its probes can run on a Ray cluster
    runs_rollout: ClassVar[bool] = False  # the probe runs the trainer's rollout engine: its pool is measured
    python_option: ClassVar[str | None] = None  # the option naming its environment's python ("verl_python")

    trainer: ClassVar[Trainer | None] = None  # the trainer its probes run (None: autotune's own iteration)

    def python_from(self, options: Any) -> str | None:
        """The python its probes run under, as `options` (parsed arguments, run or worker options) name it
        by `python_option`; None: this one."""
        return getattr(options, self.python_option, None) if self.python_option else None

    def check_environment(self, settings: ProbeSettings) -> str | None:
        """The version its probes run under; UserError (exit 2) when they cannot run. None: this python."""
        return None

    def announce(self, settings: ProbeSettings, console: Console) -> None:
        """Check its environment before anything else, and say what it measures."""
        return None

    @abstractmethod
    def run(
        self, config: ProbeConfig, settings: ProbeSettings, cancel: threading.Event | None
    ) -> ProbeResult:
        """One probe to completion, timeout or failure, classified."""

    @abstractmethod
    def knob_findings(self, config: ProbeConfig, device: str | None = None) -> list[Finding]:
        """vLLM's knobs this engine cannot measure (`device` None: not resolved yet)."""

    def check_space_knobs(self, space: SearchSpace, device: str | None = None) -> None:
        """UserError, one line, for searched vLLM knobs this engine cannot measure."""
        return None

    def model_passes(self, passes: Passes) -> Passes:
        """Whose passes the memory model prices for probes this engine runs of `passes`."""
        return passes

    def pools_rollout(self, trainer: Trainer) -> bool:
        """Its probes hold vLLM's pool on the card, for a job of `trainer`."""
        return False

    def untimed_rounds(self, settings: ProbeSettings) -> int:
        """Rounds past the warm-up it runs untimed (TRL's on CPU set the peak)."""
        return settings.warmup_iterations
