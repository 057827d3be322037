"""The Optuna study: open or resume it, read its trials, and the memory budget it is judged by.

Two objectives, samples/sec up and peak memory down, and a `memory` constraint (peak − budget·(1 − headroom));
see docs/design.md, "Statuses", for how every outcome is recorded so that the samplers learn from it.
"""

from __future__ import annotations

import json
import re
import statistics
import warnings
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config.knobs import ProbeConfig, job_of
from autotune.errors import AutotuneError, UserError
from autotune.memory.budget import Budget
from autotune.space.model import SearchSpace, config_to_params
from autotune.status import OOM_PHASES, Attr, Status, StudyAttr
from autotune.study.coordination import retry_stale_trial
from autotune.study.storage import make_storage, redact, scrub
from autotune.units import GIB

__all__ = [
    "DIRECTIONS",
    "METRIC_NAMES",
    "check_study_name",
    "config_key",
    "describe_budget",
    "enqueue_seed_configs",
    "finished_trials",
    "make_sampler",
    "measured_ok",
    "memory_model_error",
    "oom_phase",
    "open_study",
    "status_counts",
    "trial_config",
    "trial_config_of",
    "trial_environment",
    "trial_status",
]

DIRECTIONS = [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
METRIC_NAMES = ["samples_per_sec", "peak_memory_bytes"]
# We record heartbeats ourselves around each probe (see autotune.study.coordination), with ask/tell.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,119}")


def check_study_name(name: str) -> str:
    """A study name is a name, not a path: it names a folder under --out and must stay there."""
    if not STUDY_NAME.fullmatch(name) or ".." in name:
        raise UserError(
            f"--study {name!r}: a study name is 1 to 120 letters, digits, '.', '_' or '-', starting with a "
            f"letter or digit (no '/', no '..'); choose e.g. --study my-study"
        )
    return name


def make_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    """Samplers are not stored with a study: always pass one (Optuna 5 changed the default)."""
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5, constant_liar=True)


def open_study(storage: str, name: str, seed: int | None, create: bool = True) -> optuna.Study:
    """Create or resume a study (create=False: only load one); a study with other objectives is an error
    (Optuna would silently ignore the mismatch)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our progress bar says what each trial did
    try:
        backend = make_storage(storage, on_stale=retry_stale_trial)
        if create:
            study = optuna.create_study(
                storage=backend,
                study_name=name,
                directions=["maximize", "minimize"],
                sampler=make_sampler(seed),
                load_if_exists=True,
            )
        else:
            study = optuna.load_study(study_name=name, storage=backend, sampler=make_sampler(seed))
    except KeyError:
        raise UserError(
            f"--study {name}: no such study in {redact(storage)}; check the name or --storage"
        ) from None
    except AutotuneError:
        raise
    except Exception as exc:  # sqlalchemy/driver errors vary by backend: all mean "cannot open it"
        raise UserError(
            f"--storage {redact(storage)}: cannot open it ({type(exc).__name__}: "
            f"{scrub(str(exc).splitlines()[0] if str(exc) else '', storage)}); use sqlite:///PATH, "
            f"journal:PATH or a reachable database URL"
        ) from None
    if list(study.directions) != DIRECTIONS:
        raise UserError(
            f"study {name!r} in {redact(storage)} has directions "
            f"{[d.name.lower() for d in study.directions]}, not [maximize, minimize]: "
            f"it was made by something else; choose another --study name"
        )
    if study.metric_names is None:
        with warnings.catch_warnings():  # set_metric_names is "experimental" in Optuna; its result is not
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(METRIC_NAMES)
    elif list(study.metric_names) != METRIC_NAMES:
        raise UserError(
            f"study {name!r} measures {study.metric_names}, not {METRIC_NAMES}: choose another --study name"
        )
    return study


def trial_status(trial: FrozenTrial) -> str:
    """The `status` attribute; a FAIL without one was failed by Optuna's heartbeat: interrupted."""
    if Attr.STATUS in trial.user_attrs:
        return trial.user_attrs[Attr.STATUS]
    return Status.INTERRUPTED if trial.state == TrialState.FAIL else trial.state.name.lower()


def finished_trials(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def trial_config(trial: FrozenTrial) -> ProbeConfig | None:
    raw = trial.user_attrs.get(Attr.CONFIG)
    return ProbeConfig(**raw) if raw else None


def trial_config_of(trial: FrozenTrial) -> ProbeConfig:
    """The configuration a trial ran; ValueError for one that carries none (every probed trial does)."""
    config = trial_config(trial)
    if config is None:
        raise ValueError(f"trial #{trial.number} carries no configuration")
    return config


def trial_environment(trial: FrozenTrial) -> dict[str, Any]:
    """What the trial's probe recorded of its machine (versions, GPU, the load: probe.conditions)."""
    return (trial.user_attrs.get(Attr.RESULT) or {}).get("environment") or {}


def oom_phase(trial: FrozenTrial) -> str | None:
    """The phase of verl's training the trial ran out of memory in (`status.OOM_PHASES`), when known."""
    kind = trial.user_attrs.get(Attr.OOM_KIND)
    return None if kind is None else OOM_PHASES.get(kind)


def config_key(config: ProbeConfig) -> str:
    """The job a config runs, as text: two configs with one key are measured once (see knobs.job_of)."""
    return json.dumps(job_of(config.to_dict()), sort_keys=True)


def enqueue_seed_configs(study: optuna.Study, space: SearchSpace) -> list[str]:
    """The seed's hand-made configs go first (once per study), so the report can show the gain over them."""
    if study.user_attrs.get(StudyAttr.SEEDED):
        return []
    enqueued = []
    for seed in space.seed_configs:
        params = config_to_params(space, seed.config)
        if params is not None:
            study.enqueue_trial(params, user_attrs={Attr.SEED_CONFIG: seed.name})
            enqueued.append(seed.name)
    study.set_user_attr(StudyAttr.SEEDED, True)
    return enqueued


def status_counts(study: optuna.Study) -> dict[str, int]:
    counts: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        status = trial_status(trial)
        counts[status] = counts.get(status, 0) + 1
    return counts


def measured_ok(trial: FrozenTrial) -> bool:
    """An ok probe of the trial's own: not a duplicate repeating another trial's measurement."""
    attrs = trial.user_attrs
    return attrs.get(Attr.STATUS) == Status.OK and Attr.DUPLICATE_OF not in attrs


def memory_model_error(study: optuna.Study, min_points: int = 1) -> tuple[float | None, int]:
    """Median relative error of predictions made *before* each probe, once calibrated on ≥ min_points."""
    errors = []
    for trial in finished_trials(study):
        attrs = trial.user_attrs
        if (
            measured_ok(trial)
            and attrs.get(Attr.CALIBRATION_POINTS, 0) >= min_points
            and attrs.get(Attr.PREDICTED_PEAK_BYTES)
        ):
            predicted, measured = attrs[Attr.PREDICTED_PEAK_BYTES], attrs[Attr.PEAK_BYTES]
            errors.append(abs(predicted - measured) / measured)
    return (statistics.median(errors) if errors else None), len(errors)


def describe_budget(budget: Budget) -> str:
    limit, headroom = budget.limit / GIB, budget.headroom
    return f"{budget.bytes / GIB:.2f} GiB (feasible ≤ {limit:.2f} GiB with {headroom:.0%} headroom)"
