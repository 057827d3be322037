"""Each key an export writes beside verl 0.9.1's default, and why the export's value differs from it.

    for knob in exported_knobs(overrides.values, engine, measured_by_verl=False):
        knob.key, knob.value, knob.default, knob.why

Why a value differs: "measured" (the probe ran the job with it), "memory" (sized from the training states
resident while vLLM generates: formats/rollout.py), "rule" (a stated rule: formats/rollout.py, or a rule of
verl's that the value must meet), "the job" (what the job is: its GPUs, model, rollout engine). A value equal
to verl's default says so. verl's defaults are verl_schema.json's `export_defaults` (tools/verl_schema.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.formats.rollout import VERL_DEFAULT_WORKERS, RolloutEngine
from autotune.formats.verl_route import AR
from autotune.formats.verl_schema import export_default

__all__ = ["DEFAULT", "ExportedKnob", "exported_knobs"]

DEFAULT = "verl's default"
JOB_KEYS = (
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
    f"{AR}.model.path",
    "critic.model.path",
    f"{AR}.rollout.name",
)
WORKER_KEYS = ("data.dataloader_num_workers", f"{AR}.rollout.agent.num_workers")
WHY_ENGINE = {
    "memory": "memory: the share the training states resident while vLLM generates leave (less a 10% margin)",
    "measured": "measured: the configuration's own, run by verl (--engine verl)",
    "rule": "rule: one vLLM replica per GPU, since the bf16 weights fit the share",
    DEFAULT: DEFAULT,
}


@dataclass(frozen=True)
class ExportedKnob:
    key: str  # as written (a leading `+` adds a key verl's YAML lacks)
    value: Any
    default: Any  # verl 0.9.1's
    why: str

    @property
    def differs(self) -> bool:
        return self.value != self.default

    @property
    def set_by_rule(self) -> bool:
        """Set away from verl's default by a rule or the memory, not measured nor the job's own."""
        return self.differs and self.why.startswith(("rule", "memory"))

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "verl_default": self.default, "why": self.why}


def exported_knobs(
    values: Mapping[str, Any], engine: RolloutEngine | None, measured_by_verl: bool = False
) -> list[ExportedKnob]:
    """Every written key with verl's default and the reason for its value (module docstring)."""
    return [
        ExportedKnob(key, value, default, _why(key, value, default, engine, measured_by_verl))
        for key, value in values.items()
        for default in (_default(key),)
    ]


def _default(key: str) -> Any:
    try:
        return export_default(key)
    except KeyError:  # a key the table does not write (a caller's own): no default known
        return None


def _why(key: str, value: Any, default: Any, engine: RolloutEngine | None, by_verl: bool) -> str:
    name = key.lstrip("+")
    field = name.rpartition(".")[2]
    if name in (f"{AR}.rollout.gpu_memory_utilization", f"{AR}.rollout.tensor_model_parallel_size"):
        basis = (engine.why(field) if engine is not None else None) or DEFAULT
        if by_verl and basis != "measured":
            return "measured: verl ran the probe with it (verl's default where the configuration set none)"
        if field == "tensor_model_parallel_size" and basis == "memory":
            return "memory: the bf16 weights fit the share only split over this many GPUs"
        return WHY_ENGINE.get(basis, basis)
    if name == f"{AR}.rollout.max_model_len":
        return "rule: max_prompt_length + max_response_length (null sizes vLLM for the model's maximum)"
    if name in WORKER_KEYS:
        if by_verl:
            return "measured: verl ran the probe with it"
        if value == VERL_DEFAULT_WORKERS:
            return f"{DEFAULT}: the probing machine's cores are not the training node's"
        return (
            f"rule: verl splits a step's samples evenly over its agent-loop workers: the largest divisor "
            f"of them not above verl's {VERL_DEFAULT_WORKERS}"
        )
    if name in JOB_KEYS:
        return "the job"
    if value == default:
        return DEFAULT
    return "measured: the probe ran the job with it"
