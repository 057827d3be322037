"""verl's own knobs (`--engine verl`): their rules, the export that writes them instead of the rules' values,
and the round trip through best_config.yaml, verl_overrides.txt and `autotune check`'s reader."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import optuna
import pytest

from autotune.config.knobs import VERL_KNOBS, ProbeConfig, parse_sets
from autotune.config.rules import config_findings
from autotune.errors import UserError
from autotune.formats.read import read_target
from autotune.formats.rollout import rollout_engine
from autotune.formats.seed_yaml import seed_document, seed_yaml
from autotune.formats.verl import AR, format_overrides, verl_overrides, verl_rule_violations
from autotune.memory.architecture import Architecture
from autotune.memory.calibration import MemoryModel
from autotune.search.policy import calibrated
from autotune.space.loading import space_from_dict
from autotune.space.model import at_least_as_large, config_to_params, sample_config
from autotune.space.specs import SpaceError
from autotune.trainers.registry import engine_named
from autotune.units import GIB
from tests.conftest import TINY_GRID

BASE = ProbeConfig(
    rollout_batch_size=16,
    train_batch_size=64,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    max_prompt_length=64,
    max_response_length=128,
)
KNOBS = dataclasses.replace(
    BASE,
    gpu_memory_utilization=0.45,
    tensor_model_parallel_size=2,
    max_num_seqs=128,
    use_dynamic_bsz=True,
    ppo_max_token_len_per_gpu=1024,
)


def lines(config: ProbeConfig, gpus: int = 1) -> list[str]:
    return [f.line for f in config_findings(config, gpus, cores=8)]


@pytest.mark.parametrize(
    ("changes", "gpus", "says"),
    [
        ({"gpu_memory_utilization": 1.0}, 1, "must be a number > 0 and < 1"),
        ({"gpu_memory_utilization": 0.0}, 1, "must be a number > 0 and < 1"),
        ({"gpu_memory_utilization": float("nan")}, 1, "finite"),
        ({"tensor_model_parallel_size": 3}, 2, "does not divide the 2 GPU(s)"),
        ({"tensor_model_parallel_size": 0}, 2, "must be a whole number >= 1"),
        ({"max_num_seqs": 0}, 1, "must be a whole number >= 1"),
        ({"ppo_max_token_len_per_gpu": 4096}, 1, "without use_dynamic_bsz"),
        ({"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 191}, 1, "below one sequence"),
    ],
)
def test_each_verl_knob_rule_is_one_finding_with_its_fix(changes, gpus, says):
    found = lines(dataclasses.replace(BASE, **changes), gpus)
    assert len(found) == 1 and says in found[0] and "; fix: " in found[0], found


def test_the_knobs_default_to_the_rules_and_break_nothing():
    assert not BASE.uses_verl_knobs and KNOBS.uses_verl_knobs
    assert lines(dataclasses.replace(KNOBS, ppo_max_token_len_per_gpu=192), 2) == []  # exactly one sequence
    assert lines(KNOBS, 2) == []


def test_set_parses_the_knobs_with_their_types():
    values = parse_sets(["gpu_memory_utilization=0.4", "use_dynamic_bsz=true", "max_num_seqs=none"])
    assert values == {"gpu_memory_utilization": 0.4, "use_dynamic_bsz": True, "max_num_seqs": None}


def test_dynamic_batches_are_modelled_as_the_micro_batch_the_budget_holds():
    """Every probe sequence is Lp + Lr = 192 tokens: 1024 tokens hold 5 of them, at most a GPU's mini batch
    (m·g = 8) for the update and its share of T for forward passes; the default budget is the micro batch."""
    fixed = KNOBS.with_fixed_micro_batches(gpus=2)
    assert (fixed.micro_batch_size, fixed.forward_micro_batch_size) == (5, 5)
    big = dataclasses.replace(KNOBS, ppo_max_token_len_per_gpu=192 * 100).with_fixed_micro_batches(2)
    assert (big.micro_batch_size, big.forward_micro_batch_size) == (8, 32)
    default = dataclasses.replace(KNOBS, ppo_max_token_len_per_gpu=None)
    assert default.token_budget == 4 * 192 and default.with_fixed_micro_batches(2).micro_batch_size == 4
    assert BASE.with_fixed_micro_batches(2) is BASE


def test_the_export_writes_the_knobs_instead_of_the_rules():
    engine = rollout_engine(KNOBS, 2, "vllm", 80 * GIB, 30 * GIB, 4_000_000)
    values = verl_overrides(KNOBS, 2, engine=engine).values
    rollout = f"{AR}.rollout"
    assert values[f"{rollout}.gpu_memory_utilization"] == 0.45
    assert values[f"{rollout}.tensor_model_parallel_size"] == 2
    assert values[f"{rollout}.max_num_seqs"] == 128
    budgets = {key: value for key, value in values.items() if "max_token_len" in key}
    # every budget V1 reads: the actor's update, its old-log-prob and the reference's passes (which would copy
    # the actor's by interpolation), and the V1 critic's engine
    assert set(budgets.values()) == {1024} and set(budgets) == {
        f"{AR}.actor.ppo_max_token_len_per_gpu",
        f"{AR}.rollout.log_prob_max_token_len_per_gpu",
        f"{AR}.ref.log_prob_max_token_len_per_gpu",
        "+critic.ppo_infer_max_token_len_per_gpu",
    }
    switches = [key for key, value in values.items() if "use_dynamic_bsz" in key]
    assert all(values[key] is True for key in switches) and len(switches) == 2
    # verl cuts by tokens and reads no micro batch: none is written for the actor and its passes
    assert not any(key.endswith("micro_batch_size_per_gpu") and "critic" not in key for key in values)
    assert verl_rule_violations(values, 2) == []
    assert any("the configuration's own" in note for note in engine.notes)


def test_without_the_knobs_the_export_is_what_it_was():
    engine = rollout_engine(BASE, 2, "vllm", 80 * GIB, 30 * GIB, 4_000_000)
    values = verl_overrides(BASE, 2, engine=engine).values
    assert not any("max_token_len" in key or "max_num_seqs" in key for key in values)
    # fixed micro batches everywhere: the V1 critic's engine is told so (its own default is dynamic)
    assert [key for key in values if "dynamic_bsz" in key] == ["+critic.fsdp.use_dynamic_bsz"]
    assert values["+critic.fsdp.use_dynamic_bsz"] is False
    assert (values[f"{AR}.rollout.gpu_memory_utilization"], engine.tensor_model_parallel_size) == (0.55, 1)


def test_grpo_has_no_critic_budget():
    grpo = dataclasses.replace(KNOBS, algorithm="grpo", rollout_n=4)
    values = verl_overrides(grpo, 2).values
    assert not any(key.lstrip("+").startswith("critic.") for key in values)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({f"{AR}.rollout.log_prob_use_dynamic_bsz": False}, "verl asserts it equals"),
        ({f"{AR}.ref.log_prob_max_token_len_per_gpu": 100}, "below the longest sequence"),
        ({f"{AR}.rollout.gpu_memory_utilization": 1.5}, "fraction of the card"),
        ({f"{AR}.rollout.max_num_seqs": 0}, "must be a whole number >= 1"),
    ],
)
def test_verls_rules_on_an_edited_file(change, says):
    values = {**verl_overrides(KNOBS, 2).values, **change}
    assert any(says in error for error in verl_rule_violations(values, 2))


def test_the_knobs_round_trip_through_both_files_and_the_check_reader(tmp_path: Path):
    """best_config.yaml keeps every knob as the config's; verl's overrides cannot tell a searched share or
    tensor parallel size from a rule's (both are always written), so those two read back as the file's
    rollout engine, the others as knobs."""
    engine = rollout_engine(KNOBS, 2, "vllm", 80 * GIB, 30 * GIB, 4_000_000)
    seed_path, verl_path = tmp_path / "best_config.yaml", tmp_path / "verl_overrides.txt"
    seed_path.write_text(
        seed_yaml(seed_document(KNOBS, "tiny-llama", "function", {"gpus": 2}, engine, gpus=2))
    )
    verl_path.write_text(format_overrides(verl_overrides(KNOBS, 2, engine=engine).values))
    seed, verl = read_target(seed_path), read_target(verl_path)
    assert seed.findings == [] and verl.findings == []
    assert {k: getattr(seed.config, k) for k in VERL_KNOBS} == {k: getattr(KNOBS, k) for k in VERL_KNOBS}
    shown = dataclasses.replace(KNOBS, gpu_memory_utilization=None, tensor_model_parallel_size=None)
    assert {k: getattr(verl.config, k) for k in VERL_KNOBS} == {k: getattr(shown, k) for k in VERL_KNOBS}
    for target in (seed, verl):
        assert target.engine.gpu_memory_utilization == 0.45
        assert target.engine.tensor_model_parallel_size == 2
        assert target.engine.max_num_seqs == 128


def test_a_default_budget_reads_back_as_the_default(tmp_path: Path):
    config = dataclasses.replace(BASE, use_dynamic_bsz=True)
    path = tmp_path / "verl_overrides.txt"
    path.write_text(format_overrides(verl_overrides(config, 1).values))
    read = read_target(path).config
    assert read is not None and read.use_dynamic_bsz and read.ppo_max_token_len_per_gpu is None


# --- the search space, the engine and the memory model ------------------------------------------------

VERL_SPACE_KNOBS = {
    "gpu_memory_utilization": {"min": 0.3, "max": 0.5, "step": 0.1},
    "tensor_model_parallel_size": {"min": 1, "max": 2},
    "max_num_seqs": {"choices": [64, 256]},
    "use_dynamic_bsz": {"choices": [False, True]},
    "ppo_max_token_len_per_gpu": {"min": 256, "max": 1024},
    "log_prob_max_token_len_per_gpu": {"choices": [512, 2048]},
    "critic_max_token_len_per_gpu": {"choices": [None, 1024]},
}


def space(**knobs):
    from autotune.space.loading import load_space

    tiny = load_space(str(TINY_GRID), cores=4)
    data = copy.deepcopy(dict(tiny.raw))
    data["gpus"] = 2
    data["knobs"].update(knobs)
    return space_from_dict(data, source="verl.yaml", cores=4)


def test_a_space_searches_the_verl_knobs_and_every_sample_is_valid():
    searched = space(**VERL_SPACE_KNOBS)
    assert searched.verl_knobs == list(VERL_KNOBS)
    assert searched.knob("gpu_memory_utilization").values() == (0.3, 0.4, 0.5)
    grid = searched.grid()
    assert len(grid) == searched.size()
    assert {c.ppo_max_token_len_per_gpu for c in grid if not c.use_dynamic_bsz} == {None}
    assert {c.ppo_max_token_len_per_gpu for c in grid if c.use_dynamic_bsz} == {256, 512, 1024}
    assert {c.log_prob_max_token_len_per_gpu for c in grid if not c.use_dynamic_bsz} == {None}
    assert {c.log_prob_max_token_len_per_gpu for c in grid if c.use_dynamic_bsz} == {512, 2048}
    assert {c.critic_max_token_len_per_gpu for c in grid if c.use_dynamic_bsz} == {None, 1024}
    for config in grid[:: max(1, len(grid) // 200)]:
        assert config_findings(config, 2, cores=4) == []
        params = config_to_params(searched, config)
        assert params is not None and sample_config(searched, optuna.trial.FixedTrial(params)) == config


@pytest.mark.parametrize(
    ("knobs", "says"),
    [
        ({"tensor_model_parallel_size": 3}, "must divide the 2 GPU(s)"),
        ({"tensor_model_parallel_size": {"min": 3, "max": 3}}, "no divisor of the 2 GPU(s)"),
        ({"gpu_memory_utilization": {"choices": [0.5, 1.0]}}, "must be a number > 0 and < 1"),
        ({"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 64}, "at least one sequence"),
    ],
)
def test_a_space_with_a_broken_verl_knob_is_refused_in_one_line(knobs, says):
    with pytest.raises(SpaceError) as caught:
        space(**knobs)
    assert len(caught.value.errors) == 1 and says in caught.value.errors[0]


def test_the_builtin_engine_refuses_verl_knobs_in_one_line():
    builtin, verl = engine_named("builtin"), engine_named("verl")
    builtin.check_space_knobs(space())  # no verl knob: nothing to say
    verl.check_space_knobs(space(**VERL_SPACE_KNOBS))
    with pytest.raises(UserError) as caught:
        builtin.check_space_knobs(space(max_num_seqs=64))
    assert "max_num_seqs" in str(caught.value) and "--engine verl" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert builtin.knob_findings(KNOBS) and verl.knob_findings(KNOBS) == []


def model(card: float | None) -> MemoryModel:
    from autotune.models.catalog import resolve_model

    arch = Architecture.from_specs(resolve_model("tiny-llama", "random", False), None)
    return MemoryModel(arch, 1, "cuda", rollout_card_bytes=card)


def test_under_verl_the_pool_meets_the_resident_states_not_the_training_peak():
    """vLLM sleeps while verl trains: the peak is the larger of the training side and the states resident
    while vLLM generates plus its share of the card (the config's, else verl's default, as the probe runs)."""
    builtin, verl = model(None), model(80 * GIB)
    shared = dataclasses.replace(BASE, gpu_memory_utilization=0.5)
    assert verl.generation_bytes(BASE) == verl.generation_bytes(shared)  # verl's default share is 0.5
    assert verl.generation_bytes(shared) == verl.minimum_bytes(shared) + 40 * GIB
    assert verl.predict(shared) == max(builtin.predict(shared), verl.generation_bytes(shared))
    assert builtin.generation_bytes(shared) == 0


def test_under_verl_the_model_is_not_calibrated_on_device_peaks():
    from tests.test_policy import trial

    trials = [trial(0, "ok", BASE, 10.0, 50 * GIB)]
    assert calibrated(model(80 * GIB), trials)[1] == 0
    assert calibrated(model(None), trials)[1] == 1


def test_dynamic_batches_grow_the_training_side_with_the_budget():
    small = dataclasses.replace(BASE, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=192)
    large = dataclasses.replace(small, ppo_max_token_len_per_gpu=192 * 8)
    assert model(None).predict(large) > model(None).predict(small)
    assert at_least_as_large(large, small) and not at_least_as_large(small, large)
    assert not at_least_as_large(dataclasses.replace(large, gpu_memory_utilization=0.5), large)  # rule vs set
    low = dataclasses.replace(BASE, gpu_memory_utilization=0.3)
    assert at_least_as_large(dataclasses.replace(low, gpu_memory_utilization=0.6), low)


# --- the model's attention heads: vLLM splits them over the tensor-parallel ranks ---------------------------


def qwen_7b():
    from autotune.models.catalog import resolve_model

    return resolve_model("qwen2.5-7b", "random", False)  # 28 attention heads


def test_a_tensor_parallel_size_that_does_not_split_the_heads_is_one_finding():
    from autotune.config.rules import head_findings, model_findings

    (finding,) = head_findings(8, qwen_7b())
    assert "28 attention heads" in finding.line and "1, 2, 4, 7, 14, 28" in finding.line
    assert head_findings(4, qwen_7b()) == [] and head_findings(None, qwen_7b()) == []
    on_8 = dataclasses.replace(BASE, tensor_model_parallel_size=8)
    assert [f.key for f in config_findings(on_8, 8, cores=8, model_spec=qwen_7b())] == [
        "tensor_model_parallel_size"
    ]
    assert model_findings(BASE, qwen_7b(), tensor_parallel=8)  # a file's rollout engine counts too


def test_the_export_rule_picks_a_size_that_splits_the_heads():
    """A 7B model whose weights need every one of 8 cards: 8 does not divide 28 heads, so 4, with a note."""
    params = 7_000_000_000
    alone = rollout_engine(BASE, 8, "vllm", 24 * GIB, 21 * GIB, params)  # a 2.4 GiB pool: 13 GiB / 8 fit
    assert alone.tensor_model_parallel_size == 8
    split = rollout_engine(BASE, 8, "vllm", 24 * GIB, 21 * GIB, params, attention_heads=28)
    assert split.tensor_model_parallel_size == 4
    assert any("divides the 28 attention heads" in note for note in split.notes)
    roomy = rollout_engine(BASE, 8, "vllm", 80 * GIB, 10 * GIB, params, attention_heads=28)
    assert roomy.tensor_model_parallel_size == 1 and roomy.notes == ()


def test_a_space_searches_only_the_sizes_that_split_the_heads():
    from rich.console import Console

    from autotune.run.prepare import tensor_parallel_for_heads

    def on_8(knob):
        data = copy.deepcopy(dict(space().raw))
        data.update(gpus=8, model="qwen2.5-7b")
        data["knobs"]["tensor_model_parallel_size"] = knob
        return space_from_dict(data, source="verl.yaml", cores=4)

    console = Console(record=True, width=200)
    narrowed = tensor_parallel_for_heads(on_8({"min": 1, "max": 8}), qwen_7b(), console)
    assert narrowed.knob("tensor_model_parallel_size").values() == (1, 2, 4)
    assert "tensor_model_parallel_size 8 left out" in console.export_text()
    kept = on_8({"min": 1, "max": 4})
    assert tensor_parallel_for_heads(kept, qwen_7b(), console) is kept
    with pytest.raises(UserError) as caught:
        tensor_parallel_for_heads(on_8(8), qwen_7b(), console)
    assert "28 attention heads" in str(caught.value) and "\n" not in str(caught.value)


def test_check_refuses_an_override_file_whose_rollout_cannot_split_the_heads(tmp_path: Path):
    from autotune.check import CheckOptions, check

    on_8 = dataclasses.replace(BASE, tensor_model_parallel_size=8)
    engine = rollout_engine(on_8, 8, "vllm", 80 * GIB, 30 * GIB, 7_000_000_000)
    path = tmp_path / "verl_overrides.txt"
    path.write_text(format_overrides(verl_overrides(on_8, 8, engine=engine).values))
    result = check(CheckOptions(path, gpus=8, model="qwen2.5-7b", cores=8))
    assert any("28 attention heads" in f.line for f in result.problems), [f.line for f in result.findings]


def test_under_dynamic_batch_size_the_sampler_counts_one_job_per_token_budget_not_per_micro_batch():
    """verl never reads the micro batch sizes with dynamic batch size on: the sampler's key (config_key)
    makes the configurations that differ only in them one job, so it proposes that job once."""
    from autotune.study.trials import config_key

    grid = space(**VERL_SPACE_KNOBS).grid()
    dynamic = [c for c in grid if c.use_dynamic_bsz]
    unread = ("micro_batch_size", "gradient_accumulation_steps", "log_prob_micro_batch_size")
    jobs = {
        tuple(sorted((k, v) for k, v in c.to_dict().items() if k not in unread)) for c in dynamic
    }  # the mini batch per GPU (m·g) is the recipe's here: one value
    assert len({config_key(c) for c in dynamic}) == len(jobs) < len(dynamic)
    static = [c for c in grid if not c.use_dynamic_bsz]
    assert len({config_key(c) for c in static}) == len(static)  # without it every micro batch is its own


# --- an OOM in verl's training tasks: the rollout engine slept, its KV cache freed -------------------------


def test_a_training_oom_dominates_whatever_the_rollout_share_and_more_sequences():
    wall = dataclasses.replace(KNOBS, use_dynamic_bsz=False, ppo_max_token_len_per_gpu=None)
    wall = dataclasses.replace(wall, max_num_seqs=None, log_prob_micro_batch_size=8)
    other_share = dataclasses.replace(wall, gpu_memory_utilization=0.3)  # below the wall's 0.45
    more_seqs = dataclasses.replace(wall, max_num_seqs=512)  # above verl's default 256
    fewer_seqs = dataclasses.replace(wall, max_num_seqs=64)
    for phase in ("update", "scoring"):
        assert at_least_as_large(other_share, wall, oom_phase=phase)
        assert at_least_as_large(more_seqs, wall, oom_phase=phase)
        assert not at_least_as_large(fewer_seqs, wall, oom_phase=phase)
    assert not at_least_as_large(other_share, wall)  # elsewhere a smaller pool may fit
    assert not at_least_as_large(more_seqs, wall)


def test_a_training_oom_says_nothing_of_the_knobs_its_phase_does_not_reach():
    wall = dataclasses.replace(KNOBS, use_dynamic_bsz=False, ppo_max_token_len_per_gpu=None)
    wall = dataclasses.replace(wall, log_prob_micro_batch_size=8, gradient_checkpointing=False)
    small_scoring = dataclasses.replace(wall, log_prob_micro_batch_size=2, rollout_batch_size=8)
    small_update = dataclasses.replace(wall, micro_batch_size=2, gradient_accumulation_steps=4)
    checkpointed = dataclasses.replace(wall, gradient_checkpointing=True)
    # the update: m, the lengths and checkpointing decide; the log-prob micro batch and R do not reach it
    assert at_least_as_large(small_scoring, wall, oom_phase="update")
    assert not at_least_as_large(small_update, wall, oom_phase="update")
    assert not at_least_as_large(checkpointed, wall, oom_phase="update")
    # scoring (forward passes): the log-prob micro batch and the lengths decide; m and checkpointing do not
    assert at_least_as_large(small_update, wall, oom_phase="scoring")
    assert at_least_as_large(checkpointed, wall, oom_phase="scoring")
    assert not at_least_as_large(small_scoring, wall, oom_phase="scoring")
    assert not any(at_least_as_large(c, wall) for c in (small_scoring, small_update, checkpointed))


def test_the_tuner_infers_an_oom_from_a_training_oom_of_another_share():
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from autotune.memory.budget import Budget
    from autotune.search.policy import ProbeIt, decide
    from autotune.status import UPDATE_OOM, Attr, Status

    wall = dataclasses.replace(KNOBS, use_dynamic_bsz=False, ppo_max_token_len_per_gpu=None)

    def oom(kind: str):
        trial = create_trial(
            state=TrialState.COMPLETE,
            values=[0.0, 80 * GIB],
            params={"x": 1},
            distributions={"x": IntDistribution(0, 2)},
            user_attrs={Attr.STATUS: Status.OOM, Attr.OOM_KIND: kind, Attr.CONFIG: wall.to_dict()},
        )
        trial.number = 0
        return [trial]

    wider = dataclasses.replace(wall, gpu_memory_utilization=0.3, max_num_seqs=256)
    budget = Budget(int(80 * GIB), 0.10)
    decided = decide(wider, oom(UPDATE_OOM), model(80 * GIB), budget)
    assert getattr(decided, "status", None) == Status.INFERRED_OOM
    assert isinstance(decide(wider, oom("cuda"), model(80 * GIB), budget), ProbeIt)


def test_the_report_tables_show_verls_knobs_in_a_column_of_their_own_when_set():
    from types import SimpleNamespace

    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from autotune.report.tables import KNOB_COLUMNS, TRAINER_KNOBS, knob_cells, knob_columns, legend_line
    from autotune.status import Attr

    def report_of(*configs: ProbeConfig):
        trials = [
            create_trial(
                state=TrialState.COMPLETE,
                values=[1.0, 1.0],
                params={"x": 1},
                distributions={"x": IntDistribution(0, 2)},
                user_attrs={Attr.CONFIG: c.to_dict()},
            )
            for c in configs
        ]
        return SimpleNamespace(trials=trials)

    builtin = report_of(BASE)
    assert knob_columns(builtin) == KNOB_COLUMNS and "verl:" not in legend_line(builtin)
    verl = report_of(BASE, KNOBS)
    columns = knob_columns(verl)
    assert columns[-1] == ("verl", TRAINER_KNOBS) and "verl:" in legend_line(verl)
    assert knob_cells(verl.trials[0], columns)[-1] == "-"
    assert knob_cells(verl.trials[1], columns)[-1] == "gmu0.45 tp2 seqs128 dyn1024"
