"""verl 0.9.1's own code accepts autotune's export: each exported job, with the paths the user supplies on the
launch line, composes with verl's Hydra configuration, leaves no mandatory value missing for the parts the run
uses, and passes `validate_config` with the reference policy and critic verl derives from it, as
`python -m verl.trainer.main_ppo` runs it before it starts Ray. PPO and GRPO, with and without LoRA, with and
without KL, on 1 and 2 GPUs; then the report's own files.

verl runs in its own environment (`.venv-verl`, made by `./setup.sh test`): a process, so these are e2e.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from autotune.config.knobs import ProbeConfig
from autotune.formats.read import read_target
from autotune.formats.rollout import rollout_engine
from autotune.formats.verl import format_overrides, verl_overrides
from autotune.units import GIB
from tests.conftest import REPO
from tools.model_dir import write_model_dir

pytestmark = pytest.mark.e2e
VERL_PYTHON = Path(os.environ.get("AUTOTUNE_VERL_PYTHON", REPO / ".venv-verl" / "bin" / "python"))
VALIDATOR = REPO / "tests" / "verl_validate.py"

PPO = ProbeConfig(
    rollout_batch_size=16,
    train_batch_size=64,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    num_rollout_workers=2,
    max_prompt_length=64,
    max_response_length=128,
    gradient_checkpointing=True,
)
GRPO = dataclasses.replace(PPO, algorithm="grpo", rollout_n=4, log_prob_micro_batch_size=8)
CASES = {
    f"{name}{' lora' if lora else ''}{'' if kl else ' no-kl'} {gpus}gpu": (
        dataclasses.replace(base, use_lora=lora, lora_r=8, lora_alpha=16, kl_coef=0.05 if kl else 0.0),
        gpus,
    )
    for name, base in (("ppo", PPO), ("grpo", GRPO))
    for lora in (False, True)
    for kl in (True, False)
    for gpus in (1, 2)
}
HOLDINGS = {  # how the states are held, on 2 GPUs: (knobs, what verl's engine config must read)
    "full_shard": ({"sharding": "full_shard"}, {"fsdp_size": -1, "reshard_after_forward": True}),
    "shard_grad_op": ({"sharding": "shard_grad_op"}, {"fsdp_size": -1, "reshard_after_forward": False}),
    "replicate": ({}, {"fsdp_size": 1}),
    "phase offload": (
        {"sharding": "full_shard", "param_offload": True, "optimizer_offload": True},
        {"param_offload": True, "optimizer_offload": True, "offload_policy": False},
    ),
    "offload_policy": ({"sharding": "full_shard", "offload_policy": True}, {"offload_policy": True}),
}
VERL_KNOBS = {  # verl's own knobs (--engine verl), on 2 GPUs with tensor parallel 2
    "gpu_memory_utilization": 0.45,
    "tensor_model_parallel_size": 2,
    "max_num_seqs": 64,
    "use_dynamic_bsz": True,
    "ppo_max_token_len_per_gpu": 512,
}
for name, base in (("ppo", PPO), ("grpo", GRPO)):
    CASES[f"{name} verl knobs 2gpu"] = (dataclasses.replace(base, **VERL_KNOBS), 2)
for holding_name, (knobs, _) in HOLDINGS.items():
    for lora in (False, True):
        CASES[f"ppo {holding_name}{' lora' if lora else ''} 2gpu"] = (
            dataclasses.replace(PPO, use_lora=lora, lora_r=8, lora_alpha=16, **knobs),
            2,
        )


def run_verl(cases: list[dict]) -> dict[str, dict]:
    if not VERL_PYTHON.is_file():
        pytest.skip(
            f"no verl environment at {VERL_PYTHON}: run ./setup.sh test (or set AUTOTUNE_VERL_PYTHON)"
        )
    proc = subprocess.run(
        [str(VERL_PYTHON), str(VALIDATOR), "--cases"],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=600,
        cwd="/",  # verl's wheel ships a top-level `tests` package: keep this folder's out of its path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {result["name"]: result for result in map(json.loads, proc.stdout.splitlines())}


def user_paths(model: Path, config: ProbeConfig) -> list[str]:
    """What the launch line asks the user for (the data files are read only when training starts)."""
    paths = [f"actor_rollout_ref.model.path={model}"]
    return paths + ([f"critic.model.path={model}"] if config.algorithm == "ppo" else [])


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    model = write_model_dir("tiny-llama", tmp_path_factory.mktemp("models") / "tiny-llama")
    cases = []
    for name, (config, gpus) in CASES.items():
        engine = rollout_engine(config, gpus, "vllm", 80 * GIB, 30 * GIB, 4_000_000)
        lines = format_overrides(verl_overrides(config, gpus, engine=engine).values).splitlines()
        cases.append({"name": name, "overrides": lines + user_paths(model, config)})
    return run_verl(cases)


@pytest.mark.parametrize("name", list(CASES))
def test_verl_validates_the_exported_job(verdicts, name):
    config, _ = CASES[name]
    verdict = verdicts[name]
    assert verdict["ok"], verdict
    assert verdict["use_reference_policy"] == config.use_kl  # a reference model exactly when KL is used
    assert verdict["use_critic"] == (config.algorithm == "ppo")
    assert verdict["rollout"]["name"] == "vllm"
    assert verdict["rollout"]["max_model_len"] == config.sequence_length
    # With LoRA, verl's last step looks the rank up in vLLM's table, which needs vLLM (not installable here):
    # every other check ran; that one is re-stated by autotune's rule (rank <= 512, tests/test_verl_export.py)
    assert ("not_run" in verdict) == config.use_lora
    # verl's own config classes read the states' holding as the probe held them, for actor and critic
    for model, engine in verdict["holding"].items():
        assert engine["strategy"] == "fsdp2", (model, engine)
        assert engine["fsdp_size"] == (-1 if config.sharded else 1)
        assert engine["reshard_after_forward"] == (config.sharding != "shard_grad_op")
        # as the probe reduced: DDP skips the all-reduce on all but the last micro batch, FSDP reduces each
        assert engine["use_no_sync_for_gradient_accumulation"] is (not config.sharded)
        assert engine["model_dtype"] == ("bf16" if config.use_lora else "fp32")
        for knob in ("param_offload", "optimizer_offload", "offload_policy"):
            assert engine[knob] == getattr(config, knob), (model, knob)
    holding = next((want for key, (_, want) in HOLDINGS.items() if name.startswith(f"ppo {key}")), {})
    assert holding.items() <= verdict["holding"]["actor"].items()
    assert_verl_knobs(config, verdict)


def assert_verl_knobs(config: ProbeConfig, verdict: dict) -> None:
    """The knobs reach verl's config classes as set; without them, verl's defaults (dynamic batch off)."""
    knobs = verdict["verl_knobs"]
    assert knobs["max_num_seqs"] == (config.max_num_seqs or 256)  # rollout.yaml's default
    passes = ["actor", "log_prob", "ref"] + (["critic"] if config.algorithm == "ppo" else [])
    for name in passes:
        assert knobs[name][0] is config.use_dynamic_bsz, (name, knobs)
        if config.use_dynamic_bsz:
            assert knobs[name][1] == config.token_budget, (name, knobs)
    if config.use_dynamic_bsz and config.algorithm == "ppo":
        assert knobs["critic_engine"] == config.token_budget
    if config.uses_verl_knobs:
        rollout = verdict["rollout"]
        assert rollout["gpu_memory_utilization"] == config.gpu_memory_utilization
        assert rollout["tensor_model_parallel_size"] == config.tensor_model_parallel_size


def test_a_file_without_the_rollout_engine_is_refused_by_verl(tmp_path):
    model = write_model_dir("tiny-llama", tmp_path / "tiny-llama")
    values = verl_overrides(PPO, 1).values
    del values["actor_rollout_ref.rollout.name"]
    verdict = run_verl(
        [{"name": "unnamed", "overrides": [*format_overrides(values).splitlines(), *user_paths(model, PPO)]}]
    )
    assert not verdict["unnamed"]["ok"] and "actor_rollout_ref.rollout.name" in json.dumps(verdict)


def test_the_reports_own_files_start_verl_and_say_the_same_job(tmp_path):
    """A real (tiny) study's verl_overrides.txt, with the launch line's paths, passes verl's validate_config;
    read back by `autotune check` it is best_config.yaml's configuration and recipe, key by key."""
    from autotune.report.write import write_report
    from autotune.study.plan import StudyPlan
    from tests.report_studies import standard_study
    from tests.test_report import BUDGET

    out = tmp_path / "report"
    write_report(standard_study(), out, BUDGET, plan=StudyPlan(model="tiny-llama", gpus=1))
    model = write_model_dir("tiny-llama", tmp_path / "tiny-llama")
    seed, verl = read_target(out / "best_config.yaml"), read_target(out / "verl_overrides.txt")
    # the same job; verl has no rollout batch (a step's prompts generate together): it reads back as T; both
    # files say verl's default 8 dataloader workers (the built-in probe does not measure them)
    assert seed.config.num_rollout_workers == 8
    same = dataclasses.replace(seed.config, rollout_batch_size=seed.config.train_batch_size)
    assert dataclasses.asdict(verl.config) == dataclasses.asdict(same)
    assert verl.engine == seed.engine
    lines = (out / "verl_overrides.txt").read_text().splitlines()
    verdict = run_verl([{"name": "report", "overrides": lines + user_paths(model, seed.config)}])["report"]
    assert verdict["ok"], verdict
    launch = yaml.safe_load((out / "best_config.yaml").read_text())["rollout_engine"]
    assert verdict["rollout"] == launch


def test_the_verl_probes_command_composes_and_passes_validate_config(tmp_path):
    """`--engine verl` launches the export plus the short-run settings (autotune/probe/verl/verl_run.py):
    verl's Hydra configuration takes every key, validate_config passes, and the short-run values read back."""
    from autotune.probe.verl.verl_run import verl_run

    model = write_model_dir("tiny-llama", tmp_path / "tiny-llama")
    configs = {
        "ppo": (PPO, {}),
        "grpo lora": (dataclasses.replace(GRPO, use_lora=True, lora_r=8), {}),
        "ppo on a cluster's two nodes": (PPO, {"nodes": 2, "ray_address": "10.0.0.5:6379"}),
    }
    cases, runs = [], {}
    for name, (config, cluster) in configs.items():
        run = verl_run(
            config,
            world_size=2,
            steps=3,
            model_path=str(model),
            run_dir=tmp_path / "run",
            verl_python=str(VERL_PYTHON),
            card_bytes=80 * GIB,
            resident_bytes=0.0,
            **cluster,
        )
        overrides = [arg for arg in run.argv[3:] if not arg.startswith("hydra.")]  # Hydra's own, not verl's
        cases.append({"name": name, "overrides": overrides})
        runs[name] = run
    for name, verdict in run_verl(cases).items():  # one start of verl's environment for all
        on_cluster = name.endswith("two nodes")
        assert verdict["ok"], (name, verdict)
        assert verdict["short_run"] == {
            "trainer.total_training_steps": 3,
            "trainer.total_epochs": 3,
            "trainer.val_before_train": False,
            "trainer.test_freq": -1,
            "trainer.save_freq": -1,
            "trainer.resume_mode": "disable",
            "trainer.logger": ["console", "file"],
            "actor_rollout_ref.rollout.ignore_eos": True,
            "data.filter_overlong_prompts": False,
            "data.train_files": str(runs[name].train_path),
            "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH": str(runs[name].metrics_path),
            # a Ray instance of its own, never a recorded cluster; with --ray, the cluster autotune joined
            "ray_kwargs.ray_init.address": "10.0.0.5:6379" if on_cluster else "local",
            "ray_kwargs.ray_init._temp_dir": None if on_cluster else str(tmp_path / "run" / "ray"),
            "trainer.v1.sampler.sync_refill_failed_groups": False,
            "trainer.nnodes": 2 if on_cluster else 1,
            "trainer.n_gpus_per_node": 1 if on_cluster else 2,
        }, name


def test_the_shipped_verl_space_probes_jobs_verl_accepts(tmp_path):
    """`--space verl-qwen2.5-0.5b-1gpu`: its hand-made config and random samples (dynamic batch size on and
    off) compose as the verl probe launches them and pass validate_config."""
    import optuna

    from autotune.probe.verl.verl_run import verl_run
    from autotune.space.loading import load_space
    from autotune.space.model import sample_config

    space = load_space("verl-qwen2.5-0.5b-1gpu", cores=4)
    sampler = optuna.samplers.RandomSampler(seed=3)
    study = optuna.create_study(sampler=sampler)
    samples = [sample_config(space, study.ask()) for _ in range(12)]
    configs = {"hand-made": space.seed_configs[0].config}
    configs["dynamic"] = next(c for c in samples if c.use_dynamic_bsz)
    configs["static"] = next(c for c in samples if not c.use_dynamic_bsz)
    model = write_model_dir("tiny-qwen2", tmp_path / "tiny-qwen2")
    cases = []
    for name, config in configs.items():
        run = verl_run(
            config,
            world_size=space.gpus,
            steps=3,
            model_path=str(model),
            run_dir=tmp_path / name,
            verl_python=str(VERL_PYTHON),
            card_bytes=0.0,
            resident_bytes=None,
        )
        cases.append({"name": name, "overrides": [a for a in run.argv[3:] if not a.startswith("hydra.")]})
    verdicts = run_verl(cases)
    for name in configs:
        assert verdicts[name]["ok"], (name, verdicts[name])
