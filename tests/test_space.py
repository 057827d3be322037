"""Search spaces: every shipped file loads, every sample is valid by construction, mistakes are all listed,
the recipe stays fixed unless `tune:` names it."""

import dataclasses
import io
import itertools
import json
from importlib import resources
from pathlib import Path

import optuna
import pytest
from optuna.trial import FixedTrial
from rich.console import Console

from autotune.config.knobs import BUDGET_KNOBS, ProbeConfig, job_of
from autotune.config.rules import config_findings
from autotune.errors import UserError
from autotune.formats.verl_table import not_verl_knobs
from autotune.run.prepare import hold_unexported
from autotune.space.loading import load_space, space_from_dict, with_settings
from autotune.space.model import at_least_as_large, config_to_params, knob_value, misfits, sample_config
from autotune.space.schema import shipped_spaces
from autotune.space.specs import RECIPE_KNOBS, SpaceError

DATA = Path(__file__).resolve().parent / "data"
MANY_CORES = 64  # the seed's scenarios run on servers with many cores; this machine may have two
SHIPPED = shipped_spaces()

optuna.logging.set_verbosity(optuna.logging.WARNING)


def is_registry_model(name: str) -> bool:
    """A registry name (autotune.models.catalog ships one config.json per name; importing it is slow)."""
    return resources.files("autotune.models.configs").joinpath(f"{name}.json").is_file()


def space_dict(**changes) -> dict:
    """A small valid space as a dict, searching T and M too (listed under tune); `changes` replace top-level
    keys or, as `knobs`, update the knobs (a knob set to None is removed)."""
    data = {
        "model": "tiny-llama",
        "gpus": 1,
        "tune": ["train_batch_size", "mini_batch_size"],
        "knobs": {
            "train_batch_size": {"min": 8, "max": 64},
            "mini_batch_size": {"min": 4, "max": 64},
            "rollout_batch_size": {"min": 4, "max": 32},
            "micro_batch_size": {"min": 1, "max": 16},
            "num_rollout_workers": {"min": 1, "max": 2},
            "max_prompt_length": 16,
            "max_response_length": 8,
            "gradient_checkpointing": {"choices": [True, False]},
        },
    }
    knobs = changes.pop("knobs", {})
    data.update(changes)
    data["knobs"].update(knobs)
    data["knobs"] = {k: v for k, v in data["knobs"].items() if v is not None}
    return data


def tiny_space(cores: int = 2, **changes):
    return space_from_dict(space_dict(**changes), source="test.yaml", cores=cores)


def errors_of(data: dict, cores: int = 2) -> list[str]:
    with pytest.raises(SpaceError) as info:
        space_from_dict(data, source="test.yaml", cores=cores)
    return info.value.errors


def brute_force(space) -> set[ProbeConfig]:
    """Every combination of every knob's values that violates no rule: what grid() must equal. The mini
    batch M becomes g = M/(W·m) where that is whole; offload under replicate is refused by the rules."""
    names = [k.name for k in space.knobs]
    found = set()
    # a token budget may also be unset: what a config without dynamic batch size must have
    values_of = [
        (*k.values(space.cores), None) if k.name in BUDGET_KNOBS else k.values(space.cores)
        for k in space.knobs
    ]
    for combo in itertools.product(*values_of):
        values = dict(zip(names, combo, strict=True))
        unset = [n for n in BUDGET_KNOBS if n in values and values[n] is None]
        if values.get("use_dynamic_bsz") and any(None not in space.knob(n).values() for n in unset):
            continue  # the space's own values, under dynamic batch size
        mini, per_step = values.pop("mini_batch_size"), space.gpus * values["micro_batch_size"]
        if mini % per_step:
            continue
        config = ProbeConfig(**values, gradient_accumulation_steps=mini // per_step, **space.fixed_fields)
        if not config_findings(config, space.gpus, space.cores):
            found.add(config)
    return found


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_space_loads_and_its_seed_configs_fit(name):
    space = load_space(name, cores=MANY_CORES)
    assert is_registry_model(space.model)
    assert space.reward_model == "function" or is_registry_model(space.reward_model)
    assert space.seed_configs, f"{name} has no hand-made seed config"
    for seed in space.seed_configs:
        assert config_findings(seed.config, space.gpus, MANY_CORES) == [], seed.name
        params = config_to_params(space, seed.config)
        assert params is not None, misfits(space, seed.config)
        # enqueued, the study's next trial samples exactly the hand-made config
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        study.enqueue_trial(params)
        assert sample_config(space, study.ask()) == seed.config


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spaces_hold_the_recipe_fixed_and_search_the_system(name):
    space = load_space(name, cores=MANY_CORES)
    assert space.tune == ()
    assert not any(space.knob(knob).searched for knob in RECIPE_KNOBS)
    recipe = space.recipe()
    assert all(isinstance(recipe[knob], int) for knob in RECIPE_KNOBS)
    assert recipe["train_batch_size"] % recipe["mini_batch_size"] == 0
    # every configuration trains the same recipe: same T, same samples per optimizer step
    for config in itertools.islice(space.iter_grid(), 0, None, 97):
        assert config.train_batch_size == recipe["train_batch_size"]
        assert knob_value(config, "mini_batch_size", space.gpus) == recipe["mini_batch_size"]
        assert (config.max_prompt_length, config.max_response_length) == (
            recipe["max_prompt_length"],
            recipe["max_response_length"],
        )
    assert "micro_batch_size" in {k.name for k in space.knobs if k.searched}
    # a knob verl does not read is held at one value (prepare.hold_unexported): a hand-made config's
    assert space.seed_configs and all(
        getattr(space.seed_configs[0].config, name) in space.knob(name).values() for name in not_verl_knobs()
    )


def test_the_shipped_set():
    assert {"default", "cpu-tiny"} <= set(SHIPPED)
    assert sum(name.startswith("seed-") for name in SHIPPED) == 3


def test_cpu_tiny_fits_this_machine_and_its_budget_is_set():
    space = load_space("cpu-tiny")  # this machine's cores
    assert space.memory_budget_gib is not None
    assert all(config_to_params(space, seed.config) is not None for seed in space.seed_configs)
    assert space.size() == len(space.grid())
    # as a study searches it (the rollout batch held): few enough jobs to probe all of them on a CPU (under
    # dynamic batch size verl reads no micro batch size: configs differing only there are one job)
    held = hold_unexported(space, False, Console(file=io.StringIO()))
    jobs = {json.dumps(job_of(config.to_dict()), sort_keys=True) for config in held.grid()}
    assert len(jobs) <= 100 < held.size() and held.knob("rollout_batch_size").values() == (16,)


def test_the_13b_space_shards_and_may_offload():
    space = load_space("seed-4xa100-40g-13b-fsdp", cores=MANY_CORES)
    assert set(space.knob("sharding").values()) == {"full_shard", "shard_grad_op"}
    assert True in space.knob("offload_policy").values()
    seed = space.seed_configs[0].config
    assert (seed.sharding, seed.micro_batch_size, seed.gradient_accumulation_steps) == ("full_shard", 16, 4)


def test_a_seed_config_with_more_workers_than_cores_does_not_fit():
    space = load_space("seed-4xa100-40g-13b-fsdp", cores=2)
    seed = space.seed_configs[0].config
    assert seed.num_rollout_workers == 6
    assert config_to_params(space, seed) is None
    assert misfits(space, seed) == ["num_rollout_workers=6: exceeds the 2 physical cores here"]


def test_invalid_space_lists_every_mistake():
    path = DATA / "invalid_space.yaml"
    with pytest.raises(SpaceError) as info:
        load_space(str(path))
    lines = str(info.value).splitlines()
    assert lines == info.value.errors
    assert all(line.startswith(f"{path}: ") for line in lines)
    expected = [
        "optimizer=adamw: unknown key",
        "gpus=two: must be a whole number",
        "memory_budget_gib=-1: must be a number > 0",
        "headroom=1.5: must be a number >= 0 and < 1",
        "rollout_n=1: GRPO",
        "lora.enabled=maybe: must be true or false",
        "probe.retries=3: unknown key",
        "probe.iterations=0: must be a whole number >= 1",
        "tune[0]=micro_batch_size: a system knob",
        "knobs.micro_batch_sise=4: unknown key (did you mean micro_batch_size?)",
        "knobs.train_batch_size.min=64: exceeds train_batch_size.max=16",
        "knobs.gradient_accumulation_steps=3: is no longer a knob: give mini_batch_size: N",
        "knobs.rollout_batch_size.step=8: unknown key",
        "knobs.micro_batch_size.choices=[1, 2, 4]: unknown key",
        "knobs.max_prompt_length=0: must be a whole number >= 1",
        "knobs.max_response_length.choices=[]: must be a non-empty list",
        "knobs.gradient_checkpointing.choices[1]=yes please: must be true or false",
        "knobs.sharding.choices[1]=ddp: must be one of replicate, full_shard, shard_grad_op",
        "knobs.offload_policy=maybe: must be true or false",
        "seed_configs[0].algorithm=ppo: unknown key",
        "seed_configs[0].micro_batch_size: missing",
    ]
    for fragment in expected:
        assert sum(fragment in line for line in lines) == 1, (fragment, lines)
    # the seed's other four missing knobs; no "mini_batch_size: missing" beside the accumulation line
    assert len(lines) == len(expected) + 4
    assert not any(line.endswith("knobs.mini_batch_size: missing") for line in lines)


@pytest.mark.parametrize("name", SHIPPED)
def test_random_samples_are_valid_and_round_trip(name):
    space = load_space(name, cores=MANY_CORES)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(300):
        trial = study.ask()
        config = sample_config(space, trial)
        assert config_findings(config, space.gpus, space.cores) == [], config
        params = config_to_params(space, config)
        assert params == trial.params
        assert sample_config(space, FixedTrial(params)) == config
        study.tell(trial, 0.0)


def test_grpo_on_two_gpus_samples_whole_groups():
    space = tiny_space(
        gpus=2,
        algorithm="grpo",
        rollout_n=4,
        knobs={
            "train_batch_size": {"min": 8, "max": 256},
            "mini_batch_size": {"min": 8, "max": 64},
            "rollout_batch_size": {"min": 8, "max": 64},
        },
    )
    assert space.unit == 8
    assert space.knob("train_batch_size").values() == (8, 16, 32, 64, 128, 256)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    for _ in range(200):
        config = sample_config(space, study.ask())
        assert config_findings(config, 2, space.cores) == []
        assert config.rollout_n == 4 and config.algorithm == "grpo"
    assert set(space.grid()) == brute_force(space)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"knobs": {"log_prob_micro_batch_size": {"min": 2, "max": 32}}},
        {
            "rollout_n": 3,
            "tune": ["train_batch_size"],
            "knobs": {"train_batch_size": {"min": 3, "max": 96}, "mini_batch_size": 12},
        },
        {"gpus": 2, "knobs": {"sharding": {"choices": ["replicate", "full_shard"]}}},
        {
            "gpus": 2,
            "knobs": {
                "sharding": {"choices": ["replicate", "full_shard", "shard_grad_op"]},
                "offload_policy": {"choices": [False, True]},
                "param_offload": {"choices": [False, True]},
            },
        },
    ],
)
def test_grid_is_unique_valid_and_complete(changes):
    space = tiny_space(**changes)
    grid = space.grid()
    assert len(grid) == len(set(grid)) == space.size()
    assert all(config_findings(c, space.gpus, space.cores) == [] for c in grid)
    assert set(grid) == brute_force(space)


def test_the_cpu_tiny_grid_is_exactly_its_valid_configurations():
    space = load_space("cpu-tiny")
    assert set(space.grid()) == brute_force(space)


def test_the_mini_batch_is_the_micro_batch_times_accumulation_times_gpus():
    space = tiny_space(gpus=2, tune=[], knobs={"train_batch_size": 64, "mini_batch_size": 16})
    grid = space.grid()
    assert {c.micro_batch_size for c in grid} == {1, 2, 4, 8}  # m divides M/W = 8
    for config in grid:
        assert config.micro_batch_size * config.gradient_accumulation_steps * 2 == 16
        assert config.train_batch_size == 64


def test_config_to_params_round_trips_through_fixed_trial():
    space = tiny_space(knobs={"log_prob_micro_batch_size": {"min": 2, "max": 32}})
    for config in space.grid():
        params = config_to_params(space, config)
        assert params is not None
        assert sample_config(space, FixedTrial(params)) == config
    # "same as micro" fits a space that searches the log-prob micro batch, and becomes explicit
    config = dataclasses.replace(space.grid()[-1], micro_batch_size=4, log_prob_micro_batch_size=None)
    config = dataclasses.replace(config, gradient_accumulation_steps=16 // 4)  # keeps M = 16
    params = config_to_params(space, config)
    assert sample_config(space, FixedTrial(params)).log_prob_micro_batch_size == 4


def test_config_to_params_says_why_a_config_does_not_fit():
    space = tiny_space()
    config = ProbeConfig(
        train_batch_size=48,  # not 2^k
        rollout_batch_size=8,
        micro_batch_size=32,  # above the range
        gradient_accumulation_steps=1,
        max_prompt_length=16,
        max_response_length=12,  # not the recipe's
        algorithm="grpo",
        rollout_n=2,
        sharding="full_shard",  # the space replicates
    )
    assert config_to_params(space, config) is None
    reasons = misfits(space, config)
    assert "train_batch_size=48: not gpus×rollout_n×2^k = 1×2^k" in reasons
    assert "max_response_length=12: not one of [8]" in reasons
    assert "algorithm=grpo: the space fixes algorithm=ppo" in reasons
    assert "sharding=full_shard: not one of [replicate]" in reasons
    ok = dataclasses.replace(
        config, train_batch_size=64, max_response_length=8, algorithm="ppo", rollout_n=1, sharding="replicate"
    )
    assert misfits(space, ok) == [
        "micro_batch_size=32: outside 1..16, the space's range given the knobs before it"
    ]
    too_big = dataclasses.replace(ok, micro_batch_size=16, gradient_accumulation_steps=8)  # M = 128 > 64
    assert misfits(space, too_big) == [
        "mini_batch_size=128 (micro×accumulation×gpus = 16×8×1): outside 4..64, the space's range given the "
        "knobs before it"
    ]


@pytest.mark.parametrize(
    ("top", "knobs", "message"),
    [
        (
            {},
            {"mini_batch_size": {"min": 64, "max": 128}},
            "mini_batch_size.min=64: exceeds train_batch_size.max=32: T must be a whole number of "
            "mini-batches",
        ),
        (
            {},
            {"micro_batch_size": {"min": 16, "max": 32}, "mini_batch_size": {"min": 4, "max": 8}},
            "micro_batch_size.min×gpus=16×1=16: exceeds mini_batch_size.max=8",
        ),
        (
            {"gpus": 3},  # T = 3×2^k <= 33: at most 24; M likewise
            {"micro_batch_size": 16, "rollout_batch_size": 3, "mini_batch_size": {"min": 3, "max": 96}},
            "micro_batch_size.min×gpus=16×3=48: exceeds train_batch_size.max=24",
        ),
        (
            {"rollout_n": 3},  # M = 3×2^k: 16 divides none of 3, 6, 12, 24
            {"micro_batch_size": 16, "rollout_batch_size": 3, "mini_batch_size": {"min": 3, "max": 24}},
            "micro_batch_size.min×gpus=16×1=16: divides no mini_batch_size up to mini_batch_size.max=24",
        ),
        (
            {},
            {"rollout_batch_size": {"min": 64, "max": 64}},
            "rollout_batch_size.min=64: exceeds train_batch_size.max=32",
        ),
        (
            {},
            {"log_prob_micro_batch_size": 64},
            "log_prob_micro_batch_size.min=64: exceeds the per-GPU share train_batch_size.max/gpus=32",
        ),
    ],
)
def test_a_space_without_any_valid_configuration_names_the_conflict(top, knobs, message):
    knobs = {"train_batch_size": {"min": 1, "max": 33}, "mini_batch_size": {"min": 1, "max": 33}, **knobs}
    errors = errors_of(space_dict(**top, knobs=knobs))
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"test.yaml: {message}"), errors


# --- the recipe ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("train_batch_size", {"min": 16, "max": 64}),
        ("mini_batch_size", {"min": 4, "max": 8}),
        ("max_prompt_length", {"choices": [16, 32]}),
        ("max_response_length", {"min": 8, "max": 32}),
    ],
)
def test_a_recipe_knob_with_a_range_needs_tune(knob, value):
    fixed = {"train_batch_size": 32, "mini_batch_size": 8}
    errors = errors_of(space_dict(tune=[], knobs={**fixed, knob: value}))
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"test.yaml: knobs.{knob}=")
    assert f"{knob} is part of the recipe (it changes the algorithm: what is trained, per step)" in errors[0]
    assert "list it under tune: to search it, and the report will flag it" in errors[0]
    # listed under tune, the same range is searched
    space = tiny_space(tune=[knob], knobs={**fixed, knob: value})
    assert space.tune == (knob,) and space.knob(knob).searched
    assert isinstance(space.recipe()[knob], list)


def test_tune_names_only_recipe_knobs_with_a_range():
    errors = errors_of(space_dict(tune=["micro_batch_size", "batch", "train_batch_size", "mini_batch_size"]))
    assert len(errors) == 2, errors
    assert "tune[0]=micro_batch_size: a system knob: the study searches it by its range" in errors[0]
    assert "tune[1]=batch: not a recipe knob: tune lists train_batch_size, mini_batch_size" in errors[1]
    errors = errors_of(space_dict(knobs={"train_batch_size": 32}))
    assert errors == [
        "test.yaml: tune=[train_batch_size, mini_batch_size]: train_batch_size is fixed (32) under knobs: "
        "give it a range {min, max} or {choices: [...]} to search it, or drop it from tune"
    ]
    assert errors_of(space_dict(tune="train_batch_size"))[0].startswith("test.yaml: tune=train_batch_size: ")


def test_recipe_lists_what_the_study_trains():
    space = tiny_space(
        tune=[], knobs={"train_batch_size": 32, "mini_batch_size": 8}, kl_coef=0.0, lora={"enabled": True}
    )
    assert space.recipe() == {
        "train_batch_size": 32,
        "mini_batch_size": 8,
        "max_prompt_length": 16,
        "max_response_length": 8,
        "algorithm": "ppo",
        "rollout_n": 1,
        "kl_coef": 0.0,
        "lora": {"enabled": True, "r": 16, "alpha": 32},
    }
    tuned = tiny_space()
    assert tuned.recipe()["train_batch_size"] == [8, 16, 32, 64] and tuned.tune == RECIPE_KNOBS[:2]


def test_gradient_accumulation_is_one_line_that_says_mini_batch_size():
    data = space_dict()
    data["knobs"]["gradient_accumulation_steps"] = {"min": 1, "max": 4}
    del data["knobs"]["mini_batch_size"]
    errors = errors_of(data)
    assert errors == [
        "test.yaml: knobs.gradient_accumulation_steps={min: 1, max: 4}: is no longer a knob: give "
        "mini_batch_size: N (samples per optimizer step, M = m·g·W) instead; the accumulation steps follow "
        "from the micro batch"
    ]
    seed = {
        "name": "old",
        "train_batch_size": 32,
        "rollout_batch_size": 8,
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 4,
        "num_rollout_workers": 1,
        "max_prompt_length": 16,
        "max_response_length": 8,
    }
    errors = errors_of(space_dict(seed_configs=[seed]))
    assert errors == [
        "test.yaml: seed_configs[0].gradient_accumulation_steps=4: is no longer a knob: give "
        "mini_batch_size: N (samples per optimizer step: micro×accumulation×gpus = 2×4×1 = 8) instead; the "
        "accumulation steps follow from the micro batch"
    ]
    del seed["gradient_accumulation_steps"]
    space = tiny_space(seed_configs=[{**seed, "mini_batch_size": 8}])
    assert space.seed_configs[0].config.gradient_accumulation_steps == 4
    # a seed these GPUs cannot run (no whole accumulation count) is set aside with the reason, not an error:
    # a seed written for 2 GPUs may meet --gpus 16
    space = tiny_space(seed_configs=[{**seed, "micro_batch_size": 16, "mini_batch_size": 8}])
    assert space.seed_configs == ()
    assert space.unfit_seeds == (
        (
            "old",
            "mini_batch_size=8 is not a whole number of micro-batches on every GPU "
            "(micro_batch_size×gpus=16×1=16)",
        ),
    )


# --- the holding: sharding and offload --------------------------------------------------------------------


def test_sharding_and_offload_knobs_parse():
    space = tiny_space()
    assert space.knob("sharding").values() == ("replicate",)
    assert space.knob("gradient_checkpointing").values() == (True, False)
    assert all(space.knob(k).values() == (False,) for k in ("param_offload", "optimizer_offload"))
    space = tiny_space(
        gpus=2,
        knobs={
            "sharding": "full_shard",
            "offload_policy": True,
            "param_offload": {"choices": [False, True]},
            "gradient_checkpointing": None,  # omitted: verl's default, on
        },
    )
    assert space.knob("gradient_checkpointing").values() == (True,)
    assert {(c.sharding, c.offload_policy) for c in space.grid()} == {("full_shard", True)}
    assert {c.param_offload for c in space.grid()} == {False, True}
    assert len(space.holdings()) == 2


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"sharding": "fsdp"}, "knobs.sharding=fsdp: must be one of replicate, full_shard, shard_grad_op"),
        ({"sharding": {"min": 1}}, "knobs.sharding.min=1: unknown key"),
        ({"param_offload": "yes"}, "knobs.param_offload='yes': must be true or false"),
        ({"optimizer_offload": {"choices": [True, True]}}, "lists a value twice"),
        (
            {"offload_policy": {"choices": [False, True]}},
            "knobs.offload_policy=[false, true]: offload is FSDP's: it needs sharding full_shard or "
            "shard_grad_op",
        ),
        (
            {"sharding": {"choices": ["replicate", "full_shard"]}, "param_offload": True},
            "knobs.param_offload=true: offload is FSDP's, but the sharding choices include replicate",
        ),
    ],
)
def test_a_wrong_holding_is_one_line(knobs, message):
    errors = errors_of(space_dict(knobs=knobs))
    assert len(errors) == 1 and message in errors[0], errors


def test_offload_is_sampled_only_for_sharded_states():
    space = tiny_space(
        gpus=2,
        tune=[],  # a fixed recipe: the params are the config exactly (with T or M tuned, see below)
        knobs={
            "train_batch_size": 32,
            "mini_batch_size": 16,
            "sharding": {"choices": ["replicate", "full_shard"]},
            "optimizer_offload": {"choices": [False, True]},
        },
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    seen = set()
    for _ in range(120):
        trial = study.ask()
        config = sample_config(space, trial)
        assert config_findings(config, 2, space.cores) == []
        assert ("optimizer_offload" in trial.params) == (config.sharding == "full_shard")
        assert config_to_params(space, config) == trial.params
        seen.add((config.sharding, config.optimizer_offload))
        study.tell(trial, 0.0)
    assert seen == {("replicate", False), ("full_shard", False), ("full_shard", True)}
    replicated = dataclasses.replace(next(iter(space.grid())), sharding="replicate", optimizer_offload=True)
    assert "optimizer_offload=true: offload is FSDP's, and the config replicates its states" in misfits(
        space, replicated
    )


# --- ranges, workers, lengths, loading ------------------------------------------------------------------


def test_ranges_are_rounded_inward_to_the_unit_times_a_power_of_two():
    space = tiny_space(gpus=2, knobs={"train_batch_size": {"min": 20, "max": 100}})
    assert space.knob("train_batch_size").values() == (32, 64)
    assert space.knob("rollout_batch_size").values() == (4, 8, 16, 32)
    with pytest.raises(
        SpaceError, match=r"knobs.train_batch_size=\{min: 50, max: 90\}: no value of the form"
    ):
        tiny_space(gpus=3, knobs={"train_batch_size": {"min": 50, "max": 90}})


def test_workers_are_clipped_to_the_cores_and_a_minimum_above_them_is_an_error():
    space = tiny_space(cores=1, knobs={"num_rollout_workers": {"min": 1, "max": 8}})
    assert {c.num_rollout_workers for c in space.grid()} == {1}
    space = tiny_space(cores=3, knobs={"num_rollout_workers": {"min": 1, "max": 8}})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    assert {sample_config(space, study.ask()).num_rollout_workers for _ in range(60)} == {1, 2, 3}
    with pytest.raises(SpaceError, match=r"num_rollout_workers\.min=4: exceeds the 2 physical cores"):
        tiny_space(cores=2, knobs={"num_rollout_workers": {"min": 4, "max": 8}})


def test_no_dataloader_workers_is_a_value_and_a_negative_count_is_an_error():
    """0 workers (TRL's and transformers' default: the prompts load in the training process) may be held,
    searched or seeded; a size knob stays at least 1."""
    held = tiny_space(knobs={"num_rollout_workers": 0})
    assert {c.num_rollout_workers for c in held.grid()} == {0}
    searched = tiny_space(knobs={"num_rollout_workers": {"choices": [0, 1]}})
    assert {c.num_rollout_workers for c in searched.grid()} == {0, 1}
    with pytest.raises(SpaceError, match=r"num_rollout_workers\.min=-1: must be a whole number >= 0"):
        tiny_space(knobs={"num_rollout_workers": {"min": -1, "max": 1}})
    with pytest.raises(SpaceError, match=r"micro_batch_size=0: must be a whole number >= 1"):
        tiny_space(knobs={"micro_batch_size": 0})


def test_tuned_lengths_are_powers_of_two_or_linear_with_a_step():
    space = tiny_space(
        tune=["max_prompt_length", "max_response_length"],
        knobs={
            "train_batch_size": 32,
            "mini_batch_size": 8,
            "max_prompt_length": {"min": 10, "max": 64},
            "max_response_length": {"min": 8, "max": 24, "step": 8},
        },
    )
    assert space.knob("max_prompt_length").values() == (16, 32, 64)
    assert space.knob("max_response_length").values() == (8, 16, 24)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=4))
    trial = study.ask()
    sample_config(space, trial)
    assert {"max_prompt_length", "max_response_length"} <= set(trial.params)
    assert trial.params["max_prompt_length"] in (16, 32, 64)


def test_unknown_space_name_lists_the_shipped_ones(tmp_path):
    with pytest.raises(
        UserError, match="unknown search space 'cpu-tiyn' \\(did you mean 'cpu-tiny'\\?\\)"
    ) as info:
        load_space("cpu-tiyn")
    assert all(name in str(info.value) for name in SHIPPED)
    with pytest.raises(UserError, match="does not exist"):
        load_space(str(tmp_path / "nope.yaml"))


def test_a_yaml_syntax_error_is_one_line_with_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model: tiny-llama\nknobs: {train_batch_size: [1, 2}\n", encoding="utf-8")
    with pytest.raises(SpaceError) as info:
        load_space(str(path))
    assert len(info.value.errors) == 1
    assert str(info.value).startswith(f"{path}: line 2, column ")
    with pytest.raises(SpaceError, match="a search space is a mapping"):
        space_from_dict(["a", "list"])


def test_with_settings_rechecks_the_space():
    space = load_space("cpu-tiny")
    two = with_settings(space, gpus=2)
    assert two.unit == 2 and two.knob("micro_batch_size") == space.knob("micro_batch_size")
    assert all(config_findings(c, 2, two.cores) == [] for c in two.grid())
    with pytest.raises(SpaceError, match="gpus=0: must be a whole number >= 1"):
        with_settings(space, gpus=0)


def test_dynamic_ranges_work_with_the_study_samplers():
    """TPE and NSGA-II (two objectives, as the study) accept the clipped integer ranges and stay valid."""
    for space in (load_space("cpu-tiny"), tiny_space()):
        for sampler in (
            optuna.samplers.TPESampler(seed=0, n_startup_trials=5, multivariate=True),
            optuna.samplers.NSGAIISampler(seed=0, population_size=6),
        ):
            study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
            for _ in range(15):
                trial = study.ask()
                config = sample_config(space, trial)
                assert config_findings(config, space.gpus, space.cores) == []
                study.tell(trial, [float(config.train_batch_size), float(config.micro_batch_size)])


def test_at_least_as_large_orders_configs_by_memory():
    small = ProbeConfig(
        micro_batch_size=2, rollout_batch_size=8, max_response_length=16, gradient_checkpointing=True
    )
    big = dataclasses.replace(small, micro_batch_size=4, max_response_length=32, gradient_checkpointing=False)
    assert at_least_as_large(big, small) and not at_least_as_large(small, big)
    assert at_least_as_large(small, small)
    # T, g and the workers change time, not the peak
    assert at_least_as_large(
        dataclasses.replace(big, train_batch_size=8, gradient_accumulation_steps=1), small
    )
    # checkpointing needs less memory: a checkpointing config is never larger than one that does not
    assert not at_least_as_large(
        dataclasses.replace(big, gradient_checkpointing=True),
        small.__class__(**{**small.to_dict(), "gradient_checkpointing": False}),
    )
    # the effective log-prob micro batch counts: None means micro
    assert not at_least_as_large(big, dataclasses.replace(small, log_prob_micro_batch_size=8))
    # different algorithm, rollout_n or LoRA rank: not comparable
    for change in ({"algorithm": "grpo", "rollout_n": 2}, {"use_lora": True}):
        assert not at_least_as_large(dataclasses.replace(big, **change), small)
    lora_small, lora_big = (dataclasses.replace(c, use_lora=True) for c in (small, big))
    assert at_least_as_large(lora_big, lora_small)
    assert not at_least_as_large(dataclasses.replace(lora_big, lora_r=64), lora_small)
    # another holding of the states: not comparable either way
    sharded_small, sharded_big = (dataclasses.replace(c, sharding="full_shard") for c in (small, big))
    assert at_least_as_large(sharded_big, sharded_small)
    for change in (
        {"sharding": "full_shard"},
        {"sharding": "shard_grad_op", "param_offload": True},
        {"sharding": "full_shard", "offload_policy": True},
    ):
        assert not at_least_as_large(dataclasses.replace(big, **change), small)
    assert not at_least_as_large(dataclasses.replace(sharded_big, optimizer_offload=True), sharded_small)
