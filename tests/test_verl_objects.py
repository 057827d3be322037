"""verl 0.9.1 reads every key autotune exports, where autotune.formats.verl_table says it does.

The referee is verl's own code: `tests/verl_objects.py` (run with `.venv-verl`'s python) composes an export
and runs verl's wiring (main_ppo, the V1 sync trainer's setup, the actor/reference worker, the critic's
engine config as the trainer wires it, the dataloader, the agent loop, each pass up to its engine call) with
Ray, GPUs, weights and vLLM patched out, and digests what it built. Here:

- each knob of a configuration is changed on its own; every exported key whose value verl sees change must
  move the digest entries the table names for it (`Key.reaches`), and every knob verl reads must move some;
- the keys whose value no knob changes (the strategy, a dtype, the KL estimator) are swapped one at a time;
- every key with `reaches` that any export writes is proved by one of the two;
- a key the table keeps only for verl's config checks (`reaches` empty) is refused when left out;
- the rollout batch, which verl does not read, changes nothing in the export.

A mapping made a no-op (a knob exported to a key verl does not read) fails the first check.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from autotune.config.knobs import ProbeConfig
from autotune.formats.rollout import rollout_engine
from autotune.formats.verl import verl_overrides
from autotune.formats.verl_route import Job, Key
from autotune.formats.verl_table import JOB_ROUTES, ROUTES, not_verl_knobs
from tests.conftest import REPO
from tools.model_dir import write_model_dir

pytestmark = pytest.mark.e2e
VERL_PYTHON = Path(os.environ.get("AUTOTUNE_VERL_PYTHON", REPO / ".venv-verl" / "bin" / "python"))
GPUS = 2

PPO = ProbeConfig(
    rollout_batch_size=16,
    train_batch_size=64,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    num_rollout_workers=2,
    max_prompt_length=64,
    max_response_length=128,
    kl_coef=0.05,
)
GRPO = dataclasses.replace(PPO, algorithm="grpo", rollout_n=4)
LORA = dataclasses.replace(PPO, use_lora=True, lora_r=8, lora_alpha=16)
SHARDED = dataclasses.replace(PPO, sharding="full_shard")
DYNAMIC = dataclasses.replace(PPO, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=512)
SEQS = dataclasses.replace(PPO, max_num_seqs=128)

# (knob, the configuration, the same with the knob changed)
VARIANTS = [
    ("train_batch_size", PPO, {"train_batch_size": 128}),
    ("rollout_n", PPO, {"rollout_n": 2}),
    ("gradient_accumulation_steps", PPO, {"gradient_accumulation_steps": 4}),
    ("max_prompt_length", PPO, {"max_prompt_length": 32}),
    ("max_response_length", PPO, {"max_response_length": 64}),
    ("algorithm", dataclasses.replace(PPO, rollout_n=4), {"algorithm": "grpo"}),
    ("kl_coef", PPO, {"kl_coef": 0.1}),
    ("kl_coef", PPO, {"kl_coef": 0.0}),
    ("kl_coef", GRPO, {"kl_coef": 0.1}),
    ("kl_coef", GRPO, {"kl_coef": 0.0}),
    ("use_lora", PPO, {"use_lora": True, "lora_r": 8, "lora_alpha": 16}),
    ("lora_r", LORA, {"lora_r": 16}),
    ("lora_alpha", LORA, {"lora_alpha": 32}),
    ("micro_batch_size", PPO, {"micro_batch_size": 2, "gradient_accumulation_steps": 4}),
    ("log_prob_micro_batch_size", PPO, {"log_prob_micro_batch_size": 8}),
    ("log_prob_micro_batch_size", LORA, {"log_prob_micro_batch_size": 8}),
    ("num_rollout_workers", PPO, {"num_rollout_workers": 4}),
    ("gradient_checkpointing", PPO, {"gradient_checkpointing": False}),
    ("sharding", PPO, {"sharding": "full_shard"}),
    ("sharding", SHARDED, {"sharding": "shard_grad_op"}),
    ("param_offload", SHARDED, {"param_offload": True}),
    ("optimizer_offload", SHARDED, {"optimizer_offload": True}),
    ("offload_policy", SHARDED, {"offload_policy": True}),
    ("gpu_memory_utilization", PPO, {"gpu_memory_utilization": 0.4}),
    ("tensor_model_parallel_size", PPO, {"tensor_model_parallel_size": 2}),
    ("max_num_seqs", SEQS, {"max_num_seqs": 64}),
    ("use_dynamic_bsz", PPO, {"use_dynamic_bsz": True}),
    ("ppo_max_token_len_per_gpu", DYNAMIC, {"ppo_max_token_len_per_gpu": 1024}),
    ("log_prob_max_token_len_per_gpu", DYNAMIC, {"log_prob_max_token_len_per_gpu": 2048}),
    (
        "log_prob_max_token_len_per_gpu",
        dataclasses.replace(DYNAMIC, use_lora=True, lora_r=8, lora_alpha=16),
        {"log_prob_max_token_len_per_gpu": 2048},
    ),
    ("critic_max_token_len_per_gpu", DYNAMIC, {"critic_max_token_len_per_gpu": 2048}),
]
# Keys no knob moves: each swapped for another value verl accepts, in the export of the configuration given.
AR = "actor_rollout_ref"
CONSTANTS = [
    (PPO, "trainer.n_gpus_per_node", 1),
    (PPO, "trainer.nnodes", 2),
    (PPO, f"{AR}.rollout.name", "sglang"),
    (PPO, f"{AR}.actor.strategy", "fsdp"),
    (PPO, "critic.strategy", "fsdp"),
    (PPO, f"{AR}.actor.fsdp_config.use_no_sync_for_gradient_accumulation", False),  # replicated: true
    (PPO, "critic.fsdp.use_no_sync_for_gradient_accumulation", False),
    (PPO, f"{AR}.ref.fsdp_config.model_dtype", "fp32"),
    (LORA, f"{AR}.actor.fsdp_config.model_dtype", "fp32"),
    (LORA, "critic.fsdp.model_dtype", "fp32"),
    (PPO, "algorithm.kl_penalty", "abs"),
    (GRPO, f"{AR}.actor.kl_loss_type", "kl"),
    (PPO, f"{AR}.model.path", "OTHER_MODEL"),
    (PPO, "critic.model.path", "OTHER_MODEL"),
]
BASES = {"ppo": PPO, "grpo": GRPO, "lora": LORA, "sharded": SHARDED, "dynamic": DYNAMIC, "seqs": SEQS}


def export(config: ProbeConfig, model: Path, data: Path) -> dict[str, Any]:
    """The overrides a study hands over for `config` on GPUS GPUs, with the paths a user adds."""
    engine = rollout_engine(config, GPUS, "vllm")
    values = dict(verl_overrides(config, GPUS, model_path=str(model), engine=engine).values)
    return {**values, "data.train_files": str(data), "data.val_files": str(data)}


def lines(values: dict[str, Any]) -> list[str]:
    from autotune.formats.verl import format_value

    return [f"{key}={format_value(value)}" for key, value in values.items()]


def digest_all(cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """verl's objects for each case (tests/verl_objects.py, in verl's environment). Cases with the same
    overrides (every variant's base is one of a few configurations) are built by verl once."""

    def key(case: dict[str, Any]) -> str:
        return json.dumps([case["overrides"], case.get("select", [])])

    unique: dict[str, dict[str, Any]] = {}
    for case in cases:
        unique.setdefault(key(case), {**case, "name": str(len(unique))})
    proc = subprocess.run(
        [str(VERL_PYTHON), str(REPO / "tests" / "verl_objects.py"), "--cases"],
        input=json.dumps(list(unique.values())),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    built = {item["name"]: item for item in found}
    return {case["name"]: {**built[unique[key(case)]["name"]], "name": case["name"]} for case in cases}


def table_keys() -> dict[str, list[Key]]:
    """Each key name the table may write, with its Key entries (one name may have two, by condition)."""
    keys: dict[str, list[Key]] = {}
    for route in (*ROUTES, *JOB_ROUTES):
        for key in route.keys:
            keys.setdefault(key.name, []).append(key)
    return keys


def moved(before: dict[str, Any], after: dict[str, Any], reach: str) -> bool:
    """Whether a digest entry, or any entry under it as a prefix, differs between two digests."""
    names = {k for k in (*before, *after) if k == reach or k.startswith(reach + ".")}
    return bool(names) and any(before.get(k) != after.get(k) for k in names)


def applying(key: str, config: ProbeConfig) -> Key | None:
    """The table's entry that writes `key` for `config` (a name may have two, one per condition)."""
    job = Job(config, GPUS, "MODEL", rollout_engine(config, GPUS, "vllm"))
    return next((entry for entry in table_keys().get(key, []) if entry.when(job)), None)


@dataclasses.dataclass(frozen=True)
class Case:
    config: ProbeConfig
    values: dict[str, Any]


@pytest.fixture(scope="module")
def digests(tmp_path_factory) -> dict[str, Any]:
    """Every case of this module in one run of verl's code (importing verl once): name -> (Case, result)."""
    if not VERL_PYTHON.exists():
        pytest.skip(f"verl's environment is missing ({VERL_PYTHON}): ./setup.sh test makes it")
    folder = tmp_path_factory.mktemp("verl-objects")
    model, data = write_model_dir("tiny-llama", folder / "tiny-llama"), folder / "train.parquet"
    other = write_model_dir("tiny-llama", folder / "other-model")
    select = sorted(table_keys())
    cases: dict[str, Case] = {}

    def add(name: str, config: ProbeConfig, values: dict[str, Any] | None = None) -> None:
        cases[name] = Case(config, values if values is not None else export(config, model, data))

    for name, config in BASES.items():
        add(name, config)
        for key in export(config, model, data):
            entry = applying(key, config)
            if entry is not None and not entry.reaches:  # kept for verl's checks: leave it out
                without = {k: v for k, v in export(config, model, data).items() if k != key}
                add(f"without {key} in {name}", config, without)
    for index, (_, config, changes) in enumerate(VARIANTS):
        add(f"variant {index} base", config)
        add(f"variant {index}", dataclasses.replace(config, **changes))
    for index, (config, key, value) in enumerate(CONSTANTS):
        add(f"constant {index} base", config)
        swapped = str(other) if value == "OTHER_MODEL" else value
        add(f"constant {index}", config, {**export(config, model, data), key: swapped})
    requests = [{"name": n, "overrides": lines(c.values), "select": select} for n, c in cases.items()]
    results = digest_all(requests)
    return {name: (case, results[name]) for name, case in cases.items()}


def proved(
    digests: dict[str, Any], base_name: str, variant_name: str, only: set[str] | None = None
) -> set[str]:
    """The exported keys verl sees change between two cases that the table says verl reads: each must move
    every digest entry its table entry names (else the test fails), and is then proved."""
    (base, before), (variant, after) = digests[base_name], digests[variant_name]
    exported = set(base.values) | set(variant.values)
    changed = {k for k in before["selected"] if before["selected"][k] != after["selected"].get(k)}
    found = set()
    for key in sorted(changed & exported & (only or exported)):
        entry = applying(key, variant.config) or applying(key, base.config)
        if entry is None or not entry.reaches:
            continue
        stuck = [r for r in entry.reaches if not moved(before["objects"], after["objects"], r)]
        assert not stuck, f"{variant_name}: {key} changed, but verl's {stuck} did not (the table says so)"
        found.add(key)
    return found


def test_every_exported_case_is_built_by_verl(digests):
    failed = {n: r.get("error") for n, (_, r) in digests.items() if not r["ok"] and "without" not in n}
    assert failed == {}


@pytest.mark.parametrize("index", range(len(VARIANTS)), ids=[f"{v[0]}-{i}" for i, v in enumerate(VARIANTS)])
def test_a_knob_verl_reads_moves_what_the_table_says(digests, index):
    knob = VARIANTS[index][0]
    assert proved(digests, f"variant {index} base", f"variant {index}"), (
        f"{knob}: no exported key verl reads moved verl's objects"
    )


def test_the_keys_no_knob_moves_are_read_too(digests):
    for index, (_, key, _) in enumerate(CONSTANTS):
        assert proved(digests, f"constant {index} base", f"constant {index}", {key}) == {key}, key


def test_every_key_the_export_writes_is_proved(digests):
    """What the knob variants and the swaps proved covers every written key the table says verl reads."""
    found: set[str] = set()
    for index in range(len(VARIANTS)):
        found |= proved(digests, f"variant {index} base", f"variant {index}")
    for index, (_, key, _) in enumerate(CONSTANTS):
        found |= proved(digests, f"constant {index} base", f"constant {index}", {key})
    written = {
        (key, case.config) for name, (case, _) in digests.items() if name in BASES for key in case.values
    }
    reading = {key for key, config in written if (entry := applying(key, config)) and entry.reaches}
    assert reading - found == set()
    # nothing is written that the table does not hold, but the paths a user adds
    assert {key for key, _ in written} - set(table_keys()) == {"data.train_files", "data.val_files"}


def test_a_key_kept_for_verls_checks_is_refused_when_left_out(digests):
    without = {name: result for name, (_, result) in digests.items() if name.startswith("without ")}
    assert len(without) >= 2, "the PPO and LoRA exports keep keys for verl's config checks"
    for name, result in without.items():
        assert not result["ok"], f"{name}: verl took the job without it, so the key is not needed"


def test_a_knob_verl_does_not_read_changes_nothing_in_the_export():
    assert not_verl_knobs() == ("rollout_batch_size",)
    for config in BASES.values():
        other = dataclasses.replace(config, rollout_batch_size=config.train_batch_size)
        assert verl_overrides(other, GPUS).values == verl_overrides(config, GPUS).values
