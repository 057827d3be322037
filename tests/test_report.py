"""The reporter: selection on Optuna's feasible front, best_config.yaml, trials.csv, report.md."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

from autotune.config.knobs import ProbeConfig
from autotune.config.rules import config_findings
from autotune.errors import UserError
from autotune.formats.read import read_target
from autotune.formats.verl import AR, parse_overrides, verl_rule_violations
from autotune.memory.budget import Budget
from autotune.report.selection import best_feasible, select
from autotune.report.write import FILES, write_report
from autotune.study.plan import StudyPlan
from autotune.trainers.registry import TRAINERS, trainer_named
from autotune.units import GIB
from tests.report_studies import (
    BASE,
    BUDGET,
    FakeProbe,
    infeasible_study,
    knobs,
    new_study,
    record,
    result_attrs,
    standard_study,
)

SEED_KEYS = (
    "rollout_batch_size",
    "train_batch_size",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "num_rollout_workers",
    "max_prompt_length",
    "max_response_length",
    "actor_model_config",
)
NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)


def files_for(target: str) -> tuple[str, ...]:
    """What a report with a recommendation writes for a study that exports for `target`."""
    others = {t.export_file for t in TRAINERS.values()} - {trainer_named(target).export_file}
    return tuple(name for name in FILES if name not in others)


def numbers(trials) -> list[int]:
    return [t.number for t in trials]


# --- selection ----------------------------------------------------------------------------------------------


def test_optuna_5_best_trials_keeps_only_feasible_trials():
    study = standard_study()
    front = numbers(study.best_trials)
    assert 10 not in front  # fastest (25 samples/s) but above budget·(1 − headroom): infeasible
    assert 3 not in front and 4 not in front and 5 not in front and 9 not in front  # OOM, pruned, timeout
    assert sorted(front) == [0, 1, 2, 6, 7]  # 8 is dominated by 1; 7 duplicates 2


def test_the_fastest_feasible_trial_is_chosen():
    study = standard_study()
    selection = select(study, BUDGET)
    assert selection.chosen.number == 2  # the original measurement, not its duplicate #7
    assert numbers(selection.front) == [2, 7, 1, 0, 6]  # fastest first
    assert selection.closest == []
    assert best_feasible(study, BUDGET).number == 2  # agrees with the study's own progress line


def test_ties_go_to_less_memory():
    study = new_study()
    record(study, "ok", knobs(micro_batch_size=8, gradient_accumulation_steps=1), 18.0, 0.8)
    record(study, "ok", knobs(micro_batch_size=4, gradient_accumulation_steps=2), 18.0, 0.7)
    assert select(study, BUDGET).chosen.number == 1


def test_a_tighter_budget_at_report_time_moves_the_choice():
    study = standard_study()
    tighter = Budget(int(0.7 * GIB), 0.10)  # feasible <= 0.63 GiB
    assert select(study, tighter).chosen.number == 1


def test_a_rejected_winner_and_its_duplicates_are_skipped():
    assert select(standard_study(), BUDGET, exclude=[2]).chosen.number == 1


def test_nothing_feasible_lists_the_closest_trials():
    selection = select(infeasible_study(), BUDGET)
    assert selection.chosen is None and selection.front == []
    assert numbers(selection.closest) == [1, 0, 2]  # 0.07 GiB over, then 0.10 (OOM), then 1.6 (predicted)


# --- the files --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "standard"
    study = standard_study()
    plan = StudyPlan(model="llama-2-7b", reward_model="deberta-v3-large", space_name="cpu-tiny")
    result = write_report(study, out, BUDGET, plan=plan, now=NOW)
    return study, result, out


def test_all_five_files_are_written(written):
    _, result, out = written
    assert result.exit_code == 0 and result.ok
    assert sorted(result.files) == sorted(files_for("verl"))
    assert all((out / name).stat().st_size > 0 for name in files_for("verl"))
    assert any("1.80x" in line for line in result.messages)  # 18 / 10 samples/s over the hand-made config


def test_best_config_has_the_seeds_schema_and_the_chosen_trials_figures(written):
    study, result, out = written
    data = yaml.safe_load((out / "best_config.yaml").read_text())
    trial = study.trials[result.chosen.number]
    for key in SEED_KEYS:
        assert key in data
    config = ProbeConfig(
        **{k: v for k, v in data.items() if k in ProbeConfig.__dataclass_fields__},
        use_lora=data["actor_model_config"]["use_lora"],
    )
    assert config_findings(config, data["measured"]["gpus"], cores=64) == []
    # the trial's configuration, with verl's 8 dataloader workers (the built-in probe does not measure them),
    # and the file says so where a reader meets the difference
    assert config.to_dict() == {**trial.user_attrs["config"], "num_rollout_workers": 8}
    probed = trial.user_attrs["config"]["num_rollout_workers"]
    header = (out / "best_config.yaml").read_text().split("\nrollout_batch_size")[0]
    said = f"# num_rollout_workers: 8 is verl's default, not the {probed} the probes ran"
    assert probed == 8 or said in header
    assert data["actor_model_config"] == {
        "model_name_or_path": "meta-llama/Llama-2-7b-hf",
        "use_lora": False,
        "gradient_checkpointing": True,
        "fsdp_config": {
            "sharding_strategy": "NO_SHARD",
            "cpu_offload": False,
            "param_offload": False,
            "optimizer_offload": False,
        },
    }
    assert data["critic_model_config"] == {"use_lora": False, "gradient_checkpointing": True}
    assert (data["kl_coef"], data["kl_placement"]) == (0.05, "reward")
    assert data["rollout_engine"]["name"] == "vllm"
    assert data["reward_model_config"] == {
        "model_name_or_path": "OpenAssistant/reward-model-deberta-v3-large",
        "trainable": False,
    }
    measured = data["measured"]
    assert measured["samples_per_sec"] == trial.values[0]
    assert measured["peak_memory_bytes"] == int(trial.values[1])
    assert measured["peak_memory_gib"] == round(trial.values[1] / GIB, 4)
    assert measured["tokens_per_sec"] == trial.user_attrs["result"]["tokens_per_sec"]
    assert measured["trial_number"] == trial.number
    assert measured["study_name"] == study.study_name
    assert measured["budget_gib"] == 1.0 and measured["headroom"] == 0.10
    assert measured["date"] == NOW.isoformat()
    assert "gpu" in measured


def test_verl_overrides_file_follows_verls_rules(written):
    _, _, out = written
    values = parse_overrides((out / "verl_overrides.txt").read_text())
    assert values["data.train_batch_size"] == 32
    assert values[f"{AR}.actor.ppo_micro_batch_size_per_gpu"] == 8
    assert values[f"{AR}.model.path"] == "meta-llama/Llama-2-7b-hf"
    assert verl_rule_violations(values, 1) == []


def test_trials_csv_has_every_trial_and_its_figures(written):
    study, _, out = written
    frame = pd.read_csv(out / "trials.csv")
    assert list(frame["number"]) == [t.number for t in study.trials]
    for column in (
        "state",
        "status",
        "seed_config",
        "samples_per_sec",
        "peak_gib",
        "predicted_peak_gib",
        "phase_rollout_s",
        "micro_batch_size",
        "max_response_length",
        "param_log2_micro_batch_size",
        "feasible",
        "on_front",
        "chosen",
        "duplicate_of",
    ):
        assert column in frame, column
    row = frame.set_index("number").loc[2]
    assert row["samples_per_sec"] == study.trials[2].values[0]
    assert row["peak_gib"] == pytest.approx(study.trials[2].values[1] / GIB)
    assert bool(row["chosen"]) and bool(row["on_front"]) and bool(row["feasible"])
    assert frame.set_index("number").loc[11, "state"] == "FAIL"
    assert frame.set_index("number").loc[0, "seed_config"].startswith("hand-made")


def test_report_md_tells_the_story(written):
    _, _, out = written
    text = (out / "report.md").read_text()
    for needle in (
        "## What to copy",
        "Recommended: trial #2",
        "## Every trial",
        "## Pareto front",
        "## Gain over the hand-made configs",
        "1.80x",
        "## Memory model",
        "## Cost of the study",
        "| probes run | 9 |",
        "avoided: predicted_oom | 1 |",
        "avoided: duplicate | 1 |",
        "data.train_batch_size=32",
    ):
        assert needle in text, needle


def test_no_feasible_trial_writes_no_recommendation_and_exits_non_zero(tmp_path):
    out = tmp_path / "none"
    out.mkdir()
    (out / "best_config.yaml").write_text("stale: true\n")  # from an earlier report with a looser budget
    result = write_report(infeasible_study(), out, BUDGET, plan=StudyPlan(model="tiny-llama"))
    assert result.exit_code == 1 and result.chosen is None
    assert sorted(result.files) == ["report.html", "report.md", "summary.json", "trials.csv"]
    assert not (out / "best_config.yaml").exists() and not (out / "verl_overrides.txt").exists()
    text = (out / "report.md").read_text()
    assert "No feasible configuration" in text
    assert "micro_batch_size 4→2" in text and "use_lora: true" in text and "offload_policy: true" in text
    assert "max_response_length 16→8" in text
    assert result.messages[0].startswith("no feasible configuration")


def test_an_empty_study_reports_without_crashing(tmp_path):
    result = write_report(new_study("empty"), tmp_path, BUDGET)
    assert result.exit_code == 1
    assert "No trial was measured yet" in (tmp_path / "report.md").read_text()


def test_a_running_sqlite_study_is_reported_from_its_stored_context(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = new_study("stored", storage)
    record(study, "ok", knobs(), 10.0, 0.5)
    record(study, "ok", knobs(micro_batch_size=8, gradient_accumulation_steps=1), 18.0, 0.8)
    record(study, "oom", knobs(micro_batch_size=16, gradient_accumulation_steps=1), 0.0, 1.0)
    StudyPlan(model="tiny-llama", budget_bytes=BUDGET.bytes, headroom=BUDGET.headroom).save(study)
    study.ask()  # a trial still RUNNING, as while `autotune run` is probing
    loaded = optuna.load_study(study_name="stored", storage=storage)
    result = write_report(loaded, tmp_path / "out")  # budget and model from the study
    assert result.chosen.number == 1
    data = yaml.safe_load((tmp_path / "out" / "best_config.yaml").read_text())
    assert data["actor_model_config"]["model_name_or_path"] == "tiny-llama"
    assert "reward_model_config" not in data  # a rule-based reward: no reward model
    assert "actor_rollout_ref.model.path" not in (tmp_path / "out" / "verl_overrides.txt").read_text()
    frame = pd.read_csv(tmp_path / "out" / "trials.csv")
    assert "RUNNING" in set(frame["state"])
    assert "still running" in (tmp_path / "out" / "report.md").read_text()


def test_a_study_without_a_stored_budget_needs_one(tmp_path):
    with pytest.raises(UserError, match="--memory-budget"):
        write_report(standard_study(), tmp_path)


def test_lora_grpo_on_two_gpus(tmp_path):
    study = new_study("grpo")
    config = ProbeConfig(
        rollout_batch_size=16,
        train_batch_size=64,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        algorithm="grpo",
        rollout_n=4,
        use_lora=True,
        lora_r=32,
        lora_alpha=64,
        log_prob_micro_batch_size=8,
    )
    assert config_findings(config, 2, cores=8) == []
    trial = record(
        study,
        "ok",
        config,
        30.0,
        0.5,
        result=result_attrs(config, 30.0, int(0.5 * GIB), gpus=2, gpu="NVIDIA H100 80GB HBM3"),
    )
    # the GPUs come from the trial's result
    result = write_report(study, tmp_path, BUDGET, plan=StudyPlan(model="qwen2.5-7b"))
    assert result.chosen.number == trial.number
    data = yaml.safe_load((tmp_path / "best_config.yaml").read_text())
    assert data["actor_model_config"] == {
        "model_name_or_path": "Qwen/Qwen2.5-7B",
        "use_lora": True,
        "lora_r": 32,
        "lora_alpha": 64,
        "gradient_checkpointing": True,
        "fsdp_config": {
            "sharding_strategy": "NO_SHARD",
            "cpu_offload": False,
            "param_offload": False,
            "optimizer_offload": False,
        },
    }
    assert "critic_model_config" not in data and data["kl_placement"] == "loss"
    assert data["algorithm"] == "grpo" and data["rollout_n"] == 4 and data["log_prob_micro_batch_size"] == 8
    assert data["measured"]["gpus"] == 2 and data["measured"]["gpu"] == "NVIDIA H100 80GB HBM3"
    values = parse_overrides((tmp_path / "verl_overrides.txt").read_text())
    assert values["data.train_batch_size"] == 16  # 64 samples / 4 per prompt
    assert values[f"{AR}.actor.ppo_mini_batch_size"] == 4  # 4 × 2 × 2 GPUs = 16 samples = 4 prompts
    assert values[f"{AR}.model.lora_rank"] == 32 and values["algorithm.adv_estimator"] == "grpo"
    assert verl_rule_violations(values, 2) == []


def test_report_paths_are_created(tmp_path):
    out: Path = tmp_path / "a" / "b"
    write_report(standard_study(), out, BUDGET)
    assert (out / "report.html").exists()


def test_a_study_run_by_the_tuner_reports_its_winner(tmp_path):
    from autotune.memory.architecture import Architecture
    from autotune.memory.calibration import MemoryModel
    from autotune.models.catalog import resolve_model
    from autotune.probe.contract import ProbeSettings
    from autotune.run.tuner import Tuner
    from autotune.space.loading import load_space
    from autotune.study.trials import enqueue_seed_configs

    space = load_space("cpu-tiny")
    budget = Budget(int(space.memory_budget_gib * GIB), space.headroom)
    study = new_study("tuned")  # in memory: the sqlite path is covered above
    model = MemoryModel(Architecture.from_specs(resolve_model("tiny-llama")), 1, "cpu")
    tuner = Tuner(study, space, ProbeSettings(), budget, model, probe=FakeProbe())
    enqueue_seed_configs(study, space)
    for _ in range(12):
        tuner.step()
    result = write_report(
        study, tmp_path / "out", budget, plan=StudyPlan.of(space, ProbeSettings(), budget, 6)
    )
    assert result.ok and sorted(result.files) == sorted(files_for("verl"))
    data = yaml.safe_load((tmp_path / "out" / "best_config.yaml").read_text())
    chosen = study.trials[data["measured"]["trial_number"]]
    assert chosen.user_attrs["status"] == "ok" and chosen.values[1] <= budget.limit
    assert data["measured"]["samples_per_sec"] == chosen.values[0]
    assert data["measured"]["peak_memory_bytes"] == int(chosen.values[1])
    # the chosen trial's knobs, but verl's 8 dataloader workers: the built-in probe does not measure them
    expected = {**chosen.user_attrs["config"], "num_rollout_workers": 8}
    assert all(data[key] == expected[key] for key in SEED_KEYS[:-1])
    assert config_findings(ProbeConfig(**chosen.user_attrs["config"]), space.gpus, cores=64) == []
    assert (
        verl_rule_violations(parse_overrides((tmp_path / "out" / "verl_overrides.txt").read_text()), 1) == []
    )
    assert "hand-made" in (tmp_path / "out" / "report.md").read_text()


# --- the recipe the study held fixed ----------------------------------------------------------------------

RECIPE = {
    "train_batch_size": 32,
    "mini_batch_size": 8,
    "max_prompt_length": 32,
    "max_response_length": 16,
    "algorithm": "ppo",
    "rollout_n": 1,
    "kl_coef": 0.05,
    "lora": {"enabled": False, "r": 16, "alpha": 32},
}
RECIPE_LINE = (
    "Recipe held fixed: train batch 32, mini batch 8 (4 optimizer steps per iteration), prompt/response "
    "32/16 tokens, PPO, rollout_n 1, KL 0.05, no LoRA."
)


def test_the_report_names_the_recipe_it_held_fixed(tmp_path):
    plan = StudyPlan(model="tiny-llama", space_name="cpu-tiny", recipe=RECIPE)
    result = write_report(standard_study(), tmp_path, BUDGET, plan=plan, now=NOW)
    markdown, page = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    assert RECIPE_LINE in markdown and RECIPE_LINE in page
    assert markdown.index(RECIPE_LINE) < markdown.index("## Pareto front")  # with the study, before the plots
    assert "Searched recipe knobs" not in markdown
    assert result.messages[0] == RECIPE_LINE  # the run's summary says it too, in one line


def test_searched_recipe_knobs_are_flagged(tmp_path):
    recipe = {**RECIPE, "train_batch_size": [32, 64, 128], "kl_coef": 0.0, "lora": {"enabled": True, "r": 8}}
    plan = StudyPlan(model="tiny-llama", recipe=recipe, tune=["train_batch_size"])
    result = write_report(standard_study(), tmp_path, BUDGET, plan=plan, now=NOW)
    markdown = (tmp_path / "report.md").read_text()
    fixed = "Recipe held fixed: mini batch 8, prompt/response 32/16 tokens, PPO, rollout_n 1, no KL, LoRA r8"
    flag = "Searched recipe knobs (an algorithm change, not only speed): train_batch_size (32, 64, 128)."
    assert fixed in markdown and flag in markdown
    assert flag in (tmp_path / "report.html").read_text()
    assert len([line for line in result.messages if flag in line]) == 1
    assert result.messages[0].startswith(fixed) and result.messages[0].endswith(flag)


def test_a_study_from_before_the_recipe_was_recorded_still_reports(tmp_path):
    study = standard_study()
    stored = dataclasses.asdict(StudyPlan(model="tiny-llama", budget_bytes=BUDGET.bytes))
    for key in ("recipe", "tune"):
        del stored[key]  # as an older autotune stored it
    study.set_user_attr("plan", stored)
    plan = StudyPlan.load(study)
    assert plan.recipe == {} and plan.tune == []
    result = write_report(study, tmp_path, plan=plan, now=NOW)
    assert result.ok and "Recipe" not in (tmp_path / "report.md").read_text()


def test_the_plan_stores_the_spaces_recipe():
    from autotune.probe.contract import ProbeSettings
    from autotune.space.loading import load_space

    space = load_space("cpu-tiny")
    plan = StudyPlan.of(space, ProbeSettings(), BUDGET, 6)
    assert plan.recipe == space.recipe() and plan.tune == []
    assert plan.space["knobs"]["mini_batch_size"] == space.recipe()["mini_batch_size"]


def test_a_trl_study_writes_trl_files_without_verls_blocks(tmp_path):
    """--target trl: best_config.yaml carries no rollout engine and no verl keys; trl_config.yaml carries the
    measurement in its header; the reports say how to start TRL, not verl."""
    study = new_study("trl")
    config = dataclasses.replace(BASE, algorithm="grpo", rollout_n=4, train_batch_size=32)
    record(study, "ok", config, 10.0, 0.5)
    result = write_report(study, tmp_path, BUDGET, plan=StudyPlan(model="tiny-llama", target="trl"))
    assert result.chosen is not None and set(result.files) >= {"best_config.yaml", "trl_config.yaml"}
    assert not (tmp_path / "verl_overrides.txt").exists()
    text = (tmp_path / "best_config.yaml").read_text()
    data = yaml.safe_load(text)
    assert "rollout_engine" not in data and "verl_export" not in data and "verl_overrides" not in text
    assert data["measured"]["peak_memory_gib"] == 0.5
    target = read_target(tmp_path / "trl_config.yaml")
    assert target.measured is not None and target.measured.peak_bytes == int(0.5 * GIB)
    report_md = (tmp_path / "report.md").read_text()
    assert "trl grpo --config trl_config.yaml" in report_md and "verl_overrides.txt" not in report_md
    assert "trl grpo" in (tmp_path / "report.html").read_text()
