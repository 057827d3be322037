"""The study plan: what every `run`, `worker` and `report` of one study shares, stored with the study.

`autotune run` stores it once it has resolved the space (model and GPUs from the command line, lengths fitted
to `--data`), the memory budget and the probe settings; `autotune worker` probes from it on another machine,
and `autotune report` reads the model, GPUs and budget from it. Machine-local choices (device, GPU slot, CPU
threads, remote code) are not part of it: each process decides those for itself.

    plan = StudyPlan.of(space, settings, budget, trials=20)
    plan.save(study)
    StudyPlan.load(study).budget         # Budget(bytes, headroom)
    StudyPlan.load(study).recipe         # what it trains: T, M, lengths, algorithm, n, KL, LoRA ({} if older)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import optuna

from autotune.config.knobs import DEFAULT_HEADROOM
from autotune.config.passes import Passes
from autotune.errors import UserError
from autotune.memory.budget import Budget
from autotune.probe.contract import ProbeSettings
from autotune.status import StudyAttr
from autotune.trainers.registry import ProbeEngine, Trainer, engine_named, trainer_named

__all__ = ["LOCAL_SETTINGS", "StudyPlan", "check_same_job", "study_trainer"]

LOCAL_SETTINGS = (
    "device",
    "visible_devices",
    "threads_per_rank",
    "trust_remote_code",
    "engine_python",
    "ray_address",
    "placement_timeout",
)


@dataclass(frozen=True)
class StudyPlan:
    model: str = "unknown"
    reward_model: str = "function"
    gpus: int = 1  # ranks per probe: samples/sec of different world sizes do not compare
    budget_bytes: int | None = None  # per rank
    headroom: float = DEFAULT_HEADROOM
    space_name: str | None = None
    space: dict[str, Any] = field(default_factory=dict)  # the space's YAML as run resolved it
    settings: dict[str, Any] = field(default_factory=dict)  # ProbeSettings less LOCAL_SETTINGS
    trials: int | None = None
    identity: dict[str, Any] = field(default_factory=dict)  # what the measurements depend on
    rollout_engine: str = "vllm"  # verl's rollout.name for the export
    target: str = "verl"  # the trainer the export is for: verl_overrides.txt or trl_config.yaml
    model_parameters: int | None = None  # the actor's: the rollout engine's tensor parallel size needs it
    attention_heads: int | None = None  # the actor's: the tensor parallel size must divide them (vLLM)
    recipe: dict[str, Any] = field(default_factory=dict)  # what the study trains (SearchSpace.recipe)
    tune: list[str] = field(default_factory=list)  # recipe knobs it searches; empty for older studies too
    # generation's share of a verl step, from a verl log (`run --verl-log`): what a gain in the training
    # phases the probe measures makes of a whole step; None: not known (the report gives an example)
    generation_share: float | None = None

    @classmethod
    def of(
        cls,
        space: Any,
        settings: ProbeSettings,
        budget: Budget,
        trials: int,
        identity: dict[str, Any] | None = None,
        **export: Any,
    ) -> StudyPlan:
        shared = {k: v for k, v in dataclasses.asdict(settings).items() if k not in LOCAL_SETTINGS}
        return cls(
            model=space.model,
            reward_model=space.reward_model,
            gpus=space.gpus,
            budget_bytes=int(budget.bytes),
            headroom=float(budget.headroom),
            space_name=space.name,
            space=dict(space.raw),
            settings=shared,
            trials=trials,
            identity=dict(identity or {}),
            recipe=space.recipe(),
            tune=list(space.tune),
            **export,
        )

    @property
    def nodes(self) -> int:
        """Nodes a probe spanned (--nodes), `gpus` // nodes on each: verl's trainer.nnodes (1 for older
        studies)."""
        return int(self.settings.get("nodes") or 1)

    @property
    def trainer(self) -> Trainer:
        """The trainer the study exports for."""
        return trainer_named(self.target)

    @property
    def engine(self) -> ProbeEngine:
        """What ran the study's probes (the built-in probe for a study `run` did not start)."""
        return engine_named(self.settings.get("engine"))

    @property
    def passes(self) -> Passes | None:
        """Whose training passes the probes ran; None for a study `run` did not start."""
        stored = self.settings.get("passes")
        return None if stored is None else Passes(stored)

    @property
    def budget(self) -> Budget | None:
        return None if self.budget_bytes is None else Budget(int(self.budget_bytes), float(self.headroom))

    def probe_settings(
        self,
        device: str,
        trust_remote_code: bool = False,
        engine_python: str | None = None,
    ) -> ProbeSettings:
        """This machine's settings for the study's probes: the stored ones, with what is local
        (LOCAL_SETTINGS): the device, and the python the study's engine runs under here."""
        return ProbeSettings(
            **self.settings,
            device=device,
            trust_remote_code=trust_remote_code,
            engine_python=engine_python,
        )

    def save(self, study: optuna.Study) -> None:
        study.set_user_attr(StudyAttr.PLAN, dataclasses.asdict(self))

    @classmethod
    def load(cls, study: optuna.Study) -> StudyPlan | None:
        """The stored plan; None for a study `autotune run` did not start."""
        attrs = study.user_attrs
        if StudyAttr.PLAN in attrs:
            return cls(**attrs[StudyAttr.PLAN])
        return None


def study_trainer(study: optuna.Study) -> Trainer:
    """The trainer a study exports for (the default trainer for a study `run` did not start)."""
    plan = StudyPlan.load(study)
    return trainer_named(plan.target if plan else None)


def check_same_job(
    study: optuna.Study, identity: dict[str, Any], keys: tuple[str, ...] | None = None
) -> None:
    """Refuse to add to a study measurements of another job: one line naming the first difference.

    `keys` limits the comparison (a worker brings its own device and models, not its own budget)."""
    stored = StudyPlan.load(study)
    if stored is None or not stored.identity or not study.get_trials(deepcopy=False):
        return
    for key in keys or tuple(identity):
        if stored.identity.get(key) != identity.get(key):
            raise UserError(
                f"study {study.study_name!r} measured {key} {stored.identity.get(key)!r}, this run has "
                f"{identity.get(key)!r}: its trials would be mixed with another job's; start another study "
                f"(--study NEW) or use the study's own settings"
            )
