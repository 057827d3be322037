"""verl's export of a study's pick: verl_overrides.txt, best_config.yaml's verl blocks, the rollout engine.

The rollout engine (vLLM's share of the card, its tensor parallel size) is sized here by the rules of
formats/rollout.py, beside the training states that stay on the card while vLLM generates: as the probe
recorded them, else as the memory model prices them. A probe that ran verl itself (--engine verl) measured
the engine it ran, so no rule sizes it.
"""

from __future__ import annotations

from dataclasses import replace

from autotune.errors import UserError
from autotune.formats.rollout import RULES, VERL_DEFAULT_WORKERS, RolloutEngine, rollout_engine
from autotune.formats.seed_yaml import VERL_EXPORT, seed_document
from autotune.formats.verl import format_overrides, verl_overrides
from autotune.formats.verl_defaults import exported_knobs
from autotune.memory.architecture import DEVICES, Architecture
from autotune.memory.breakdown import predict_components
from autotune.memory.calibration import PRIORS
from autotune.models.names import verl_model_path
from autotune.trainers.export import Export, ExportJob

__all__ = ["verl_export"]

PROBED_BY_VERL = (
    "the rollout engine's settings are those verl ran with in the probe (--engine verl; verl's defaults "
    "where the configuration sets none): its pool and speed are in the measured figures"
)
SIZES = (
    "Sizes in verl count prompts: data.train_batch_size = T/n, data.gen_batch_size = R/n, "
    "actor.ppo_mini_batch_size = m·g·W/n (verl multiplies it by rollout.n, splits it over the W GPUs "
    "and runs (M·n/W)/m = g micro-batches of m per GPU per optimizer step)."
)
NOT_MEASURED = (
    "Measured: the training side (states, scoring, update) with Hugging Face generate for the rollout. Not "
    f"measured: the rollout engine's memory pool and speed, sized by rule ({RULES})."
)
MEASURED_BY_VERL = (
    "Measured by verl itself (--engine verl): python -m verl.trainer.main_ppo with this job for a few steps, "
    "its rollout engine's pool and speed included."
)
KNOBS_LEAD = (
    "Each key verl_overrides.txt writes, beside verl 0.9.1's default and why the value differs: measured "
    "(the probe ran the job with it), memory (sized from the training states resident while vLLM "
    "generates), rule (a stated rule), the job (GPUs, model, rollout engine)."
)


def verl_export(job: ExportJob) -> Export:
    """verl_overrides.txt, and best_config.yaml with verl's blocks (the rollout engine, each exported key
    beside verl's default); the export's worker count is verl's default unless verl measured the job's."""
    engine = sized_rollout(job)
    workers = None if job.rollout_measured else VERL_DEFAULT_WORKERS
    # best_config.yaml says what verl_overrides.txt says: verl's worker count where the probe did not measure
    # it (the probing machine's is never handed back)
    written = job.config if workers is None else replace(job.config, num_rollout_workers=workers)
    document = seed_document(written, job.model, job.reward_model, job.measured, engine, gpus=job.gpus)
    overrides = verl_overrides(
        job.config, job.gpus, verl_model_path(job.model), engine, workers=workers, nodes=job.nodes
    )
    knobs = exported_knobs(overrides.values, engine, job.rollout_measured)
    figures = document.pop("measured")  # kept last, after the verl keys
    document[VERL_EXPORT] = {knob.key: knob.to_dict() for knob in knobs}
    document["measured"] = figures
    measured = MEASURED_BY_VERL if job.rollout_measured else NOT_MEASURED
    return Export(
        document=document,
        text=format_overrides(overrides.values),
        launch_values=overrides.values,
        notes=(SIZES, measured, *overrides.notes),
        knobs=tuple(knobs),
        knobs_lead=KNOBS_LEAD,
        blocks=(VERL_EXPORT,),
    )


def sized_rollout(job: ExportJob) -> RolloutEngine:
    """The rollout engine beside the pick's training side: on the card the probe ran on (else the budget's
    emulated card), beside the training states that stay on it while vLLM generates (formats/rollout.py) plus
    the runtime (the memory model's constant)."""
    heads = job.model_parameters, job.attention_heads
    if job.rollout_measured:  # exactly the engine the verl probe ran, sized by no rule
        engine = rollout_engine(job.config, job.gpus, job.rollout_name, None, None, *heads)
        notes = tuple(note for note in engine.notes if "no card was known" not in note)
        return replace(engine, notes=(*notes, PROBED_BY_VERL))
    states = job.resident_bytes
    if states is None:
        states = modelled_resident_bytes(job)
    resident = None if states is None else states + PRIORS.get(job.device, PRIORS["cuda"])[0]
    return rollout_engine(job.config, job.gpus, job.rollout_name, job.card_bytes, resident, *heads)


def modelled_resident_bytes(job: ExportJob) -> int | None:
    """The weights and optimizer states per GPU as the memory model prices them, for a probe that did not
    record them; None for a model autotune cannot build."""
    from autotune.models.catalog import resolve_model  # torch and transformers: only when needed

    device = job.device if job.device in DEVICES else "cuda"
    try:
        actor = resolve_model(job.model)
        reward = resolve_model(job.reward_model) if job.reward_model not in (None, "function") else None
        found = predict_components(Architecture.from_specs(actor, reward), job.config, job.gpus, device)
    except (UserError, OSError, ValueError, KeyError):
        return None
    return found.weights + found.optimizer
