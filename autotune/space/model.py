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

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.config.checker import show
from autotune.config.knobs import DEFAULT_HEADROOM, ProbeConfig, resolve_mini_batch
from autotune.config.numbers import is_int
from autotune.space.specs import (
    BUDGETS,
    CHOICES,
    DYNAMIC,
    DYNAMIC_KNOBS,
    EXPONENT_ORDER,
    FIXED,
    HOLDING_KNOBS,
    LOGPROB,
    MEMORY_EQUAL_FIELDS,
    MEMORY_MONOTONE_KNOBS,
    MICRO,
    MINI,
    OFFLOAD_KNOBS,
    OPTIONAL_MONOTONE_KNOBS,
    POW2,
    RECIPE_KNOBS,
    ROLLOUT,
    SEQS,
    SHARDING,
    TRAIN,
    UNIT_KNOBS,
    UNREACHED,
    UTILIZATION,
    VERL_KNOBS,
    VERL_MAX_NUM_SEQS,
    VLLM_KNOBS,
    WORKERS,
    KnobSpec,
    LoraSpec,
    ProbeSpec,
    SeedConfig,
    near_units,
    unit_form,
)

__all__ = [
    "SearchSpace",
    "at_least_as_large",
    "batch_value_problem",
    "config_to_params",
    "knob_value",
    "misfits",
    "sample_config",
    "twos_in",
]


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
    headroom: float = DEFAULT_HEADROOM
    algorithm: str = "ppo"
    rollout_n: int = 1
    kl_coef: float = 0.05
    lora: LoraSpec = field(default_factory=LoraSpec)
    probe: ProbeSpec = field(default_factory=ProbeSpec)
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
        """Every dynamic-batch setting of the space: off (no budgets), or on with each combination of them."""
        budgets = [self.knob(name).values(self.cores) for name in BUDGETS]
        found = []
        for on in self.knob(DYNAMIC).values():
            for combo in itertools.product(*budgets) if on else [(None,) * len(BUDGETS)]:
                found.append({DYNAMIC: on, **dict(zip(BUDGETS, combo, strict=True))})
        return found

    @property
    def verl_knobs(self) -> list[str]:
        """verl's knobs this space may set (any value but the rule's None or false)."""
        return [n for n in VERL_KNOBS if any(v not in (None, False) for v in self.knob(n).values(self.cores))]

    @property
    def vllm_knobs(self) -> list[str]:
        """vLLM's knobs this space may set: measured only by verl itself (`--engine verl`)."""
        return [n for n in self.verl_knobs if n in VLLM_KNOBS]

    def probe_config(self, values: Mapping[str, Any]) -> ProbeConfig:
        """The ProbeConfig of knob values (mini_batch_size M becomes g = M/(W·m)) and the fixed fields."""
        return ProbeConfig(**resolve_mini_batch(values, self.gpus), **self.fixed_fields)

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
    return f"must be {unit_form(name, knob_unit)}, e.g. {near_units(value, knob_unit)}"


def twos_in(n: int) -> int:
    """The power of two in n (12: 2): a batch knob's exponent offset where n samples make one prompt."""
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
    spec, v = space.knob(name), twos_in(space.rollout_n)
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
    v = twos_in(space.rollout_n)
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
        elif spec.name in BUDGETS and not values[DYNAMIC]:
            values[spec.name] = None  # verl reads the budgets only with dynamic batch size
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
        if spec.name in BUDGETS and not config.use_dynamic_bsz:
            if value is not None:  # sampling never asks: verl reads the budgets only with dynamic batch size
                problems.append(f"{spec.name}={value}: a token budget needs use_dynamic_bsz")
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
