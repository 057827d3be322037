"""Search spaces: a YAML file becomes a validated `SearchSpace` whose every sample is valid.

    space = load_space("cpu-tiny")            # a shipped name (see `shipped_spaces()`) or a YAML file path
    config = sample_config(space, trial)      # a ProbeConfig that breaks no rule (autotune.config.rules)
    params = config_to_params(space, seed)    # for study.enqueue_trial(params); None when it does not fit
    space.grid(), space.size()                # every valid configuration, and how many there are
    space.recipe(), space.tune                # what the study trains (held fixed), and the recipe it searches

The recipe (`RECIPE_KNOBS`) is held at one value unless `tune:` names it; the system (`SYSTEM_KNOBS`) is
searched. The batch knobs are chosen in a fixed order (T, M, R, m, lm), each range clipped by the choices
before it, so sampling reaches every valid configuration and nothing else; M becomes g = M/(W·m).

The YAML schema, the construction and how Optuna sees the knobs: docs/search-spaces.md (and docs/design.md,
"Search spaces: valid by construction").
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from autotune.config.knobs import ALGORITHMS, MAX_KL_COEF, SHARDINGS, ProbeConfig, physical_cores
from autotune.config.numbers import MAX_GIB, MAX_RANKS, MAX_SECONDS, is_int
from autotune.config.schema import MISSING, Checker, show
from autotune.errors import UserError, single_line
from autotune.units import divisors

__all__ = [
    "HOLDING_KNOBS",
    "KNOBS",
    "LEGACY_PREFIX",
    "MEMORY_EQUAL_FIELDS",
    "MEMORY_MONOTONE_KNOBS",
    "OFFLOAD_KNOBS",
    "RECIPE_KNOBS",
    "SYSTEM_KNOBS",
    "TIME_ONLY_KNOBS",
    "VERL_KNOBS",
    "KnobSpec",
    "LoraSpec",
    "ProbeSpec",
    "SearchSpace",
    "SeedConfig",
    "SpaceError",
    "at_least_as_large",
    "batch_value_problem",
    "config_to_params",
    "knob_value",
    "load_space",
    "misfits",
    "read_space",
    "sample_config",
    "shipped_spaces",
    "space_from_dict",
    "upgrade_params",
]

TRAIN, MINI, ROLLOUT = "train_batch_size", "mini_batch_size", "rollout_batch_size"
MICRO, LOGPROB = "micro_batch_size", "log_prob_micro_batch_size"
ACCUM = "gradient_accumulation_steps"  # ProbeConfig's field, derived: g = M/(W·m); not a knob
WORKERS, PROMPT, RESPONSE = "num_rollout_workers", "max_prompt_length", "max_response_length"
CHECKPOINTING, SHARDING = "gradient_checkpointing", "sharding"
OFFLOAD_KNOBS = ("param_offload", "optimizer_offload", "offload_policy")
HOLDING_KNOBS = (SHARDING, *OFFLOAD_KNOBS)  # how the training states are held: sampled together
# verl's own knobs (`--engine verl` only; `prepare` refuses them for the built-in probe): vLLM's share of the
# card, tensor parallel size (divisors of W), max_num_seqs, and dynamic batch size with its token budget
UTILIZATION, TP, SEQS = "gpu_memory_utilization", "tensor_model_parallel_size", "max_num_seqs"
VERL_MAX_NUM_SEQS = 256  # max_num_seqs unset: verl's default (trainer/config/rollout/rollout.yaml)
DYNAMIC, BUDGET = "use_dynamic_bsz", "ppo_max_token_len_per_gpu"
VERL_KNOBS = (UTILIZATION, TP, SEQS, DYNAMIC, BUDGET)
DYNAMIC_KNOBS = (DYNAMIC, BUDGET)  # sampled together: the budget only with dynamic batch size on
UTILIZATION_STEP = 0.05  # of a {min, max} share without a step
BOOL_KNOBS = (CHECKPOINTING, *OFFLOAD_KNOBS, DYNAMIC)

UNIT_KNOBS = (TRAIN, MINI, ROLLOUT)  # u·2^k
EXPONENT_ORDER = (TRAIN, MINI, ROLLOUT, MICRO, LOGPROB)  # sampling order: each range clipped by the earlier
LENGTH_KNOBS = (PROMPT, RESPONSE)
KNOBS = (*EXPONENT_ORDER, WORKERS, *LENGTH_KNOBS, CHECKPOINTING, *HOLDING_KNOBS, *VERL_KNOBS)
# What is trained per step (with algorithm, rollout_n, kl_coef and LoRA): fixed unless listed under `tune:`.
RECIPE_KNOBS = (TRAIN, MINI, PROMPT, RESPONSE)
SYSTEM_KNOBS = tuple(name for name in KNOBS if name not in RECIPE_KNOBS)  # speed and memory only: searched
OPTIONAL_KNOBS: dict[str, Any] = {  # omitted -> this value (verl's defaults)
    LOGPROB: None,
    CHECKPOINTING: True,
    SHARDING: "replicate",
    **dict.fromkeys(OFFLOAD_KNOBS, False),
    **dict.fromkeys(VERL_KNOBS, None),  # the export's rule or verl's default
    DYNAMIC: False,
}

LEGACY_PREFIX = "log2_"  # how studies before the readable parameters named an exponent

# Kinds of KnobSpec.
FIXED, CHOICES, POW2, LINEAR = "fixed", "choices", "pow2", "linear"

# Memory (docs/design.md, "Knobs and invariants"): the peak grows with MEMORY_MONOTONE_KNOBS (the log-prob
# knob by its effective value, `None` = micro); gradient checkpointing goes the other way (True needs LESS
# memory); MEMORY_EQUAL_FIELDS must be equal to compare two configs at all (another holding moves the states
# between GPU and host in other ways); TIME_ONLY_KNOBS (ProbeConfig fields) change time, not the peak (T and
# g beyond a rollout buffer of a few MB; the workers are separate processes, outside a rank's CUDA memory
# and its RSS).
MEMORY_MONOTONE_KNOBS = (MICRO, ROLLOUT, PROMPT, RESPONSE, "forward_micro_batch_size")
# The monotone knobs a phase of verl's training does not reach (its rollout engine asleep): an OOM there says
# nothing about them
UNREACHED = {"update": (ROLLOUT, "forward_micro_batch_size"), "scoring": (MICRO, ROLLOUT)}
MEMORY_EQUAL_FIELDS = (
    "algorithm",
    "rollout_n",
    "use_lora",
    "lora_r",
    "use_kl",
    *HOLDING_KNOBS,
    TP,
    SEQS,
    DYNAMIC,
)
# monotone where both are set (vLLM's pool, the tokens per micro-batch); None (a rule) compares only with None
OPTIONAL_MONOTONE_KNOBS = (UTILIZATION, BUDGET)
TIME_ONLY_KNOBS = (TRAIN, ACCUM, WORKERS)

_TOP_KEYS = (
    "description",
    "model",
    "reward_model",
    "gpus",
    "memory_budget_gib",
    "headroom",
    "algorithm",
    "rollout_n",
    "kl_coef",
    "lora",
    "probe",
    "tune",
    "knobs",
    "seed_configs",
)
_LORA_KEYS = ("enabled", "r", "alpha")
_PROBE_KEYS = ("iterations", "warmup", "timeout_seconds")
_RECIPE_RULE = (
    "{name} is part of the recipe (it changes the algorithm: what is trained, per step): fix it to one "
    "value, or list it under tune: to search it, and the report will flag it"
)
_NO_ACCUMULATION = (
    "is no longer a knob: give mini_batch_size: N (samples per optimizer step{product}) instead; the "
    "accumulation steps follow from the micro batch"
)


class SpaceError(UserError):
    """A search space with mistakes: `errors` holds one line per mistake, `<file>: <key>=<value>: <rule>`."""

    def __init__(self, errors: list[str]):
        self.errors = [single_line(error) for error in errors]
        super().__init__("\n".join(self.errors))


# ---------------------------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class KnobSpec:
    """How one knob is searched.

    kind `fixed`: `choices` holds the one value. `choices`: a categorical over `choices`. `pow2`: the value is
    `unit·2^e` for e in [low, high] (batch knobs always have this kind, a fixed one with low == high; for a
    length `unit` is 1). `linear`: low, low+step, ..., high (for workers, `high` before clipping to cores).
    """

    name: str
    kind: str
    choices: tuple[Any, ...] = ()
    low: int = 0
    high: int = 0
    step: int = 1
    unit: int = 1

    @property
    def param(self) -> str:
        """The Optuna parameter name: the knob's own, with its real values (see the module docstring)."""
        return self.name

    @property
    def legacy_param(self) -> str | None:
        """The name older studies gave an exponent knob (`log2_...`; T, M and R counted units of W·n)."""
        if self.kind != POW2:
            return None
        if self.name in UNIT_KNOBS:
            return f"{LEGACY_PREFIX}{self.name.removesuffix('_size')}_units"
        return f"{LEGACY_PREFIX}{self.name}"

    @property
    def searched(self) -> bool:
        """Whether sampling asks the trial for it (a fixed knob adds no Optuna parameter)."""
        if self.kind == FIXED:
            return False
        return self.kind == CHOICES or self.high > self.low

    def value(self, exponent: int) -> int:
        return self.unit * 2**exponent

    def exponent(self, value: Any) -> int | None:
        """e with value == unit·2^e, or None."""
        if not is_int(value) or value < self.unit or value % self.unit:
            return None
        q = value // self.unit
        return q.bit_length() - 1 if q & (q - 1) == 0 else None

    def linear_high(self, cores: int | None = None) -> int:
        high = min(self.high, cores) if cores is not None and self.name == WORKERS else self.high
        return self.low + (high - self.low) // self.step * self.step

    def values(self, cores: int | None = None) -> tuple[Any, ...]:
        """Every value the knob can take, ignoring the other knobs (workers clipped to `cores`)."""
        if self.kind in (FIXED, CHOICES):
            return self.choices
        if self.kind == POW2:
            return tuple(self.value(e) for e in range(self.low, self.high + 1))
        return tuple(range(self.low, self.linear_high(cores) + 1, self.step))


@dataclass(frozen=True)
class LoraSpec:
    enabled: bool = False
    r: int = 16
    alpha: int = 32


@dataclass(frozen=True)
class ProbeSpec:
    iterations: int = 2
    warmup: int = 1
    timeout_seconds: float = 600.0


@dataclass(frozen=True)
class SeedConfig:
    """A hand-made configuration from the space file (a person's pick, to compare the tuner with)."""

    name: str
    config: ProbeConfig


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space. Build it with `load_space` or `space_from_dict`, which check everything."""

    name: str
    source: str
    model: str
    knobs: tuple[KnobSpec, ...]
    cores: int  # physical cores of the machine it was loaded for: the workers' ceiling
    description: str = ""
    reward_model: str = "function"
    gpus: int = 1
    memory_budget_gib: float | None = None
    headroom: float = 0.10
    algorithm: str = "ppo"
    rollout_n: int = 1
    kl_coef: float = 0.05
    lora: LoraSpec = LoraSpec()
    probe: ProbeSpec = ProbeSpec()
    tune: tuple[str, ...] = ()  # recipe knobs the study searches (an algorithm change: the report says so)
    seed_configs: tuple[SeedConfig, ...] = ()
    # hand-made configs these GPUs cannot run (name, why): a mini batch that is not whole micro-batches on
    # every GPU has no accumulation count (e.g. a seed written for 2 GPUs, run with --gpus 16)
    unfit_seeds: tuple[tuple[str, str], ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def knob(self, name: str) -> KnobSpec:
        for spec in self.knobs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    @property
    def unit(self) -> int:
        """gpus × rollout_n: train, mini and rollout batches are this times a power of two."""
        return self.gpus * self.rollout_n

    @property
    def fixed_fields(self) -> dict[str, Any]:
        """The ProbeConfig fields the space fixes (not knobs)."""
        return {
            "algorithm": self.algorithm,
            "rollout_n": self.rollout_n,
            "use_lora": self.lora.enabled,
            "lora_r": self.lora.r,
            "lora_alpha": self.lora.alpha,
            "kl_coef": self.kl_coef,
        }

    def recipe(self) -> dict[str, Any]:
        """What the study trains, as JSON: each recipe knob's value (a tuned one: the list of its values),
        algorithm, rollout_n, kl_coef and LoRA. `tune` says which knobs are searched."""
        held: dict[str, Any] = {}
        for name in RECIPE_KNOBS:
            values = list(self.knob(name).values(self.cores))
            held[name] = values[0] if len(values) == 1 else values
        return {
            **held,
            "algorithm": self.algorithm,
            "rollout_n": self.rollout_n,
            "kl_coef": self.kl_coef,
            "lora": dataclasses.asdict(self.lora),
        }

    def holdings(self) -> list[dict[str, Any]]:
        """Every way the space may hold the training states: sharding and offload values (offload only
        where the states are sharded)."""
        specs = [self.knob(name) for name in HOLDING_KNOBS]
        found = []
        for combo in itertools.product(*(spec.values() for spec in specs)):
            holding = dict(zip(HOLDING_KNOBS, combo, strict=True))
            if holding[SHARDING] != "replicate" or not any(holding[k] for k in OFFLOAD_KNOBS):
                found.append(holding)
        return found

    def dynamic_batches(self) -> list[dict[str, Any]]:
        """Every dynamic-batch setting of the space: off (no budget), or on with each budget."""
        budgets = self.knob(BUDGET).values(self.cores)
        return [
            {DYNAMIC: on, BUDGET: budget}
            for on in self.knob(DYNAMIC).values()
            for budget in (budgets if on else (None,))
        ]

    @property
    def verl_knobs(self) -> list[str]:
        """verl's knobs this space may set (any value but the rule's None or false)."""
        return [n for n in VERL_KNOBS if any(v not in (None, False) for v in self.knob(n).values(self.cores))]

    def probe_config(self, values: Mapping[str, Any]) -> ProbeConfig:
        """The ProbeConfig of knob values (mini_batch_size M becomes g = M/(W·m)) and the fixed fields."""
        knobs = dict(values)
        mini = knobs.pop(MINI)
        knobs[ACCUM] = mini // (self.gpus * knobs[MICRO])
        return ProbeConfig(**knobs, **self.fixed_fields)

    def with_settings(self, **changes: Any) -> SearchSpace:
        """The same file with top-level settings replaced (e.g. `gpus=2` from the command line), rechecked."""
        data = copy.deepcopy(dict(self.raw))
        data.update(changes)
        return space_from_dict(data, source=self.source, cores=self.cores, name=self.name)

    def grid(self) -> list[ProbeConfig]:
        """Every valid configuration of the space (for an exhaustive benchmark): see `size()` first."""
        return list(self.iter_grid())

    def iter_grid(self) -> Iterator[ProbeConfig]:
        others = _other_specs(self)
        other_values = [k.values(self.cores) for k in others]
        holdings, dynamics = self.holdings(), self.dynamic_batches()
        for exponents in _exponent_tuples(self):
            batch = {name: self.knob(name).value(e) for name, e in exponents.items()}
            for holding, dynamic in itertools.product(holdings, dynamics):
                for combo in itertools.product(*other_values):
                    knobs = dict(zip([k.name for k in others], combo, strict=True))
                    yield self.probe_config({**batch, **holding, **dynamic, **knobs})

    def size(self) -> int:
        """How many valid configurations the space holds (without building them)."""
        others = math.prod(len(k.values(self.cores)) for k in _other_specs(self))
        conditional = len(self.holdings()) * len(self.dynamic_batches())
        return sum(1 for _ in _exponent_tuples(self)) * conditional * others


def knob_value(config: ProbeConfig, name: str, gpus: int) -> Any:
    """A knob's value in `config` on `gpus` ranks: the mini batch is M = m·g·W, the others are fields."""
    if name == MINI:
        return config.micro_batch_size * config.gradient_accumulation_steps * gpus
    return getattr(config, name)


def batch_value_problem(name: str, value: int, unit: int) -> str | None:
    """Why `value` cannot be the batch knob `name` (u·2^k or 2^k), or None."""
    knob_unit = unit if name in UNIT_KNOBS else 1
    if KnobSpec(name, POW2, unit=knob_unit).exponent(value) is not None:
        return None
    return f"must be {_form(name, knob_unit)}, e.g. {_near(value, knob_unit)}"


# ---------------------------------------------------------------------------------------------- sampling


def _v2(n: int) -> int:
    return (n & -n).bit_length() - 1


def _pow2_specs(space: SearchSpace) -> list[KnobSpec]:
    """The batch knobs sampled as exponents, in order (a log-prob knob fixed to None is not one)."""
    return [space.knob(name) for name in EXPONENT_ORDER if space.knob(name).kind == POW2]


def _other_specs(space: SearchSpace) -> list[KnobSpec]:
    """The knobs independent of the batch knobs and of the holding: workers, lengths, checkpointing (and a
    log-prob knob fixed to None)."""
    exponents = {spec.name for spec in _pow2_specs(space)}
    conditional = (*HOLDING_KNOBS, *DYNAMIC_KNOBS)
    return [k for k in space.knobs if k.name not in exponents and k.name not in conditional]


def _bounds(space: SearchSpace, name: str, chosen: Mapping[str, int]) -> tuple[int, int]:
    """The exponent range of `name` given the exponents chosen before it: exactly those with a completion."""
    spec, v = space.knob(name), _v2(space.rollout_n)
    if name == TRAIN:
        return _train_floor(space), spec.high
    b = chosen[TRAIN]
    if name == MINI:  # M divides T; leave room for the smallest micro batch: m divides M/W = n·2^c
        return max(spec.low, space.knob(MICRO).low - v), min(spec.high, b)
    if name == ROLLOUT:
        return spec.low, min(spec.high, b)  # T % R == 0
    if name == MICRO:
        return spec.low, min(spec.high, chosen[MINI] + v)  # g = M/(W·m) whole
    return spec.low, min(spec.high, b + v)  # LOGPROB: lm divides T/W = n·2^b


def _train_floor(space: SearchSpace) -> int:
    """b's lowest value that leaves room for every later knob's minimum."""
    v = _v2(space.rollout_n)
    floors = [
        space.knob(TRAIN).low,
        space.knob(MINI).low,
        space.knob(ROLLOUT).low,
        space.knob(MICRO).low - v,
    ]
    if space.knob(LOGPROB).kind == POW2:
        floors.append(space.knob(LOGPROB).low - v)
    return max(floors)


def _exponent_tuples(space: SearchSpace) -> Iterator[dict[str, int]]:
    specs = _pow2_specs(space)

    def extend(chosen: dict[str, int], depth: int) -> Iterator[dict[str, int]]:
        if depth == len(specs):
            yield dict(chosen)
            return
        name = specs[depth].name
        low, high = _bounds(space, name, chosen)
        for e in range(low, high + 1):
            chosen[name] = e
            yield from extend(chosen, depth + 1)
        chosen.pop(name, None)

    yield from extend({}, 0)


def _reach(space: SearchSpace) -> dict[str, tuple[int, int]]:
    """Each batch knob's exponents over every valid configuration: its range with the knobs before it at
    their largest (the lower bounds never move, and every value in a range has a completion)."""
    chosen: dict[str, int] = {}
    reach = {}
    for spec in _pow2_specs(space):
        reach[spec.name] = _bounds(space, spec.name, chosen)
        chosen[spec.name] = reach[spec.name][1]
    return reach


def _choices(spec: KnobSpec, exponents: tuple[int, int]) -> list[int]:
    """A power-of-two knob's categorical choices: the same for every trial of a study (Optuna requires it)."""
    return [spec.value(e) for e in range(exponents[0], exponents[1] + 1)]


def sample_config(space: SearchSpace, trial: Any) -> ProbeConfig:
    """One configuration from an Optuna trial (`Trial`, `FixedTrial`), valid by construction.

    `num_rollout_workers` ranges are clipped to `space.cores` (physical cores where the space was loaded);
    the offload knobs are asked only when the sampled sharding shards (false under replicate).
    """
    values: dict[str, Any] = {}
    chosen: dict[str, int] = {}
    for spec, reach in zip(_pow2_specs(space), _reach(space).values(), strict=True):
        low, high = _bounds(space, spec.name, chosen)
        chosen[spec.name] = _suggest_exponent(spec, trial, reach, low, high)
        values[spec.name] = spec.value(chosen[spec.name])
    for spec in space.knobs:  # in KNOBS order: sharding before the offload knobs
        if spec.name in values:
            continue
        if spec.name in OFFLOAD_KNOBS and values[SHARDING] == "replicate":
            values[spec.name] = False
        elif spec.name == BUDGET and not values[DYNAMIC]:
            values[spec.name] = None  # verl reads the budget only with dynamic batch size
        else:
            values[spec.name] = _suggest(spec, trial, space.cores)
    return space.probe_config(values)


def _suggest_exponent(spec: KnobSpec, trial: Any, reach: tuple[int, int], low: int, high: int) -> int:
    """A batch knob's exponent in [low, high], asked as its real value over its whole reach. Outside the
    range only when `tune:` searches T or M and a generic sampler draws past a clipped bound: the nearest
    value inside keeps the configuration valid."""
    if reach[0] == reach[1]:
        return low
    exponent = spec.exponent(trial.suggest_categorical(spec.param, _choices(spec, reach)))
    assert exponent is not None  # every choice is unit·2^e
    return min(max(exponent, low), high)


def _suggest(spec: KnobSpec, trial: Any, cores: int) -> Any:
    if spec.kind == FIXED:
        return spec.choices[0]
    if spec.kind == CHOICES:
        return trial.suggest_categorical(spec.param, list(spec.choices))
    if not spec.searched:
        return spec.values(cores)[0]
    if spec.kind == POW2:  # a length: its values, like the batch knobs'
        return trial.suggest_categorical(spec.param, list(spec.values()))
    return trial.suggest_int(spec.param, spec.low, spec.linear_high(cores), step=spec.step)


def upgrade_params(space: SearchSpace, params: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters of a study written before the readable names: each `log2_...` exponent becomes its knob
    and real value (unit·2^e); other names are kept. For resuming such a study and for reports."""
    upgraded = dict(params)
    for spec in space.knobs:
        legacy = spec.legacy_param
        if legacy is not None and legacy in upgraded:
            exponent = upgraded.pop(legacy)
            if is_int(exponent):
                upgraded[spec.name] = spec.value(exponent)
    return upgraded


def misfits(space: SearchSpace, config: ProbeConfig) -> list[str]:
    """Why the space cannot produce `config` (empty when it can), one reason per knob."""
    return _params_and_misfits(space, config)[1]


def config_to_params(space: SearchSpace, config: ProbeConfig) -> dict[str, Any] | None:
    """The Optuna params that make `sample_config` return `config` (for `study.enqueue_trial`), or None.

    The mini batch is read as m·g·W. A log-prob micro batch of None means "same as micro": it fits a space
    that searches that knob when the micro batch is in its range, and the enqueued trial then sets it
    explicitly.
    """
    params, problems = _params_and_misfits(space, config)
    return None if problems else params


def _params_and_misfits(space: SearchSpace, config: ProbeConfig) -> tuple[dict[str, Any], list[str]]:
    params: dict[str, Any] = {}
    problems = [
        f"{key}={getattr(config, key)}: the space fixes {key}={value}"
        for key, value in space.fixed_fields.items()
        if getattr(config, key) != value and not (key in ("lora_r", "lora_alpha") and not space.lora.enabled)
    ]
    chosen: dict[str, int] = {}
    reach = _reach(space)
    for spec in _pow2_specs(space):
        value = knob_value(config, spec.name, space.gpus)
        if spec.name == LOGPROB and value is None:
            value = config.micro_batch_size
        low, high = _bounds(space, spec.name, chosen) if len(chosen) == _index(space, spec) else (None, None)
        exponent = spec.exponent(value)
        shown = _shown(spec.name, value, config, space.gpus)
        if exponent is None:
            form = f"gpus×rollout_n×2^k = {space.unit}×2^k" if spec.name in UNIT_KNOBS else "a power of two"
            problems.append(f"{spec.name}={shown}: not {form}")
            continue
        if low is not None and high is not None and not low <= exponent <= high:
            span = f"{spec.value(low)}..{spec.value(high)}"
            problems.append(
                f"{spec.name}={shown}: outside {span}, the space's range given the knobs before it"
            )
            continue
        chosen[spec.name] = exponent
        if reach[spec.name][0] < reach[spec.name][1]:
            params[spec.param] = value
    for spec in space.knobs:
        if spec.name in EXPONENT_ORDER and spec.kind == POW2:
            continue
        value = getattr(config, spec.name)
        if spec.name == LOGPROB:  # fixed to None: same as micro
            if value not in (None, config.micro_batch_size):
                problems.append(f"{LOGPROB}={value}: the space uses micro_batch_size for forward passes")
            continue
        if spec.name in OFFLOAD_KNOBS and config.sharding == "replicate":
            if value:  # sampling never asks: offload is false under replicate
                problems.append(f"{spec.name}=true: offload is FSDP's, and the config replicates its states")
            continue
        if spec.name == BUDGET and not config.use_dynamic_bsz:
            if value is not None:  # sampling never asks: verl reads the budget only with dynamic batch size
                problems.append(f"{BUDGET}={value}: a token budget needs use_dynamic_bsz")
            continue
        allowed = spec.values(space.cores)
        if spec.name == WORKERS and is_int(value) and value > space.cores:
            problems.append(f"{WORKERS}={value}: exceeds the {space.cores} physical cores here")
        elif value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
            problems.append(f"{spec.name}={show(value)}: not one of {show(list(allowed))}")
        elif spec.searched:
            params[spec.param] = value
    return params, problems


def _shown(name: str, value: Any, config: ProbeConfig, gpus: int) -> str:
    if name != MINI:
        return str(value)
    m, g = config.micro_batch_size, config.gradient_accumulation_steps
    return f"{value} (micro×accumulation×gpus = {m}×{g}×{gpus})"


def _index(space: SearchSpace, spec: KnobSpec) -> int:
    return [s.name for s in _pow2_specs(space)].index(spec.name)


# ---------------------------------------------------------------------------------------------- memory order


def at_least_as_large(a: ProbeConfig, b: ProbeConfig, oom_phase: str | None = None) -> bool:
    """Whether `a` needs at least as much memory as `b`: if `b` ran out of memory, so does `a`.

    True when `a` >= `b` on every memory-monotone knob (`MEMORY_MONOTONE_KNOBS`: micro, rollout batch,
    prompt and response lengths, the effective log-prob micro batch), `a` does not checkpoint where `b` does
    not (gradient checkpointing True needs LESS memory, so it counts as the smaller value), and the fields
    that change memory in other ways are equal (`MEMORY_EQUAL_FIELDS`: algorithm, rollout_n, LoRA and its
    rank, KL used or not: a reference model or none; sharding and offload: another holding of the states).
    T, g and the workers (`TIME_ONLY_KNOBS`) change time, not the peak, and are not compared; both configs
    are assumed to run on the same number of ranks.

    `oom_phase` ("update" or "scoring", `status.OOM_PHASES`): `b` ran out of memory in that phase of verl's
    training, while the rollout engine slept with its KV cache freed. The rollout share is not compared then,
    `max_num_seqs` counts as monotone (what vLLM keeps asleep, its CUDA graphs captured up to that many
    sequences, never shrinks with more), and the knobs the phase does not reach are not compared
    (`UNREACHED`): in an update the log-prob micro batch and the rollout batch; in the forward passes that
    score the rollout the micro batch, the rollout batch and checkpointing.
    """
    skipped = {"lora_r", SEQS} if oom_phase else {"lora_r"}
    if any(getattr(a, key) != getattr(b, key) for key in MEMORY_EQUAL_FIELDS if key not in skipped):
        return False
    if oom_phase and (a.max_num_seqs or VERL_MAX_NUM_SEQS) < (b.max_num_seqs or VERL_MAX_NUM_SEQS):
        return False
    if a.use_lora and a.lora_r != b.lora_r:
        return False
    if a.gradient_checkpointing and not b.gradient_checkpointing and oom_phase != "scoring":
        return False
    unreached = UNREACHED.get(oom_phase or "", ())
    for key in OPTIONAL_MONOTONE_KNOBS:
        if oom_phase and key == UTILIZATION:
            continue
        x, y = getattr(a, key), getattr(b, key)
        if x != y and (x is None or y is None or x < y):
            return False
    return all(getattr(a, key) >= getattr(b, key) for key in MEMORY_MONOTONE_KNOBS if key not in unreached)


# ---------------------------------------------------------------------------------------------- loading


def shipped_dir() -> Path:
    """The shipped spaces: the checkout's `search_spaces/`, or the installed `autotune.search_spaces`."""
    return Path(str(resources.files("autotune.search_spaces")))


def shipped_spaces() -> list[str]:
    """Names of the shipped spaces (file names without `.yaml`), sorted."""
    return sorted(p.stem for p in shipped_dir().glob("*.yaml"))


def read_space(name_or_path: str) -> tuple[Any, str, str]:
    """(parsed YAML, source path, name) of a shipped space or a YAML file, unchecked: for a caller that
    changes it before `space_from_dict` checks it (the command line's recipe flags)."""
    ref = str(name_or_path)
    if ref in shipped_spaces():
        path, name = shipped_dir() / f"{ref}.yaml", ref
    else:
        path = Path(ref).expanduser()
        name = path.stem
        if not path.is_file():
            raise UserError(_unknown_space_message(ref, path))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the search space: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpaceError([_yaml_error_line(str(path), exc)]) from None
    return data, str(path), name


def load_space(name_or_path: str, cores: int | None = None) -> SearchSpace:
    """A shipped space by name (`default`, `cpu-tiny`, ...) or a YAML file; every mistake at once.

    `cores` is the machine's physical core count (default: this machine's), the ceiling of the workers.
    """
    data, source, name = read_space(name_or_path)
    return space_from_dict(data, source=source, cores=cores, name=name)


def _unknown_space_message(ref: str, path: Path) -> str:
    names = ", ".join(shipped_spaces())
    if path.exists():
        return f"search space '{ref}' is not a file: pass a YAML file, or one of {names}"
    if "/" in ref or "\\" in ref or path.suffix in (".yaml", ".yml"):
        return f"search space file '{ref}' does not exist: pass a YAML file, or one of {names}"
    close = difflib.get_close_matches(ref, shipped_spaces(), n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown search space {ref!r}{guess}: use one of {names}, or a path to a YAML file"


def _yaml_error_line(source: str, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{source}: {where}: invalid YAML: {problem}"


def space_from_dict(
    data: Any, source: str = "<search space>", cores: int | None = None, name: str | None = None
) -> SearchSpace:
    """Check a parsed space (e.g. from YAML) and build it; raise `SpaceError` listing every mistake."""
    check = Checker(source)
    cores = physical_cores() if cores is None else cores
    if not isinstance(data, dict):
        check.error("", data, "a search space is a mapping of keys (model, gpus, knobs, ...)")
        raise SpaceError(check.errors)
    check.unknown_keys("", data, _TOP_KEYS)
    top = _parse_top(check, data)
    unit = top["gpus"] * top["rollout_n"] if top["gpus"] and top["rollout_n"] else None
    tune = _parse_tune(check, data.get("tune"))
    knobs = _parse_knobs(check, data.get("knobs"), unit, cores, top["gpus"])
    _check_recipe(check, knobs, tune, data.get("knobs"))
    space = None
    if not check.errors:
        space = SearchSpace(
            name=name or Path(source).stem,
            source=source,
            knobs=tuple(knobs[k] for k in KNOBS),
            cores=cores,
            tune=tune,
            raw=copy.deepcopy(data),
            **top,
        )
        _check_conflicts(check, space)
        _check_holding(check, space)
        _check_budget(check, space)
    seeds, unfit = _parse_seeds(check, data.get("seed_configs"), space, top["gpus"])
    if check.errors:
        raise SpaceError(check.errors)
    assert space is not None
    return dataclasses.replace(space, seed_configs=tuple(seeds), unfit_seeds=tuple(unfit))


def _parse_top(check: Checker, data: dict) -> dict[str, Any]:
    top: dict[str, Any] = {}
    top["description"] = check.text("description", data.get("description", "")) or ""
    if "model" not in data:
        check.error("model", MISSING, "missing: a registry name (`autotune models`) or a model directory")
    top["model"] = check.text("model", data.get("model"), required=True) if "model" in data else None
    top["reward_model"] = check.text("reward_model", data.get("reward_model", "function"), required=True)
    top["gpus"] = check.integer("gpus", data.get("gpus", 1), 1, MAX_RANKS)
    budget = data.get("memory_budget_gib")
    top["memory_budget_gib"] = (
        None if budget is None else check.number("memory_budget_gib", budget, 0, MAX_GIB)
    )
    top["headroom"] = check.number(
        "headroom", data.get("headroom", 0.10), 0, 1, open_low=False, open_high=True
    )
    algorithm = data.get("algorithm", "ppo")
    if algorithm not in ALGORITHMS:
        check.error("algorithm", algorithm, f"must be one of {', '.join(ALGORITHMS)}")
        algorithm = None
    top["algorithm"] = algorithm
    top["rollout_n"] = check.integer("rollout_n", data.get("rollout_n", 1), 1)
    if algorithm == "grpo" and top["rollout_n"] is not None and top["rollout_n"] < 2:
        check.error("rollout_n", top["rollout_n"], "GRPO normalises rewards within a group: must be >= 2")
    top["kl_coef"] = check.number("kl_coef", data.get("kl_coef", 0.05), 0, MAX_KL_COEF, open_low=False)
    top["lora"] = _parse_section(check, "lora", data.get("lora", {}), _LORA_KEYS, LoraSpec)
    top["probe"] = _parse_section(check, "probe", data.get("probe", {}), _PROBE_KEYS, ProbeSpec)
    return top


def _parse_section(check: Checker, path: str, data: Any, keys: tuple[str, ...], cls: type) -> Any:
    default = cls()
    if check.mapping(path, data) is None:
        return default
    check.unknown_keys(path, data, keys)
    values: dict[str, Any] = {}
    for key in keys:
        value = data.get(key, getattr(default, key))
        full = f"{path}.{key}"
        if key == "enabled":
            values[key] = check.boolean(full, value)
        elif key == "timeout_seconds":
            values[key] = check.number(full, value, 0, MAX_SECONDS)
        else:
            values[key] = check.integer(full, value, 0 if key == "warmup" else 1)
    return cls(**{k: (getattr(default, k) if v is None else v) for k, v in values.items()})


def _parse_tune(check: Checker, raw: Any) -> tuple[str, ...]:
    """The recipe knobs listed under `tune:` (each once, in order)."""
    if raw is None:
        return ()
    recipe = ", ".join(RECIPE_KNOBS)
    if not isinstance(raw, list):
        check.error("tune", raw, f"must be a list of recipe knobs ({recipe}), e.g. [train_batch_size]")
        return ()
    names = []
    for i, name in enumerate(raw):
        if name in RECIPE_KNOBS:
            names.append(name)
        elif name in SYSTEM_KNOBS:
            check.error(
                f"tune[{i}]",
                name,
                f"a system knob: the study searches it by its range under knobs; tune lists recipe knobs "
                f"only ({recipe})",
            )
        else:
            check.error(f"tune[{i}]", name, f"not a recipe knob: tune lists {recipe}")
    return tuple(dict.fromkeys(names))


def _check_recipe(check: Checker, knobs: dict[str, KnobSpec], tune: tuple[str, ...], raw: Any) -> None:
    """A recipe knob is one value unless `tune` names it; a knob `tune` names has more than one."""
    for name in RECIPE_KNOBS:
        spec = knobs.get(name)
        if spec is None:
            continue  # missing or wrong: already reported
        if spec.searched and name not in tune:
            check.error(f"knobs.{name}", raw[name], _RECIPE_RULE.format(name=name))
        elif name in tune and not spec.searched:
            check.error(
                "tune",
                list(tune),
                f"{name} is fixed ({show(spec.values()[0])}) under knobs: give it a range {{min, max}} or "
                f"{{choices: [...]}} to search it, or drop it from tune",
            )


def _parse_knobs(
    check: Checker, data: Any, unit: int | None, cores: int, gpus: int | None = None
) -> dict[str, KnobSpec]:
    if check.mapping("knobs", data) is None:
        return {}
    check.unknown_keys("knobs", {k: v for k, v in data.items() if k != ACCUM}, KNOBS)
    if ACCUM in data:
        check.error(f"knobs.{ACCUM}", data[ACCUM], _NO_ACCUMULATION.format(product=", M = m·g·W"))
    knobs = {}
    for name in KNOBS:
        if name not in data and name not in OPTIONAL_KNOBS:
            if not (name == MINI and ACCUM in data):  # said once, on the line above
                check.error(
                    f"knobs.{name}", MISSING, "missing: a value (fixed), {min, max} or {choices: [...]}"
                )
            continue
        raw = data.get(name, OPTIONAL_KNOBS.get(name))
        if name in (UTILIZATION, TP):
            spec = _parse_verl_knob(check, name, raw, gpus)
        else:
            spec = _parse_knob(check, name, raw, unit, cores)
        if spec is not None:
            knobs[name] = spec
    return knobs


def _parse_knob(check: Checker, name: str, raw: Any, unit: int | None, cores: int) -> KnobSpec | None:
    path = f"knobs.{name}"
    batch = name in EXPONENT_ORDER
    knob_unit = (unit or 0) if name in UNIT_KNOBS else 1
    if isinstance(raw, dict):
        if batch:
            keys: tuple[str, ...] = ("min", "max")
            hint = " (batch knobs are powers of two so that every sample is valid: no choices, no step)"
        elif name in (*BOOL_KNOBS, SHARDING):
            keys, hint = ("choices",), ""
        else:
            keys, hint = ("min", "max", "step", "choices"), ""
        check.unknown_keys(path, raw, keys, hint)
        if "choices" in raw and raw.keys() & {"min", "max", "step"}:
            check.error(path, raw, "give either choices or a range {min, max}, not both")
            return None
        if "choices" in raw:
            return _parse_choices(check, name, raw["choices"], cores)
        if name in (*BOOL_KNOBS, SHARDING):
            if not raw:  # else its unknown keys are reported
                check.error(path, raw, "give one value, or {choices: [...]}")
            return None
        return _parse_range(check, name, raw, knob_unit, cores)
    # a scalar: the knob is fixed
    if name in (*BOOL_KNOBS, SHARDING):
        return KnobSpec(name, FIXED, (raw,)) if _choice_ok(check, path, name, raw) else None
    if name in (LOGPROB, *VERL_KNOBS) and raw is None:
        return KnobSpec(name, FIXED, (None,))
    if check.integer(path, raw, 1) is None:
        return None
    if name == WORKERS and raw > cores:
        check.error(path, raw, _too_many_workers(cores))
        return None
    if not batch:
        return KnobSpec(name, FIXED, (raw,))
    if not knob_unit:
        return None  # gpus or rollout_n is wrong: already reported
    spec = KnobSpec(name, POW2, unit=knob_unit)
    exponent = spec.exponent(raw)
    if exponent is None:
        check.error(path, raw, f"must be {_form(name, knob_unit)}, e.g. {_near(raw, knob_unit)}")
        return None
    return dataclasses.replace(spec, low=exponent, high=exponent)


def _choice_ok(check: Checker, path: str, name: str, value: Any) -> bool:
    """One value of a knob that is not a number: a boolean, or a sharding."""
    if name in BOOL_KNOBS:
        return check.boolean(path, value) is not None
    if name == SHARDING and value not in SHARDINGS:
        check.error(path, value, f"must be one of {', '.join(SHARDINGS)} (how the training states are held)")
        return False
    return True


def _parse_choices(check: Checker, name: str, raw: Any, cores: int) -> KnobSpec | None:
    path = f"knobs.{name}.choices"
    if not isinstance(raw, list) or not raw:
        check.error(path, raw, "must be a non-empty list")
        return None
    ok = True
    for i, value in enumerate(raw):
        if name in (*BOOL_KNOBS, SHARDING):
            ok = _choice_ok(check, f"{path}[{i}]", name, value) and ok
        else:
            ok = check.integer(f"{path}[{i}]", value, 1) is not None and ok
    if not ok:
        return None
    if len(set(raw)) != len(raw):
        check.error(path, raw, "lists a value twice")
        return None
    if name == WORKERS and max(raw) > cores:
        check.error(path, raw, _too_many_workers(cores))
        return None
    return KnobSpec(name, FIXED, tuple(raw)) if len(raw) == 1 else KnobSpec(name, CHOICES, tuple(raw))


def _parse_range(check: Checker, name: str, raw: dict, unit: int, cores: int) -> KnobSpec | None:
    path = f"knobs.{name}"
    for key in ("min", "max"):
        if key not in raw:
            check.error(path, raw, f"a range needs both min and max (missing {key})")
            return None
    low = check.integer(f"{path}.min", raw["min"], 1)
    high = check.integer(f"{path}.max", raw["max"], 1)
    step = check.integer(f"{path}.step", raw["step"], 1) if "step" in raw else 1
    if low is None or high is None or step is None:
        return None
    if low > high:
        check.error(f"{path}.min", low, f"exceeds {name}.max={high}")
        return None
    if name == WORKERS:
        if low > cores:
            check.error(f"{path}.min", low, _too_many_workers(cores))
            return None
        spec = KnobSpec(name, LINEAR, low=low, high=high, step=step)
        return spec if spec.linear_high(cores) > low else KnobSpec(name, FIXED, (low,))
    if "step" in raw:  # a linear length
        spec = KnobSpec(name, LINEAR, low=low, high=high, step=step)
        return spec if spec.linear_high() > low else KnobSpec(name, FIXED, (low,))
    if not unit:
        return None  # gpus or rollout_n is wrong: already reported
    # powers of two (times the unit), rounded inward
    e_low = 0
    while unit * 2**e_low < low:
        e_low += 1
    e_high = -1
    while unit * 2 ** (e_high + 1) <= high:
        e_high += 1
    if e_low > e_high:
        check.error(path, raw, f"no value of the form {_form(name, unit)} between {low} and {high}")
        return None
    spec = KnobSpec(name, POW2, low=e_low, high=e_high, unit=unit)
    if name not in EXPONENT_ORDER and e_low == e_high:
        return KnobSpec(name, FIXED, (spec.value(e_low),))
    return spec


def _parse_verl_knob(check: Checker, name: str, raw: Any, gpus: int | None) -> KnobSpec | None:
    """vLLM's share (numbers in (0, 1); {min, max[, step]} every step of 0.05 by default) or the tensor
    parallel size (divisors of the GPUs; {min, max}: those in the range); null = the export's rule."""
    path = f"knobs.{name}"
    if raw is None:
        return KnobSpec(name, FIXED, (None,))
    if isinstance(raw, dict):
        check.unknown_keys(path, raw, ("min", "max", "step", "choices"))
        if "choices" in raw:
            values = raw["choices"] if isinstance(raw["choices"], list) and raw["choices"] else None
            if values is None:
                check.error(f"{path}.choices", raw["choices"], "must be a non-empty list")
                return None
        elif {"min", "max"} <= raw.keys():
            values = _verl_range(check, name, raw, gpus)
            if values is None:
                return None
        else:
            check.error(path, raw, "give one value, {min, max} or {choices: [...]}")
            return None
    else:
        values = [raw]
    checked = [_verl_value(check, f"{path}", name, v, gpus) for v in values]
    if any(v is None for v in checked):
        return None
    unique = tuple(dict.fromkeys(checked))
    return KnobSpec(name, FIXED, unique) if len(unique) == 1 else KnobSpec(name, CHOICES, unique)


def _verl_range(check: Checker, name: str, raw: dict, gpus: int | None) -> list[Any] | None:
    path = f"knobs.{name}"
    if name == TP:
        smallest = check.integer(f"{path}.min", raw["min"], 1)
        largest = check.integer(f"{path}.max", raw["max"], 1)
        if smallest is None or largest is None or gpus is None:
            return None
        found = [d for d in divisors(gpus) if smallest <= d <= largest]
        if not found:
            check.error(path, raw, f"no divisor of the {gpus} GPU(s) in the range")
        return found or None
    low = check.number(f"{path}.min", raw["min"], 0, 1, open_low=True, open_high=True)
    high = check.number(f"{path}.max", raw["max"], 0, 1, open_low=True, open_high=True)
    step = check.number(f"{path}.step", raw.get("step", UTILIZATION_STEP), 0, 1, open_low=True)
    if low is None or high is None or step is None:
        return None
    if low > high:
        check.error(f"{path}.min", low, f"exceeds {name}.max={high}")
        return None
    return [round(low + i * step, 4) for i in range(int((high - low) / step + 1e-9) + 1)]


def _verl_value(check: Checker, path: str, name: str, value: Any, gpus: int | None) -> Any:
    """One value: a share strictly between 0 and 1, or a tensor parallel size that divides the GPUs."""
    if name == UTILIZATION:
        return check.number(path, value, 0, 1, open_low=True, open_high=True)
    size = check.integer(path, value, 1)
    if size is not None and gpus and gpus % size:
        check.error(path, value, f"must divide the {gpus} GPU(s): verl starts GPUs // TP rollout replicas")
        return None
    return size


def _check_conflicts(check: Checker, space: SearchSpace) -> None:
    """Report, naming the knobs, when the batch ranges admit no valid configuration at all."""
    k = {name: space.knob(name) for name in EXPONENT_ORDER}
    v, w = _v2(space.rollout_n), space.gpus
    t_high = k[TRAIN].high
    t_max_text = f"train_batch_size.max={k[TRAIN].value(t_high)}"
    if k[ROLLOUT].low > t_high:
        r_min = k[ROLLOUT].value(k[ROLLOUT].low)
        check.error("rollout_batch_size.min", r_min, f"exceeds {t_max_text}: T must be a multiple of R")
    if k[MINI].low > t_high:
        m_min = k[MINI].value(k[MINI].low)
        check.error(
            "mini_batch_size.min", m_min, f"exceeds {t_max_text}: T must be a whole number of mini-batches"
        )
    elif k[MICRO].low > min(k[MINI].high, t_high) + v:
        ceiling = min(k[MINI].high, t_high)
        which = "mini_batch_size.max" if k[MINI].high <= t_high else "train_batch_size.max"
        largest, m = k[MINI].value(ceiling), 2 ** k[MICRO].low
        verb = "exceeds" if m * w > largest else "divides no mini_batch_size up to"
        check.error(
            "micro_batch_size.min×gpus",
            f"{m}×{w}={m * w}",
            f"{verb} {which}={largest}: every optimizer step needs whole micro-batches on every GPU",
        )
    if k[LOGPROB].kind == POW2 and k[LOGPROB].low > t_high + v:
        lm, share = 2 ** k[LOGPROB].low, k[TRAIN].value(t_high) // w
        verb = "exceeds" if lm > share else "does not divide"
        check.error(
            "log_prob_micro_batch_size.min",
            lm,
            f"{verb} the per-GPU share train_batch_size.max/gpus={share}: "
            "forward-only micro-batches must split it evenly",
        )


def _check_holding(check: Checker, space: SearchSpace) -> None:
    """Offload is FSDP's: a knob that may offload needs a sharding choice, and one that always offloads
    needs every sharding choice sharded (else a replicated sample would have no valid offload value)."""
    shardings = space.knob(SHARDING).values()
    for name in OFFLOAD_KNOBS:
        values = space.knob(name).values()
        if True not in values:
            continue
        if set(shardings) == {"replicate"}:
            check.error(
                f"knobs.{name}",
                list(values) if len(values) > 1 else True,
                "offload is FSDP's: it needs sharding full_shard or shard_grad_op",
            )
        elif False not in values and "replicate" in shardings:
            check.error(
                f"knobs.{name}",
                True,
                f"offload is FSDP's, but the sharding choices include replicate: drop replicate, or give "
                f"{name}: {{choices: [false, true]}}",
            )


def _check_budget(check: Checker, space: SearchSpace) -> None:
    """A token budget holds the longest sequence the space may have (verl asserts it before it cuts
    micro-batches, utils/seqlen_balancing.py:384-386)."""
    budgets = [b for b in space.knob(BUDGET).values(space.cores) if b is not None]
    longest = max(space.knob(PROMPT).values()) + max(space.knob(RESPONSE).values())
    if budgets and min(budgets) < longest:
        check.error(
            f"knobs.{BUDGET}",
            min(budgets),
            f"is below max_prompt_length+max_response_length={longest}: verl requires a token budget of at "
            f"least one sequence",
        )


def _parse_seeds(
    check: Checker, data: Any, space: SearchSpace | None, gpus: int | None
) -> tuple[list[SeedConfig], list[tuple[str, str]]]:
    """The seeds these GPUs can run, and (name, why) of those they cannot; mistakes are reported."""
    if data is None:
        return [], []
    if not isinstance(data, list):
        check.error("seed_configs", data, "must be a list of configurations")
        return [], []
    seeds, unfit = [], []
    for i, raw in enumerate(data):
        path = f"seed_configs[{i}]"
        if check.mapping(path, raw) is None:
            continue
        values = _seed_values(check, path, raw, gpus)
        if values is None or space is None:
            continue
        per_step = values[MICRO] * space.gpus
        if values[MINI] % per_step:
            why = (
                f"mini_batch_size={values[MINI]} is not a whole number of micro-batches on every GPU "
                f"(micro_batch_size×gpus={values[MICRO]}×{space.gpus}={per_step})"
            )
            unfit.append((str(raw["name"]), why))
            continue
        if values[LOGPROB] is None and space.knob(LOGPROB).kind == POW2:
            values[LOGPROB] = values[MICRO]  # "same as micro", explicit as the space samples it
        seeds.append(SeedConfig(str(raw["name"]), space.probe_config(values)))
    return seeds, unfit


def _seed_values(check: Checker, path: str, raw: dict, gpus: int | None) -> dict[str, Any] | None:
    """A seed's knob values, checked; None when any is wrong (each reported)."""
    shown = {k: v for k, v in raw.items() if k != ACCUM}
    check.unknown_keys(path, shown, ("name", *KNOBS), " (algorithm, rollout_n and LoRA come from the space)")
    before = len(check.errors)
    check.text(f"{path}.name", raw.get("name"), required=True)
    if ACCUM in raw:
        check.error(f"{path}.{ACCUM}", raw[ACCUM], _NO_ACCUMULATION.format(product=_product(raw, gpus)))
    values: dict[str, Any] = {}
    for knob in KNOBS:
        if knob not in raw and knob not in OPTIONAL_KNOBS:
            if not (knob == MINI and ACCUM in raw):  # said once, on the line above
                check.error(f"{path}.{knob}", MISSING, "missing: a seed config sets every knob")
            continue
        value = raw.get(knob, OPTIONAL_KNOBS.get(knob))
        if knob in (*BOOL_KNOBS, SHARDING):
            _choice_ok(check, f"{path}.{knob}", knob, value)
        elif knob == UTILIZATION and value is not None:
            check.number(f"{path}.{knob}", value, 0, 1, open_low=True, open_high=True)
        elif not (knob in (LOGPROB, *VERL_KNOBS) and value is None):
            check.integer(f"{path}.{knob}", value, 1)
        values[knob] = value
    return values if len(check.errors) == before else None


def _product(raw: dict, gpus: int | None) -> str:
    """': micro×accumulation×gpus = 4×2×1 = 8' for the hint, where the seed and the space say so."""
    m, g = raw.get(MICRO), raw.get(ACCUM)
    if gpus is None or not (is_int(m) and is_int(g)):
        return ", micro×accumulation×gpus"
    return f": micro×accumulation×gpus = {m}×{g}×{gpus} = {m * g * gpus}"


# ---------------------------------------------------------------------------------------------- helpers


def _too_many_workers(cores: int) -> str:
    return f"exceeds the {cores} physical cores here: more workers compete for them and rollout stalls"


def _form(name: str, unit: int) -> str:
    if name in UNIT_KNOBS:
        return f"gpus×rollout_n×2^k = {unit}×2^k"
    return "a power of two"


def _near(value: int, unit: int) -> str:
    """The values of the form unit·2^k around `value`, for a hint."""
    low = unit
    while low * 2 <= value:
        low *= 2
    return f"{low} or {low * 2}" if value > unit else str(unit)
