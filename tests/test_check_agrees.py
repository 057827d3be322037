"""`autotune check` agrees with the study: the files autotune writes pass it, a measurement is judged by
itself, and on the seed article's three configs the memory verdict is the study's memory model's."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from autotune.check import CheckOptions, check
from autotune.cli import main
from autotune.formats.read import read_target
from autotune.formats.verl import format_overrides, verl_overrides
from autotune.memory.advice import first_aid
from autotune.memory.architecture import Architecture
from autotune.memory.budget import Budget
from autotune.memory.calibration import MemoryModel
from autotune.memory.gpus import gpu_memory_gib
from autotune.models.catalog import resolve_model, resolve_reward_model
from autotune.models.names import model_name_or_path, registry_name
from autotune.report.write import write_report
from autotune.search.sampler import predicted_peaks
from autotune.study.plan import StudyPlan
from autotune.units import GIB
from tests.report_studies import BUDGET, knobs, new_study, record, standard_study

DATA = Path(__file__).resolve().parent / "data"
# the article's three hand-made configs (§5.1-5.3), with the GPUs and card each was written for
ARTICLE = {
    "5.1": (DATA / "seed_scenario_1.yaml", 2, "a100-80g"),
    "5.2": (DATA / "seed_scenario_2.yaml", 4, "a100-40g"),
    "5.3": (DATA / "seed_scenario_3.yaml", 1, "rtx3090"),
}


def _report(path: Path, *args: str, capsys) -> tuple[int, dict]:
    code = main(["check", str(path), "--json", *args])
    return code, json.loads(capsys.readouterr().out)


# --- the files autotune writes ---------------------------------------------------------------------------


def _cpu_study_as_reported() -> tuple[object, Budget]:
    """The user's case: a CPU study whose pick measured 0.551 GiB under a 0.67 GiB budget with a rollout batch
    of 32 (the CUDA priors predict more than the budget; the article's heuristic wants >= 64)."""
    budget = Budget(int(0.67 * GIB), 0.10)
    study = new_study("check-cpu")
    config = knobs(rollout_batch_size=32, micro_batch_size=8, gradient_accumulation_steps=1)
    record(study, "ok", config, 12.0, 0.551, budget=budget)
    return study, budget


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    """Reports written by the report code on synthetic studies (no probe): a tiny model and a 7B one (whose
    CPU measurement the model's priors cannot explain), and the user's 0.67 GiB study."""
    folders = {}
    for name, model, reward in (("tiny", "tiny-llama", "function"), ("7b", "llama-2-7b", "deberta-v3-large")):
        out = tmp_path_factory.mktemp(name)
        write_report(
            standard_study(f"check-{name}"), out, BUDGET, plan=StudyPlan(model=model, reward_model=reward)
        )
        folders[name] = out
    study, budget = _cpu_study_as_reported()
    folders["user"] = tmp_path_factory.mktemp("user")
    write_report(study, folders["user"], budget, plan=StudyPlan(model="qwen2.5-0.5b"))
    for name, config in PICKS.items():  # a pick of each kind a study can make
        study = new_study(f"check-{name}")
        record(study, "ok", config, 10.0, 0.5)
        folders[name] = tmp_path_factory.mktemp(name)
        write_report(study, folders[name], BUDGET, plan=StudyPlan(model="tiny-llama"))
    return folders


PICKS = {
    "budgets": knobs(
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=192,
        log_prob_max_token_len_per_gpu=384,
        critic_max_token_len_per_gpu=384,
    ),
    "offload": knobs(sharding="full_shard", param_offload=True, optimizer_offload=True),
}


@pytest.mark.parametrize("name", ["tiny", "7b", "user", *PICKS])
@pytest.mark.parametrize("file", ["best_config.yaml", "verl_overrides.txt"])
def test_check_passes_every_file_autotune_wrote(written, name, file, capsys):
    code, report = _report(written[name] / file, "--cores", "8", capsys=capsys)
    assert code == 0 and report["problems"] == [], report["problems"]
    assert all(f["severity"] in ("problem", "warning", "note") for f in report["findings"])
    assert report["exit_code"] == 0 and not report["layout_assumed"]  # autotune names the layout


@pytest.mark.parametrize("name", list(PICKS))
def test_a_pick_with_token_budgets_or_offload_is_judged_as_the_study_measured_it(written, name, capsys):
    """Every verl knob best_config.yaml writes is one check reads: the pick's own measurement decides."""
    code, report = _report(written[name] / "best_config.yaml", "--cores", "8", capsys=capsys)
    assert code == 0 and report["memory"]["decided_by"] == "measurement", report["problems"]
    assert report["memory"]["verdict"] == "fits" and report["memory"]["measured_peak_gib"] == 0.5


def test_a_measured_config_is_judged_by_its_measurement(written, capsys):
    code, report = _report(written["user"] / "best_config.yaml", "--cores", "8", capsys=capsys)
    memory = report["memory"]
    assert code == 0 and memory["decided_by"] == "measurement" and memory["verdict"] == "fits"
    assert memory["measured_peak_gib"] == pytest.approx(0.551, abs=1e-3)
    assert memory["limit_gib"] == pytest.approx(0.67 * 0.9, abs=1e-3)
    assert memory["device"] == "cpu" and memory["model"] == "CPU priors, uncalibrated"
    (line,) = [f for f in report["findings"] if f["check"] == "memory"]
    assert line["severity"] == "note" and "information only" in line["problem"]
    # the article's starving-GPU heuristic does not overrule the measured rollout batch of 32
    (rollout,) = [f for f in report["findings"] if f["check"] == "rollout"]
    assert rollout["severity"] == "note" and "the measurement stands" in rollout["problem"]


def test_a_7b_measurement_stands_though_the_model_predicts_far_more(written, capsys):
    code, report = _report(written["7b"] / "best_config.yaml", "--cores", "8", capsys=capsys)
    memory = report["memory"]
    assert code == 0 and memory["verdict"] == "fits"
    assert memory["predicted_peak_gib"] > 10 * memory["measured_peak_gib"]  # shown, not held against it


def test_another_card_is_the_models_verdict_with_the_measurement_for_reference(written, capsys):
    code, report = _report(
        written["user"] / "best_config.yaml", "--gpu", "rtx3090", "--cores", "8", capsys=capsys
    )
    memory = report["memory"]
    assert code == 0 and memory["decided_by"] == "model" and memory["device"] == "cuda"
    (line,) = [f for f in report["findings"] if f["check"] == "memory" and f.get("key") != "room"]
    assert "for reference, the study measured 0.55 GiB per rank on CPU" in line["problem"]
    # asked about 2 GPUs where the study measured 1: the model decides as well
    _, report = _report(written["user"] / "best_config.yaml", "--gpus", "2", "--cores", "8", capsys=capsys)
    assert report["memory"]["decided_by"] == "model"


def test_the_text_output_says_clean_with_warnings(written, tmp_path, capsys):
    """A key verl accepts but its V1 trainer does not read is a warning, marked apart from problems."""
    path = tmp_path / "verl_overrides.txt"
    path.write_text((written["tiny"] / "verl_overrides.txt").read_text() + "data.gen_batch_size=8\n")
    assert main(["check", str(path), "--cores", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("! verl: data.gen_batch_size=8: set but ignored by V1") for line in out)
    assert out[-1] == "no problems found (1 warning)"


def test_a_written_best_config_passes_check(written, cli_here):
    proc = cli_here("check", str(written["user"] / "best_config.yaml"), "--cores", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "measured peak 0.55 GiB per rank on CPU" in proc.stdout


# --- the article's configs: the study's memory model, one layout rule --------------------------------------


def _study_model(path: Path, gpus: int) -> MemoryModel:
    """The memory model as `search.prepare` builds it for a study of this config (no probe yet)."""
    target = read_target(path)
    actor = resolve_model(registry_name(target.model))
    reward = resolve_reward_model(registry_name(target.reward_model) or "function")
    return MemoryModel(Architecture.from_specs(actor, reward), gpus, "cuda")


@pytest.mark.parametrize("checkpointing", [True, False])
@pytest.mark.parametrize("scenario", sorted(ARTICLE))
def test_the_memory_verdict_is_the_studys(scenario, checkpointing, tmp_path):
    path, gpus, gpu = ARTICLE[scenario]
    if not checkpointing:
        text = path.read_text().replace(
            "actor_model_config:\n", "actor_model_config:\n  gradient_checkpointing: false\n"
        )
        path = tmp_path / path.name
        path.write_text(text)
    config = read_target(path).config
    assert config.gradient_checkpointing is checkpointing
    model = _study_model(path, gpus)
    (peak,) = predicted_peaks([config], [], model)  # what the study's sampler predicts before any probe
    budget = Budget(int(gpu_memory_gib(gpu) * GIB), 0.10)  # the study's budget on that card
    result = check(CheckOptions(path=path, gpus=gpus, gpu=gpu, cores=64))
    memory = result.memory
    assert memory["predicted_peak_bytes"] == int(peak)
    assert memory["fits"] == (peak <= budget.limit)
    assert (result.exit_code == 1) == (peak > budget.bytes)
    if peak <= budget.bytes:
        return
    (problem,) = result.problems
    switched = model.predict(dataclasses.replace(config, gradient_checkpointing=True))
    if not checkpointing and switched <= budget.limit:  # checkpointing suffices: proposed first
        assert problem.fix.startswith("fits with any one of: 1) gradient_checkpointing: true alone")
    assert all(peak <= budget.limit / GIB for peak in offered_peaks(problem.fix)), problem.fix


def offered_peaks(fix: str) -> list[float]:
    """The predicted peak of every fix first aid offers (each must fit)."""
    offered = fix.split(". ")[0]
    return [float(gib) for gib in re.findall(r": ([0-9.]+) GiB(?:;|$)", offered)]


def test_the_verdicts_on_the_articles_configs():
    """§5.1 fits two A100 80G, §5.2 does not fit four A100 40G (its states alone are 96 GiB per GPU), §5.3
    fits an RTX 3090; without checkpointing §5.1 needs it back (first aid says so first)."""
    verdicts = {}
    for scenario, (path, gpus, gpu) in ARTICLE.items():
        verdicts[scenario] = check(CheckOptions(path=path, gpus=gpus, gpu=gpu, cores=64)).memory["verdict"]
    assert verdicts == {"5.1": "fits", "5.2": "over", "5.3": "fits"}


@pytest.mark.parametrize("scenario", sorted(ARTICLE))
def test_the_article_yaml_and_an_override_file_read_one_layout(scenario, tmp_path):
    """A file that names no sharding is held as verl holds it by default, FSDP full-shard, in both formats."""
    path, gpus, gpu = ARTICLE[scenario]
    seed = read_target(path)
    values = verl_overrides(
        seed.config, gpus, model_path=model_name_or_path(registry_name(seed.model))
    ).values
    named = seed.sharding_label.startswith("FSDP FULL_SHARD") and not seed.layout_assumed
    if not named:  # leave the layout out, as a hand-written override file may
        values = {k: v for k, v in values.items() if not k.endswith(("fsdp_size", "reshard_after_forward"))}
    override = tmp_path / "verl_overrides.txt"
    override.write_text(format_overrides(values))
    verl = read_target(override)
    assert seed.sharding == verl.sharding == verl.config.sharding == seed.config.sharding == "full_shard"
    assert seed.layout_assumed == verl.layout_assumed == (scenario != "5.2")
    if seed.reward_model is None:  # the export leaves a reward model out: compare the peaks without one
        options = {"gpus": gpus, "gpu": gpu, "cores": 64}
        yaml_phases = check(CheckOptions(path=path, **options)).memory["phases_gib"]
        verl_phases = check(CheckOptions(path=override, **options)).memory["phases_gib"]
        # both are verl jobs: the training phases are the same; the override file names the rollout share
        # the export's rule gives, so its verdict has the rollout phase beside them (vLLM's pool)
        assert yaml_phases == {k: v for k, v in verl_phases.items() if k != "rollout"}
        assert "rollout" in verl_phases and "rollout" not in yaml_phases


def test_sharding_is_proposed_first_when_it_suffices():
    """§5.1 held replicated (NO_SHARD) on two GPUs, with a limit between its replicated and sharded peaks:
    sharding the states alone fits, so first aid says that before any batch or length."""
    path, gpus, _ = ARTICLE["5.1"]
    model = _study_model(path, gpus)
    replicated = dataclasses.replace(read_target(path).config, sharding="replicate")
    sharded = dataclasses.replace(replicated, sharding="full_shard")
    limit = (model.predict(replicated) + model.predict(sharded)) / 2
    fix = first_aid(model, replicated, limit)
    assert fix.startswith("fits with any one of: 1) sharding: full_shard (FSDP: states ÷ 2) alone:")
    assert all(peak <= limit / GIB for peak in offered_peaks(fix)), fix
