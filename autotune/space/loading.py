"""A search space built from YAML: a shipped name or a file read (`load_space`), every knob checked
(autotune.space.schema), then the checks across knobs (batch ranges that admit no configuration, holdings
that cannot run, a budget below the floor) and the hand-made configs; every mistake at once."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from autotune.config.checker import MISSING, Checker
from autotune.config.knobs import physical_cores
from autotune.config.numbers import is_int
from autotune.space.model import SearchSpace, twos_in
from autotune.space.schema import NO_ACCUMULATION, choice_ok, least, parse_space_file, read_space
from autotune.space.specs import (
    ACCUM,
    BOOL_KNOBS,
    BUDGETS,
    EXPONENT_ORDER,
    KNOBS,
    LOGPROB,
    MICRO,
    MINI,
    OFFLOAD_KNOBS,
    OPTIONAL_KNOBS,
    POW2,
    PROMPT,
    RESPONSE,
    ROLLOUT,
    SHARDING,
    TRAIN,
    UTILIZATION,
    VERL_KNOBS,
    SeedConfig,
    SpaceError,
)

__all__ = ["load_space", "space_from_dict", "with_settings"]


def load_space(name_or_path: str, cores: int | None = None) -> SearchSpace:
    """A shipped space by name (`default`, `cpu-tiny`, ...) or a YAML file; every mistake at once.

    `cores` is the machine's physical core count (default: this machine's), the ceiling of the workers.
    """
    data, source, name = read_space(name_or_path)
    return space_from_dict(data, source=source, cores=cores, name=name)


def space_from_dict(
    data: Any, source: str = "<search space>", cores: int | None = None, name: str | None = None
) -> SearchSpace:
    """Check a parsed space (e.g. from YAML) and build it; raise `SpaceError` listing every mistake."""
    check = Checker(source)
    cores = physical_cores() if cores is None else cores
    if not isinstance(data, dict):
        check.error("", data, "a search space is a mapping of keys (model, gpus, knobs, ...)")
        raise SpaceError(check.errors)
    top, tune, knobs = parse_space_file(check, data, cores)
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


def _check_conflicts(check: Checker, space: SearchSpace) -> None:
    """Report, naming the knobs, when the batch ranges admit no valid configuration at all."""
    k = {name: space.knob(name) for name in EXPONENT_ORDER}
    v, w = twos_in(space.rollout_n), space.gpus
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
    longest = max(space.knob(PROMPT).values()) + max(space.knob(RESPONSE).values())
    for name in BUDGETS:
        budgets = [b for b in space.knob(name).values(space.cores) if b is not None]
        if budgets and min(budgets) < longest:
            check.error(
                f"knobs.{name}",
                min(budgets),
                f"is below max_prompt_length+max_response_length={longest}: verl requires a token budget of "
                f"at least one sequence",
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
        check.error(f"{path}.{ACCUM}", raw[ACCUM], NO_ACCUMULATION.format(product=_product(raw, gpus)))
    values: dict[str, Any] = {}
    for knob in KNOBS:
        if knob not in raw and knob not in OPTIONAL_KNOBS:
            if not (knob == MINI and ACCUM in raw):  # said once, on the line above
                check.error(f"{path}.{knob}", MISSING, "missing: a seed config sets every knob")
            continue
        value = raw.get(knob, OPTIONAL_KNOBS.get(knob))
        if knob in (*BOOL_KNOBS, SHARDING):
            choice_ok(check, f"{path}.{knob}", knob, value)
        elif knob == UTILIZATION and value is not None:
            check.number(f"{path}.{knob}", value, 0, 1, open_low=True, open_high=True)
        elif not (knob in (LOGPROB, *VERL_KNOBS) and value is None):
            check.integer(f"{path}.{knob}", value, least(knob))
        values[knob] = value
    return values if len(check.errors) == before else None


def _product(raw: dict, gpus: int | None) -> str:
    """': micro×accumulation×gpus = 4×2×1 = 8' for the hint, where the seed and the space say so."""
    m, g = raw.get(MICRO), raw.get(ACCUM)
    if gpus is None or not (is_int(m) and is_int(g)):
        return ", micro×accumulation×gpus"
    return f": micro×accumulation×gpus = {m}×{g}×{gpus} = {m * g * gpus}"


def with_settings(space: SearchSpace, **changes: Any) -> SearchSpace:
    """The same file with top-level settings replaced (e.g. `gpus=2`), rechecked as a new file is."""
    data = copy.deepcopy(dict(space.raw))
    data.update(changes)
    return space_from_dict(data, source=space.source, cores=space.cores, name=space.name)
