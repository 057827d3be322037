"""A measured configuration as Hydra overrides for `python -m verl.trainer.main_ppo` (verl 0.9.1), and back.

    overrides = verl_overrides(config, n_gpus=2, model_path="meta-llama/Llama-2-7b-hf")
    assert verl_rule_violations(overrides.values, n_gpus=2) == []
    Path("verl_overrides.txt").write_text(format_overrides(overrides.values))
    read_overrides(Path("verl_overrides.txt").read_text()).config     # the same config, for `autotune check`

Which keys are written, and why each, is autotune.formats.verl_table's to say: the export writes the table's
keys and nothing else.

Units. autotune counts *samples* (responses) in its global sizes; verl counts *prompts* in
`data.train_batch_size` and `actor.ppo_mini_batch_size`, and multiplies them by `rollout.n` internally
(trainer/ppo/v1/trainer_base.py `_update_actor`: `ppo_mini_batch_size * rollout.n`). With T train samples, m
micro per GPU, g accumulation steps, W GPUs and n samples per prompt:

    data.train_batch_size   B = T / n            prompts per step
    actor.ppo_mini_batch_size M = m·g·W / n      prompts per optimizer step: verl makes it M·n = m·g·W
                                                 samples, M·n/W per GPU, in (M·n/W)/m = g micro-batches
    e.g. T=512, m=32, g=4, W=2, n=1: B=512, M=256 -> 2 optimizer steps of 32×4 per GPU.

When m·g·W is not a multiple of n, no whole number of prompts gives exactly that mini-batch: it is rounded
up to lcm(m·g·W, n) samples, which still divides T (T is a multiple of both); the micro batch, hence the
memory, is unchanged, only the accumulation per optimizer step grows (said in the export's notes).

Rules verl 0.9.1 enforces (utils/config.py validate_config, workers/config/{actor,critic}.py validate,
engine_workers.py train_mini_batch, tensordict_utils.make_iterator, engine/utils.py micro-batching,
protocol.DataProto.chunk for the agent-loop workers) are checked by the pure `verl_rule_violations`, for
autotune's files and a user's alike.
"""

from __future__ import annotations

import functools
import math
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, overload

from autotune.config.knobs import ProbeConfig
from autotune.config.rules import Finding, config_findings, problems
from autotune.formats import verl_schema
from autotune.formats.hydra_read import Line, read_lines
from autotune.formats.launch_script import LaunchRead, looks_like_launch_script, read_launch_script
from autotune.formats.rollout import ROLLOUT_ENGINES, RolloutEngine
from autotune.formats.target import Target
from autotune.formats.verl_route import AR, Job, agent_workers, mini_batch_samples
from autotune.formats.verl_table import JOB_ROUTES, ROUTES

__all__ = [
    "AR",
    "DEPRECATED_MICRO",
    "MINI_KEY",
    "VERL_KIND",
    "VerlOverrides",
    "format_overrides",
    "format_value",
    "need_critic",
    "need_reference",
    "override_lines",
    "parse_overrides",
    "read_overrides",
    "verl_keys",
    "verl_overrides",
    "verl_rule_violations",
]

# The batch sizes come from the file only: verl's own (1024 prompts, mini batch 256) are its example's, not a
# job the user wrote; a file without them is read without a configuration (`check` says so).
VERL_KIND = "verl overrides"  # Target.kind of a verl override file or launch script
MINI_KEY = f"{AR}.actor.ppo_mini_batch_size"  # verl's mini batch, in prompts
FILE_ONLY = ("data.train_batch_size", MINI_KEY)
CRITIC_ENGINE_BUDGET = "+critic.ppo_infer_max_token_len_per_gpu"
BUDGET_KEYS = (  # token budgets per GPU under dynamic batch size (None: verl's default)
    f"{AR}.actor.ppo_max_token_len_per_gpu",
    f"{AR}.rollout.log_prob_max_token_len_per_gpu",
    f"{AR}.ref.log_prob_max_token_len_per_gpu",
    "critic.ppo_max_token_len_per_gpu",
    "critic.forward_max_token_len_per_gpu",
    CRITIC_ENGINE_BUDGET,
)
VLLM_MAX_LORA_RANK = 512  # verl's get_vllm_max_lora_rank: vLLM's largest MaxLoRARanks value
_PLAIN_VALUE = re.compile(r"^[A-Za-z0-9_./:~+-]+$")  # a Hydra value that needs no quotes


@dataclass
class VerlOverrides:
    values: dict[str, Any]  # key -> value, in the order they are written
    notes: list[str] = field(default_factory=list)  # where the mapping had to adapt a value

    def lines(self) -> list[str]:
        return [f"{key}={format_value(value)}" for key, value in self.values.items()]


def format_value(value: Any) -> str:
    """A value in Hydra's override grammar."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(item) for item in value) + "]"
    text = str(value)
    if isinstance(value, (int, float)) or _PLAIN_VALUE.match(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def format_overrides(values: Mapping[str, Any]) -> str:
    return "".join(f"{key}={format_value(value)}\n" for key, value in values.items())


def override_lines(text: str) -> list[Line]:
    """An override file's lines: one Hydra override a line; blank lines and `#` comments skipped."""
    return [
        Line(number, line.strip())
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#")
    ]


def parse_overrides(text: str, where: str = "overrides") -> dict[str, Any]:
    """An override file's values, read by Hydra's own parser (autotune.formats.hydra_read)."""
    return read_lines(override_lines(text), where, verl_keys())[0]


def verl_overrides(
    config: ProbeConfig,
    n_gpus: int,
    model_path: str | None = None,
    engine: RolloutEngine | None = None,
    workers: int | None = None,
    nodes: int = 1,
) -> VerlOverrides:
    """verl 0.9.1 overrides for a measured config on n_gpus GPUs, over `nodes` machines with as many on each
    (ValueError: invalid config).

    The keys are the table's (autotune.formats.verl_table), each with the value the probe used: every key
    verl's V1 trainer builds its workers from, and those its config check requires; nothing for a knob verl
    does not have (the rollout batch). `workers`: the worker count to write instead of the configuration's
    (verl's default, where the built-in probe ran on another machine's cores)."""
    broken = problems(config_findings(config, n_gpus, cores=max(1, config.num_rollout_workers)))
    if broken:
        lines = "; ".join(f.line for f in broken)
        raise ValueError(f"cannot export an invalid configuration for {n_gpus} GPU(s): {lines}")
    engine = engine or RolloutEngine(max_model_len=config.sequence_length)
    if nodes < 1 or n_gpus % nodes:
        raise ValueError(f"{n_gpus} GPU(s) cannot be spread evenly over {nodes} node(s)")
    job = Job(config, n_gpus, model_path, engine, workers, nodes)
    values = {key.name: key.value(job) for route in (*ROUTES, *JOB_ROUTES) for key in route.written(job)}
    return VerlOverrides(values, _notes(config, n_gpus, job.worker_count) + list(engine.notes))


def _notes(c: ProbeConfig, n_gpus: int, wanted: int) -> list[str]:
    """Where the export had to adapt a value to what verl can express."""
    notes = []
    mini = mini_batch_samples(c, n_gpus)
    if mini != c.micro_batch_size * c.gradient_accumulation_steps * n_gpus:
        notes.append(
            f"micro×accumulation×gpus={c.micro_batch_size}×{c.gradient_accumulation_steps}×{n_gpus} "
            f"is not a whole number of prompts (rollout_n={c.rollout_n}): the optimizer step uses {mini} "
            f"samples ({mini // (c.micro_batch_size * n_gpus)} micro-batches per GPU); "
            f"memory is unchanged"
        )
    workers = agent_workers(c, wanted)
    if workers != wanted:
        notes.append(
            f"rollout.agent.num_workers={workers}: the largest divisor of the {c.train_batch_size} "
            f"samples per step not above {wanted}"
        )
    return notes


# --- reading back -------------------------------------------------------------------------------------


def read_overrides(
    text: str, where: str = "overrides", path: Path | None = None, call: int | None = None
) -> Target:
    """A verl override file, or a bash launch script (what bash hands main_ppo at its `call`-th start; the
    script is `path`, or `text` run from a temporary file): verl's keys mapped back to autotune's knobs (the
    inverse of `verl_overrides`); a key the file leaves out has verl's default. What verl's Hydra config
    refuses (unknown keys, ...) is a finding: verl would refuse the file at start-up; a line that cannot be
    read is a UserError."""
    notes: list[str] = []
    call_line, call_file = None, None
    if looks_like_launch_script(text):
        script = _read_script(text, where, path, call)
        lines, notes = script.lines, script.notes
        if script.call is not None:
            call_line, call_file = script.call.line, script.call.command.file
    else:
        lines = override_lines(text)
    values, refused = read_lines(lines, where, verl_keys())
    get = _getter(values)
    nodes, per_node = get("trainer.nnodes"), get("trainer.n_gpus_per_node")
    gpus = per_node * nodes if isinstance(per_node, int) and isinstance(nodes, int) else None
    reward = get("reward_model.model.path") if get("reward_model.enable") else None
    config = _config(get, values, gpus or 1)
    engine = RolloutEngine(
        get(f"{AR}.rollout.name"),
        get(f"{AR}.rollout.tensor_model_parallel_size"),
        get(f"{AR}.rollout.gpu_memory_utilization"),
        get(f"{AR}.rollout.max_model_len"),
        max_num_seqs=_int_or(values.get(f"{AR}.rollout.max_num_seqs"), None),
    )
    return Target(
        kind=VERL_KIND,
        config=config,
        model=get(f"{AR}.model.path"),
        reward_model=reward,
        sharding=_sharding_label(config)[0],
        sharding_label=_sharding_label(config)[1],
        offload=config.offloaded if config else False,
        gpus=gpus,
        findings=refused + [Finding("verl", note, severity="note") for note in notes],
        overrides=values,
        engine=engine,
        call_line=call_line,
        call_file=call_file,
    )


def _read_script(text: str, where: str, path: Path | None, call: int | None) -> LaunchRead:
    if path is not None:
        return read_launch_script(path, where, call)
    with tempfile.TemporaryDirectory(prefix="autotune-script-") as folder:
        script = Path(folder) / "script.sh"
        script.write_text(text)
        return read_launch_script(script, where, call)


@functools.cache
def verl_keys() -> frozenset[str]:
    """Every key of verl 0.9.1's composed trainer config (written by tools/verl_keys.py from verl's files)."""
    text = resources.files("autotune.formats").joinpath("verl_keys.txt").read_text()
    return frozenset(line for line in text.splitlines() if line and not line.startswith("#"))


def _config(get: Any, values: Mapping[str, Any], gpus: int) -> ProbeConfig | None:
    """verl counts prompts, autotune samples (× rollout.n); None when the sizes are missing or not whole.
    verl has no rollout batch: a step's prompts generate together, which reads as R = T."""
    n, batch = get(f"{AR}.rollout.n"), get("data.train_batch_size")
    mini = get(f"{AR}.actor.ppo_mini_batch_size")
    if not all(_whole(v) for v in (n, batch, mini)):
        return None
    length = _int_or(get("data.max_prompt_length"), 512) + _int_or(get("data.max_response_length"), 512)
    dynamic = get(f"{AR}.actor.use_dynamic_bsz") is True
    budget = _int_or(get(f"{AR}.actor.ppo_max_token_len_per_gpu"), None) if dynamic else None
    micro = _micro(get, max(1, mini * n // gpus), budget, length, gpus)
    if micro is None:
        return None
    update = (budget or micro * length) if dynamic else None
    lora = get(f"{AR}.model.lora_rank")
    forward = _int_or(_per_gpu(get, f"{AR}.rollout.log_prob_micro_batch_size_per_gpu", gpus), None)
    return ProbeConfig(
        rollout_batch_size=batch * n,
        train_batch_size=batch * n,
        micro_batch_size=micro,
        gradient_accumulation_steps=max(1, mini * n // gpus // micro),
        num_rollout_workers=_int_or(get("data.dataloader_num_workers"), 8),  # verl's default
        max_prompt_length=_int_or(get("data.max_prompt_length"), 512),
        max_response_length=_int_or(get("data.max_response_length"), 512),
        log_prob_micro_batch_size=None if forward in (None, micro) else forward,  # None: the same as micro
        gradient_checkpointing=get(f"{AR}.model.enable_gradient_checkpointing") is not False,  # verl: on
        # the probe's PPO is GAE with a critic, its GRPO group advantages without one: verl's critic decides
        algorithm="ppo" if need_critic(values) else "grpo",
        rollout_n=n,
        use_lora=isinstance(lora, int) and lora > 0,
        lora_r=lora if isinstance(lora, int) and lora > 0 else ProbeConfig.lora_r,
        # knobs whose unset value means verl's default: the file's value only
        lora_alpha=_int_or(values.get(f"{AR}.model.lora_alpha"), ProbeConfig.lora_alpha),
        kl_coef=_kl_coef(get),
        **_holding(get, gpus),
        max_num_seqs=_int_or(values.get(f"{AR}.rollout.max_num_seqs"), None),
        use_dynamic_bsz=dynamic,
        ppo_max_token_len_per_gpu=None if budget in (None, micro * length) else budget,
        # the forward passes' and the critic's budgets: the file's own only (unset or the actor's: None)
        log_prob_max_token_len_per_gpu=_own_budget(
            values, f"{AR}.rollout.log_prob_max_token_len_per_gpu", update
        ),
        critic_max_token_len_per_gpu=_own_budget(values, CRITIC_ENGINE_BUDGET.lstrip("+"), update),
    )


def _own_budget(values: Mapping[str, Any], key: str, update: int | None) -> int | None:
    """A token budget the file sets itself beside the update's `update` (None: no dynamic batch size, when
    verl reads no budget); one equal to the update's reads as None, which means it."""
    value = values.get(key)
    return value if update is not None and _whole(value) and value != update else None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _per_gpu(get: Any, key: str, gpus: int) -> Any:
    """A per-GPU micro batch, else the deprecated global key over the GPUs: the job the file means (verl 0.9.1
    refuses it, and `verl_rule_violations` says so, but the memory is the same)."""
    value = get(key)
    old = get(DEPRECATED_MICRO[key])
    return max(1, old // gpus) if value is None and _whole(old) else value


def _micro(get: Any, per_gpu: int, budget: int | None, length: int, gpus: int) -> int | None:
    """The actor's micro batch; under dynamic batch size, which cuts micro-batches by tokens and reads no
    micro batch (the export writes none), the largest divisor of the GPU's mini batch the budget holds."""
    micro = _per_gpu(get, f"{AR}.actor.ppo_micro_batch_size_per_gpu", gpus)
    if budget is None or _whole(micro):
        return micro if _whole(micro) else None
    fits = max(1, budget // max(1, length))
    return max(d for d in range(1, per_gpu + 1) if per_gpu % d == 0 and d <= fits)


def _holding(get: Any, gpus: int) -> dict[str, Any]:
    """How verl holds the states: FSDP over every GPU unless shard groups of one GPU (fsdp_size 1) replicate
    them; reshard_after_forward false keeps the gathered weights to the backward (SHARD_GRAD_OP)."""
    fsdp = f"{AR}.actor.fsdp_config"
    if get(f"{fsdp}.fsdp_size") == 1:
        sharding = "replicate"
    else:
        sharding = "shard_grad_op" if get(f"{fsdp}.reshard_after_forward") is False else "full_shard"
    return {
        "sharding": sharding,
        "param_offload": get(f"{fsdp}.param_offload") is True,
        "optimizer_offload": get(f"{fsdp}.optimizer_offload") is True,
        "offload_policy": get(f"{fsdp}.offload_policy") is True,
    }


def _sharding_label(config: ProbeConfig | None) -> tuple[str, str]:
    """(the check's sharding name, how to say it)."""
    if config is None or config.sharding == "full_shard":
        return "full_shard", "verl FSDP, FULL_SHARD (its default)"
    if config.sharding == "shard_grad_op":
        return "shard_grad_op", "verl FSDP, reshard_after_forward false (SHARD_GRAD_OP)"
    return "none", "verl FSDP with fsdp_size 1 (replicated)"


def _kl_coef(get: Any) -> float:
    """The KL coefficient verl uses: the in-reward one, else the loss's, else 0 (no KL, no reference)."""
    for switch, coefficient in (
        ("algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef"),
        (f"{AR}.actor.use_kl_loss", f"{AR}.actor.kl_loss_coef"),
    ):
        if get(switch) is True:
            value = get(coefficient)  # not a number: nan, which the rules refuse by name
            return (
                float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
            )
    return 0.0


@overload
def _int_or(value: Any, default: int) -> int: ...
@overload
def _int_or(value: Any, default: None) -> int | None: ...
def _int_or(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


# --- verl's rules ----------------------------------------------------------------------------------------


def _get(overrides: Mapping[str, Any], key: str) -> Any:
    """The value verl reads for `key`: the file's, else verl 0.9.1's default (verl_schema.json), with the
    defaults' interpolations followed; None for a mandatory value the file leaves out."""
    if key in FILE_ONLY and key not in overrides:
        return None
    if verl_schema.kind(key) is None:
        return overrides.get(key)
    value = verl_schema.effective(key, overrides)
    return None if value == verl_schema.MISSING else value


def _getter(values: Mapping[str, Any]) -> Callable[[str], Any]:
    return functools.partial(_get, values)


def _positive_ints(overrides: Mapping[str, Any], keys: list[str]) -> list[str]:
    errors = []
    for key in keys:
        value = _get(overrides, key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            errors.append(f"{key}={value}: must be a whole number >= 1")
    return errors


def verl_rule_violations(overrides: Mapping[str, Any], n_gpus: int) -> list[str]:
    """Every rule of verl 0.9.1 the overrides break on one node of n_gpus GPUs; [] when verl accepts them.

    N GPUs, B = data.train_batch_size, n = rollout.n, M = actor.ppo_mini_batch_size, m = micro per GPU.
    """
    actor, rollout, ref = f"{AR}.actor", f"{AR}.rollout", f"{AR}.ref"
    micro_keys = [f"{actor}.ppo_micro_batch_size_per_gpu", f"{rollout}.log_prob_micro_batch_size_per_gpu"]
    if need_reference(overrides):  # validate_config checks the reference's only when verl builds one
        micro_keys.append(f"{ref}.log_prob_micro_batch_size_per_gpu")
    if need_critic(overrides):
        micro_keys.append("critic.ppo_micro_batch_size_per_gpu")
    sizes = [
        "data.train_batch_size",
        f"{actor}.ppo_mini_batch_size",
        f"{rollout}.n",
        "data.gen_batch_size",
        f"{rollout}.agent.num_workers",
        f"{rollout}.tensor_model_parallel_size",
        "critic.forward_micro_batch_size_per_gpu",
        f"{rollout}.max_num_seqs",
        *BUDGET_KEYS,
        *micro_keys,
        *(DEPRECATED_MICRO[key] for key in micro_keys),
    ]
    errors = _positive_ints(overrides, sizes)
    if errors:  # the divisibility rules below need positive whole numbers
        return errors
    errors += _gpu_rules(overrides, n_gpus) + _dynamic_rules(overrides)
    if not _get(overrides, f"{actor}.use_dynamic_bsz"):
        errors += [error for key in micro_keys for error in _micro_key_rules(overrides, key, n_gpus)]
    if "data.train_batch_size" in overrides:
        errors += _batch_rules(overrides, n_gpus)
    return errors


# verl's deprecated global micro batch keys, beside the per-GPU keys that replaced them
DEPRECATED_MICRO = {
    f"{AR}.actor.ppo_micro_batch_size_per_gpu": f"{AR}.actor.ppo_micro_batch_size",
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu": f"{AR}.rollout.log_prob_micro_batch_size",
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu": f"{AR}.ref.log_prob_micro_batch_size",
    "critic.ppo_micro_batch_size_per_gpu": "critic.ppo_micro_batch_size",
}


def need_critic(overrides: Mapping[str, Any]) -> bool:
    """verl builds a critic where critic.enable says so, else for GAE only (trainer/ppo/utils.py
    need_critic)."""
    enable = _get(overrides, "critic.enable")
    return bool(enable) if enable is not None else _get(overrides, "algorithm.adv_estimator") == "gae"


def need_reference(overrides: Mapping[str, Any]) -> bool:
    """verl builds a reference policy only where KL is used, in the reward or in the loss
    (trainer/ppo/utils.py need_reference_policy)."""
    return bool(_get(overrides, "algorithm.use_kl_in_reward") or _get(overrides, f"{AR}.actor.use_kl_loss"))


def _micro_key_rules(overrides: Mapping[str, Any], key: str, n_gpus: int) -> list[str]:
    """A micro batch without dynamic batch size: the per-GPU key, or for the critic the deprecated global
    one, but never both."""
    old = DEPRECATED_MICRO[key]
    per_gpu, global_ = _get(overrides, key), overrides.get(old)
    if per_gpu is not None and global_ is not None:
        # workers/config/actor.py ActorConfig.__post_init__, workers/config/critic.py CriticConfig
        # _check_mutually_exclusive, utils/config.py validate_config check_mutually_exclusive
        return [f"{key}={per_gpu} and {old}={global_}: verl refuses both; remove the deprecated {old}"]
    if per_gpu is not None or (global_ is not None and key.startswith("critic.")):
        return []  # verl's critic config takes either (its per-GPU default interpolates the global key)
    if global_ is None:
        return [f"{key}: not set; verl requires every micro batch size unless use_dynamic_bsz is on"]
    # validate_config passes the deprecated key, but verl 0.9.1 no longer converts it: V1's worker asserts
    # the per-GPU key (workers/engine_workers.py ActorRolloutRefWorker.init_model)
    return [
        f"{old}={global_}: deprecated, and verl 0.9.1's worker requires {key} instead (it no longer divides "
        f"the global size by the GPUs): write {key}={max(1, global_ // n_gpus)}"
    ]


def _dynamic_rules(overrides: Mapping[str, Any]) -> list[str]:
    """vLLM's share is a fraction of the card; dynamic batch size is one switch for the actor and its
    old-log-prob pass (workers/engine_workers.py:616), and every token budget holds the longest sequence
    (utils/seqlen_balancing.py:384-386)."""
    errors = []
    share = _get(overrides, f"{AR}.rollout.gpu_memory_utilization")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        errors.append(
            f"{AR}.rollout.gpu_memory_utilization={share}: must be a fraction of the card, in (0, 1]"
        )
    dynamic = _get(overrides, f"{AR}.actor.use_dynamic_bsz") is True
    log_prob = overrides.get(f"{AR}.rollout.log_prob_use_dynamic_bsz", dynamic)
    if log_prob is not dynamic:
        errors.append(
            f"{AR}.rollout.log_prob_use_dynamic_bsz={format_value(log_prob)}: verl asserts it equals "
            f"{AR}.actor.use_dynamic_bsz={format_value(dynamic)}"
        )
    if not dynamic:
        return errors
    longest = _int_or(_get(overrides, "data.max_prompt_length"), 512) + _int_or(
        _get(overrides, "data.max_response_length"), 512
    )
    for key in BUDGET_KEYS:
        budget = _get(overrides, key)
        if isinstance(budget, int) and budget < longest:
            errors.append(
                f"{key}={budget}: below the longest sequence, data.max_prompt_length+max_response_length="
                f"{longest}; verl asserts a micro-batch's token budget holds it"
            )
    return errors


def _gpu_rules(overrides: Mapping[str, Any], n_gpus: int) -> list[str]:
    errors = []
    per_node, nodes = overrides.get("trainer.n_gpus_per_node"), _get(overrides, "trainer.nnodes")
    if per_node is not None and per_node * nodes != n_gpus:
        errors.append(
            f"trainer.n_gpus_per_node×trainer.nnodes={per_node}×{nodes}: must equal the {n_gpus} GPUs"
        )
    tp = _get(overrides, f"{AR}.rollout.tensor_model_parallel_size")
    if n_gpus % tp:
        errors.append(f"{AR}.rollout.tensor_model_parallel_size={tp}: must divide the {n_gpus} GPUs")
    rank = overrides.get(f"{AR}.model.lora_rank")
    if rank is not None and rank > VLLM_MAX_LORA_RANK:
        errors.append(f"{AR}.model.lora_rank={rank}: vLLM allows at most {VLLM_MAX_LORA_RANK}")
    n = _get(overrides, f"{AR}.rollout.n")
    if _get(overrides, "algorithm.adv_estimator") == "grpo" and n < 2:
        errors.append(f"{AR}.rollout.n={n}: GRPO needs >= 2 samples per prompt")
    name = _get(overrides, f"{AR}.rollout.name")
    if name is None:
        errors.append(
            f"{AR}.rollout.name: not set; verl requires it (mandatory): one of {', '.join(ROLLOUT_ENGINES)}"
        )
    elif name not in ROLLOUT_ENGINES:
        errors.append(
            f"{AR}.rollout.name={name}: verl 0.9.1's rollout engines are {', '.join(ROLLOUT_ENGINES)}"
        )
    return errors


def _batch_rules(overrides: Mapping[str, Any], n_gpus: int) -> list[str]:
    N, B = n_gpus, overrides["data.train_batch_size"]
    n = _get(overrides, f"{AR}.rollout.n")
    M = _get(overrides, f"{AR}.actor.ppo_mini_batch_size")
    errors = []
    if (B * n) % N:
        errors.append(f"data.train_batch_size×rollout.n={B}×{n}={B * n}: must be divisible by the {N} GPUs")
    if M is not None:
        errors += _mini_batch_rules(B, n, M, N, overrides)
    share = B * n // N if (B * n) % N == 0 else None
    forward = [
        k
        for k in (
            f"{AR}.rollout.log_prob_micro_batch_size_per_gpu",
            f"{AR}.ref.log_prob_micro_batch_size_per_gpu",
            "critic.forward_micro_batch_size_per_gpu",
        )
        if overrides.get(k) is not None
    ]
    dynamic = _get(overrides, f"{AR}.actor.use_dynamic_bsz") is True  # verl cuts by tokens, not these
    for key in [] if dynamic else forward:
        if share is not None and share % overrides[key]:
            errors.append(
                f"{key}={overrides[key]}: must divide the per-GPU share B×n/N={share} "
                f"(forward-only micro-batches)"
            )
    gen = overrides.get("data.gen_batch_size")
    if gen is not None and B % gen:
        errors.append(
            f"data.gen_batch_size={gen}: must divide data.train_batch_size={B} (whole generation "
            f"chunks per step)"
        )
    workers = _get(overrides, f"{AR}.rollout.agent.num_workers")
    if (B * n) % workers:
        errors.append(
            f"{AR}.rollout.agent.num_workers={workers}: must divide B×n={B * n} (the agent loop "
            f"splits a step's samples evenly)"
        )
    return errors


def _mini_batch_rules(B: int, n: int, M: int, N: int, overrides: Mapping[str, Any]) -> list[str]:
    key = f"{AR}.actor.ppo_mini_batch_size"
    errors = []
    if B < M:
        errors.append(f"{key}={M}: must be <= data.train_batch_size={B}")
    elif B % M:
        errors.append(f"{key}={M}: must divide data.train_batch_size={B} (whole mini-batches per step)")
    if (M * n) % N:
        errors.append(f"{key}×rollout.n={M}×{n}={M * n}: must be divisible by the {N} GPUs")
        return errors
    per_gpu = M * n // N
    if _get(overrides, f"{AR}.actor.use_dynamic_bsz") is True:  # micro-batches cut by tokens instead
        return errors
    for micro_key in (f"{AR}.actor.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu"):
        m = overrides.get(micro_key)
        if m is not None and per_gpu % m:
            errors.append(f"{micro_key}={m}: must divide the per-GPU mini batch M×n/N={per_gpu}")
    return errors
