"""A space file read and checked: the YAML schema's top-level settings, `tune:` and knobs turned into specs,
every mistake one line (docs/search-spaces.md has the schema). `read_space` finds a shipped name or a file."""

from __future__ import annotations

import dataclasses
import difflib
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from autotune.config.checker import MISSING, Checker, show
from autotune.config.knobs import ALGORITHMS, DEFAULT_HEADROOM, MAX_KL_COEF, MIN_LOADER_WORKERS, SHARDINGS
from autotune.config.numbers import MAX_GIB, MAX_RANKS, MAX_SECONDS
from autotune.errors import UserError
from autotune.space.specs import (
    ACCUM,
    BOOL_KNOBS,
    CHOICES,
    CRITIC_BUDGET,
    EXPONENT_ORDER,
    FIXED,
    KNOBS,
    LINEAR,
    LOG_PROB_BUDGET,
    LOGPROB,
    MINI,
    OPTIONAL_KNOBS,
    POW2,
    RECIPE_KNOBS,
    SHARDING,
    SYSTEM_KNOBS,
    TP,
    UNIT_KNOBS,
    UTILIZATION,
    UTILIZATION_STEP,
    VERL_KNOBS,
    WORKERS,
    KnobSpec,
    LoraSpec,
    ProbeSpec,
    SpaceError,
    near_units,
    too_many_workers,
    unit_form,
)
from autotune.units import divisors

__all__ = [
    "NO_ACCUMULATION",
    "choice_ok",
    "least",
    "parse_space_file",
    "read_space",
    "shipped_dir",
    "shipped_spaces",
]


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


NO_ACCUMULATION = (
    "is no longer a knob: give mini_batch_size: N (samples per optimizer step{product}) instead; the "
    "accumulation steps follow from the micro batch"
)


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
        "headroom", data.get("headroom", DEFAULT_HEADROOM), 0, 1, open_low=False, open_high=True
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
        check.error(f"knobs.{ACCUM}", data[ACCUM], NO_ACCUMULATION.format(product=", M = m·g·W"))
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
        return KnobSpec(name, FIXED, (raw,)) if choice_ok(check, path, name, raw) else None
    if name in (LOGPROB, *VERL_KNOBS) and raw is None:
        return KnobSpec(name, FIXED, (None,))
    if check.integer(path, raw, least(name)) is None:
        return None
    if name == WORKERS and raw > cores:
        check.error(path, raw, too_many_workers(cores))
        return None
    if not batch:
        return KnobSpec(name, FIXED, (raw,))
    if not knob_unit:
        return None  # gpus or rollout_n is wrong: already reported
    spec = KnobSpec(name, POW2, unit=knob_unit)
    exponent = spec.exponent(raw)
    if exponent is None:
        check.error(path, raw, f"must be {unit_form(name, knob_unit)}, e.g. {near_units(raw, knob_unit)}")
        return None
    return dataclasses.replace(spec, low=exponent, high=exponent)


def least(name: str) -> int:
    """A knob's smallest value: every size is at least 1, loader workers may be none (as config values)."""
    return MIN_LOADER_WORKERS if name == WORKERS else 1


def choice_ok(check: Checker, path: str, name: str, value: Any) -> bool:
    """One value of a knob that is not a number: a boolean, or a sharding."""
    if name in BOOL_KNOBS:
        return check.boolean(path, value) is not None
    if name == SHARDING and value not in SHARDINGS:
        check.error(path, value, f"must be one of {', '.join(SHARDINGS)} (how the training states are held)")
        return False
    return True


FOLLOWING_BUDGETS = (LOG_PROB_BUDGET, CRITIC_BUDGET)  # null among their choices: the actor's budget


def _parse_choices(check: Checker, name: str, raw: Any, cores: int) -> KnobSpec | None:
    path = f"knobs.{name}.choices"
    if not isinstance(raw, list) or not raw:
        check.error(path, raw, "must be a non-empty list")
        return None
    ok = True
    for i, value in enumerate(raw):
        if name in (*BOOL_KNOBS, SHARDING):
            ok = choice_ok(check, f"{path}[{i}]", name, value) and ok
        elif name in FOLLOWING_BUDGETS and value is None:
            continue  # null: the actor's budget (verl's interpolation)
        else:
            ok = check.integer(f"{path}[{i}]", value, least(name)) is not None and ok
    if not ok:
        return None
    if len(set(raw)) != len(raw):
        check.error(path, raw, "lists a value twice")
        return None
    if name == WORKERS and max(raw) > cores:
        check.error(path, raw, too_many_workers(cores))
        return None
    return KnobSpec(name, FIXED, tuple(raw)) if len(raw) == 1 else KnobSpec(name, CHOICES, tuple(raw))


def _parse_range(check: Checker, name: str, raw: dict, unit: int, cores: int) -> KnobSpec | None:
    path = f"knobs.{name}"
    for key in ("min", "max"):
        if key not in raw:
            check.error(path, raw, f"a range needs both min and max (missing {key})")
            return None
    low = check.integer(f"{path}.min", raw["min"], least(name))
    high = check.integer(f"{path}.max", raw["max"], least(name))
    step = check.integer(f"{path}.step", raw["step"], 1) if "step" in raw else 1
    if low is None or high is None or step is None:
        return None
    if low > high:
        check.error(f"{path}.min", low, f"exceeds {name}.max={high}")
        return None
    if name == WORKERS:
        if low > cores:
            check.error(f"{path}.min", low, too_many_workers(cores))
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
        check.error(path, raw, f"no value of the form {unit_form(name, unit)} between {low} and {high}")
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


def parse_space_file(
    check: Checker, data: dict, cores: int
) -> tuple[dict[str, Any], tuple[str, ...], dict[str, KnobSpec]]:
    """A space file's top-level settings, its `tune:` list and its knobs, each mistake one line in `check`."""
    check.unknown_keys("", data, _TOP_KEYS)
    top = _parse_top(check, data)
    unit = top["gpus"] * top["rollout_n"] if top["gpus"] and top["rollout_n"] else None
    tune = _parse_tune(check, data.get("tune"))
    knobs = _parse_knobs(check, data.get("knobs"), unit, cores, top["gpus"])
    _check_recipe(check, knobs, tune, data.get("knobs"))
    return top, tune, knobs
