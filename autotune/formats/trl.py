"""The TRL export (`--target trl`): which knob TRL 1.16's GRPOTrainer reads, and the trl_config.yaml it takes.

    fields = trl_fields(config)                  # TrlFields(grpo={...GRPOConfig}, peft={...ModelConfig})
    text = trl_config_text(config, gpus=2, model="Qwen/Qwen2.5-0.5B", device="cuda")
    trl grpo --config trl_config.yaml --dataset_name DATA --reward_funcs REWARD   # 1 GPU (see launch_line)

One table (ROUTES) says, for every knob of a configuration, the TRL field that carries it and where TRL reads
it, or why TRL has no field for it. The export writes exactly the fields of the routes that read; the tests
prove each with TRL's own objects (GRPOConfig after its checks, the GRPOTrainer built from it), and that
changing any other knob leaves the export unchanged.

Counting, as TRL counts: a generation round makes `generation_batch_size` completions over all processes
(autotune's train batch T); each optimizer step takes `per_device_train_batch_size` × accumulation steps ×
processes of them (the mini batch M); so one round feeds T/M optimizer steps, as a verl iteration does.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.config.knobs import ProbeConfig, mini_batch_size
from autotune.config.rules import Finding
from autotune.errors import UserError
from autotune.formats.target import Target
from autotune.formats.trl_read import fields, launch_options, parse_trl

__all__ = [
    "ROUTES",
    "TRL_KIND",
    "TRL_VERSION",
    "TrlFields",
    "launch_line",
    "looks_like_trl",
    "not_trl_knobs",
    "read_trl_config",
    "trl_config_text",
    "trl_fields",
    "trl_findings",
]

TRL_VERSION = "1.16.0"
# transformers 5.24+ renamed TrainingArguments.gradient_checkpointing to activation_checkpointing (the old
# name warns): the export writes the name of the parser autotune judges files with (trl_schema.json)
CHECKPOINTING = (
    "activation_checkpointing" if "activation_checkpointing" in fields() else "gradient_checkpointing"
)
# vLLM colocated in each training process (CUDA only), written when the configuration sets vLLM's share
VLLM_FIELDS = ("use_vllm", "vllm_mode", "vllm_gpu_memory_utilization")
TRL_KIND = "TRL config"  # Target.kind of a trl_config.yaml read back
GRPO_TRAINER = "trl/trainer/grpo_trainer.py"
GRPO_CONFIG = "trl/trainer/grpo_config.py"


@dataclass(frozen=True)
class Route:
    """One knob: the TRL fields that carry it (none: TRL has no such knob), and where TRL reads them."""

    knob: str
    fields: tuple[str, ...]
    where: str  # TRL's source that reads the field, or why there is none

    @property
    def reads(self) -> bool:
        return bool(self.fields)


ROUTES = (
    Route(
        "train_batch_size",
        ("generation_batch_size",),
        f"{GRPO_CONFIG} GRPOConfig.__post_init__ derives steps_per_generation from it; "
        f"{GRPO_TRAINER} get_train_dataloader loads that many completions' prompts per round",
    ),
    Route(
        "micro_batch_size",
        ("per_device_train_batch_size",),
        f"{GRPO_TRAINER} training_step's micro batch, and the chunk of the old and reference log-prob "
        f"passes (_generate_and_score_completions: batch_size = per_device_train_batch_size)",
    ),
    Route(
        "gradient_accumulation_steps",
        ("gradient_accumulation_steps",),
        "transformers Trainer: micro-steps per optimizer step (GRPOTrainer.training_step times them as one)",
    ),
    Route(
        "rollout_n",
        ("num_generations",),
        f"{GRPO_TRAINER} RepeatSampler: each prompt is repeated num_generations times, and rewards are "
        f"normalised within each group",
    ),
    Route(
        "max_response_length",
        ("max_completion_length",),
        f"{GRPO_TRAINER} _generate: max_new_tokens of the GenerationConfig",
    ),
    Route(
        "kl_coef",
        ("beta",),
        f"{GRPO_TRAINER} GRPOTrainer.__init__: a reference model is loaded only when beta != 0; "
        f"_compute_loss adds beta × KL",
    ),
    Route(
        "gradient_checkpointing",
        (CHECKPOINTING,),
        "transformers Trainer.train: activation checkpointing on the policy. TRL 1.16's GRPOConfig keeps "
        "`gradient_checkpointing` (default true), which transformers 5.24+ reads as a deprecated alias of "
        "`activation_checkpointing` with a FutureWarning: the export writes the current name",
    ),
    Route(
        "num_rollout_workers",
        ("dataloader_num_workers",),
        "transformers Trainer._get_dataloader: DataLoader workers of the prompt loader",
    ),
    Route("use_lora", ("use_peft",), "trl/scripts/grpo.py: get_peft_config(ModelConfig) → GRPOTrainer"),
    Route("lora_r", ("lora_r",), "trl/trainer/utils.py get_peft_config: LoraConfig(r=lora_r)"),
    Route("lora_alpha", ("lora_alpha",), "trl/trainer/utils.py get_peft_config: LoraConfig(lora_alpha=...)"),
    Route(
        "rollout_batch_size",
        (),
        "TRL generates each process's share of a round in one generate call: no chunk size to set",
    ),
    Route(
        "log_prob_micro_batch_size",
        (),
        "TRL's forward-only passes use per_device_train_batch_size: no separate micro batch",
    ),
    Route(
        "max_prompt_length",
        (),
        "TRL 1.16 has no prompt limit: the prompts' length is the data's",
    ),
    Route("algorithm", (), "GRPOTrainer trains GRPO only"),
    *(
        Route(name, (), "accelerate's FSDP or DeepSpeed config, not GRPOConfig: the TRL export runs DDP")
        for name in ("sharding", "param_offload", "optimizer_offload", "offload_policy")
    ),
    Route(
        "gpu_memory_utilization",
        VLLM_FIELDS,
        f"{GRPO_TRAINER} GRPOTrainer.__init__: use_vllm builds VLLMGeneration in vllm_mode 'colocate' "
        f"(vLLM in each training process, CUDA only) with gpu_memory_utilization="
        f"vllm_gpu_memory_utilization; unset: TRL's default, transformers' generate",
    ),
    Route(
        "tensor_model_parallel_size",
        (),
        "TRL's vllm_tensor_parallel_size (colocate): not searched by autotune; TRL's default 1 is written",
    ),
    Route(
        "max_num_seqs",
        (),
        "TRL sets vLLM's max_num_seqs itself: per_device_train_batch_size × tensor parallel × "
        "steps_per_generation",
    ),
    *(
        Route(name, (), "verl's dynamic batch size: TRL pads fixed micro batches")
        for name in ("use_dynamic_bsz", "ppo_max_token_len_per_gpu")
    ),
)
PEFT_FIELDS = ("use_peft", "lora_r", "lora_alpha")
ROUTE_OF = {route.knob: route for route in ROUTES}
# What TRL 1.16 offers beside the routes, and why autotune does not search it
NOT_SEARCHED = {
    "use_liger_kernel": (
        f"deprecated in {GRPO_TRAINER} (a FutureWarning; removed in TRL 2.0) and it patches the layers "
        f"only: GRPO's loss already takes its log-probs through TRL's own fused LM head, in tiles, without "
        f"the full logits (add_fused_lm_head); TRL 1.16 has no Liger GRPO loss field"
    ),
    "steps_per_generation": (
        "the same round as generation_batch_size (GRPOConfig refuses both at once): the export writes "
        "generation_batch_size, and check reads either"
    ),
}


@dataclass(frozen=True)
class TrlFields:
    """What the export writes: GRPOConfig's fields, and ModelConfig's LoRA fields (empty without LoRA)."""

    grpo: dict[str, Any]
    peft: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"grpo": self.grpo, "peft": self.peft}


def not_trl_knobs() -> tuple[str, ...]:
    """The configuration's knobs TRL has no field for."""
    return tuple(route.knob for route in ROUTES if not route.reads)


def trl_fields(config: ProbeConfig) -> TrlFields:
    """The field of every route that reads, with its knob's value (ROUTES is the one mapping); LoRA's fields
    only when LoRA is on. Each field counts per process or over all, as TRL does: no GPU count is needed."""
    values: dict[str, Any] = {}
    for route in ROUTES:
        if route.reads:
            values.update(_written(route, getattr(config, route.knob)))
    values["beta"] = float(values["beta"])  # a YAML `kl_coef: 0` is an int; GRPOConfig's beta is a float
    grpo = {name: value for name, value in values.items() if name not in PEFT_FIELDS}
    peft = {name: values[name] for name in PEFT_FIELDS} if config.use_lora else {}
    return TrlFields(grpo=grpo, peft=peft)


def _written(route: Route, value: Any) -> dict[str, Any]:
    """The fields a route writes for its knob's value: vLLM's three only when its share is set."""
    if route.fields != VLLM_FIELDS:
        return {route.fields[0]: value}
    if value is None:
        return {}
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": float(value)}


def trl_findings(config: ProbeConfig, gpus: int) -> list[Finding]:
    """What TRL's GRPOConfig would refuse, or what the TRL export cannot carry, each with its fix."""
    return [
        Finding("trl", problem, fix, key=key, value=getattr(config, key))
        for key, problem, fix in _trl_rules(config, gpus)
    ]


def _trl_rules(c: ProbeConfig, gpus: int) -> list[tuple[str, str, str]]:
    rules = []
    if c.algorithm != "grpo":
        rules.append(
            (
                "algorithm",
                f"algorithm={c.algorithm}: TRL's GRPOTrainer trains GRPO only (it has no critic to learn "
                f"PPO's values)",
                "algorithm: grpo with rollout_n >= 2, or --target verl for PPO",
            )
        )
    if c.rollout_n < 2:
        rules.append(
            (
                "rollout_n",
                f"rollout_n={c.rollout_n}: GRPO needs at least 2 completions per prompt",
                "rollout_n: 4",
            )
        )
    step = c.micro_batch_size * gpus
    if c.train_batch_size % step:
        rules.append(
            (
                "train_batch_size",
                f"train_batch_size={c.train_batch_size} (TRL's generation_batch_size) is not whole micro "
                f"batches of {c.micro_batch_size} on {gpus} process(es)",
                f"a multiple of {step}",
            )
        )
    elif c.train_batch_size % c.rollout_n:
        rules.append(
            (
                "train_batch_size",
                f"train_batch_size={c.train_batch_size} is not whole groups of rollout_n={c.rollout_n}",
                f"a multiple of {c.rollout_n}",
            )
        )
    if c.train_batch_size % mini_batch_size(c, gpus):
        rules.append(
            (
                "gradient_accumulation_steps",
                f"mini batch {mini_batch_size(c, gpus)} does not divide train_batch_size="
                f"{c.train_batch_size}: a generation round would end inside an optimizer step",
                "a mini batch that divides the train batch",
            )
        )
    rules += [
        (name, f"{name}={getattr(c, name)}: {ROUTE_OF[name].where}", f"{name}: {getattr(ProbeConfig, name)}")
        for name in ("sharding", "param_offload", "optimizer_offload", "offload_policy")
        if getattr(c, name) != getattr(ProbeConfig, name)
    ]
    return rules


def trl_config_text(
    config: ProbeConfig,
    gpus: int,
    model: str | None,
    device: str,
    measured: dict[str, Any] | None = None,
) -> str:
    """trl_config.yaml: the model, GRPOConfig's fields, LoRA's, and (measured on CPU) the CPU switches. A
    study's `measured` figures (best_config.yaml's block) go in the header, as comments TRL skips: one line
    for people, one JSON line `autotune check` reads back (MEASURED_LINE)."""
    fields = trl_fields(config)
    header = [
        f"# trl_config.yaml for TRL {TRL_VERSION}'s GRPOTrainer on {gpus} process(es), written by autotune.",
        "# The recipe (generation batch, mini batch, completions per prompt, completion length, beta, LoRA)",
        "# is the study's; the rest is what it measured fastest within the memory budget. Start it with:",
        f"#   {launch_line('trl_config.yaml', gpus)}",
        "# Prompts are not truncated by TRL 1.16: the study measured prompts of "
        f"{config.max_prompt_length} tokens.",
    ]
    if CHECKPOINTING == "activation_checkpointing":
        header.append(
            "# activation_checkpointing is transformers 5.24+'s name for gradient_checkpointing (which warns "
            "there); an older transformers knows only gradient_checkpointing."
        )
    if measured is not None:
        header += _measured_lines(measured, config.max_prompt_length)
    body: dict[str, Any] = {"model_name_or_path": model or "/path/to/model", **fields.grpo, **fields.peft}
    if device == "cpu":  # measured so: a CPU run in fp32; on a GPU leave TRL's defaults (bf16)
        body.update(use_cpu=True, bf16=False)
    return "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False)


MEASURED_LINE = "# autotune-measured: "  # then best_config.yaml's measured figures as one JSON object
MEASURED_KEYS = (
    "peak_memory_bytes",
    "device",
    "gpus",
    "gpu",
    "budget_gib",
    "headroom",
    "samples_per_sec",
    "study_name",
    "trial_number",
)


def _measured_lines(measured: dict[str, Any], prompt_tokens: int) -> list[str]:
    peak, budget = measured["peak_memory_bytes"] / 1024**3, measured.get("budget_gib")
    emulated = " (peak RSS; the budget is emulated on CPU)" if measured.get("device") == "cpu" else ""
    said = (
        f"# Measured by study {measured.get('study_name')} (trial #{measured.get('trial_number')}): "
        f"{measured.get('samples_per_sec')} samples/s, peak {peak:.3f} GiB per process on "
        f"{measured.get('gpu') or measured.get('device')}{emulated}, budget {budget} GiB less "
        f"{measured.get('headroom', 0):.0%} headroom."
    )
    block = {key: measured.get(key) for key in MEASURED_KEYS}
    block["prompt_tokens"] = prompt_tokens
    return [said, MEASURED_LINE + json.dumps(block)]


def measured_block(text: str) -> dict[str, Any] | None:
    """The study's figures a trl_config.yaml's header carries (None: a file autotune did not write)."""
    for line in text.splitlines():
        if line.startswith(MEASURED_LINE):
            with contextlib.suppress(ValueError):
                found = json.loads(line[len(MEASURED_LINE) :])
                return found if isinstance(found, dict) else None
    return None


def launch_line(path: str, gpus: int) -> str:
    """The command that starts TRL on the export; the dataset and reward are the user's own. Quoted for
    bash: a path with a space, a `$` or a `'` reaches TRL as one argument, as written."""
    rest = [
        "--config",
        path,
        "--dataset_name",
        "/path/to/dataset",
        "--reward_funcs",
        "your_module.your_reward",
    ]
    if gpus == 1:
        return shlex.join(["trl", "grpo", *rest])
    start = ["accelerate", "launch", "--multi_gpu", "--num_processes", str(gpus), "-m", "trl.scripts.grpo"]
    return shlex.join([*start, *rest])


def looks_like_trl(data: dict[str, Any]) -> bool:
    """A TRL config names its generations per prompt or its per-device batch (verl's and seed's do not)."""
    return "num_generations" in data or "per_device_train_batch_size" in data


FIELD_KNOB = {name: route.knob for route in ROUTES for name in route.fields}  # TRL field -> autotune knob
PROCESSES = re.compile(r"on (\d+) process\(es\)|--num_processes (\d+)")


def read_trl_config(data: dict[str, Any], path: Path, text: str, gpus: int | None = None) -> Target:
    """trl_config.yaml read back as TRL 1.16 reads it (autotune.formats.trl_read: "4" is 4; a field TRL
    lacks, a value its parser or GRPOConfig refuses, is a UserError in TRL's words), on `gpus` processes
    (default: the file's accelerate `num_processes`, else its header's, else 1)."""
    values = parse_trl(data, where=str(path))
    processes = gpus or _processes(data, text, str(path))
    read = {knob: values[name] for name, knob in FIELD_KNOB.items() if name not in VLLM_FIELDS}
    read["gradient_checkpointing"] = values["activation_checkpointing"]  # the alias, resolved by TRL
    colocated = values["use_vllm"] and values["vllm_mode"] == "colocate"
    read["gpu_memory_utilization"] = values["vllm_gpu_memory_utilization"] if colocated else None
    if "generation_batch_size" not in data:  # GRPOConfig derives it on the processes that run it
        read["train_batch_size"] = (
            values["per_device_train_batch_size"] * processes * values["steps_per_generation"]
        )
    if read["max_response_length"] is None:
        raise UserError(
            f"config '{path}': max_completion_length=None: autotune prices completions of a known length; "
            f"set the longest completion TRL may generate"
        )
    # TRL generates a process's share of a round in one call: the memory model's rollout batch is the round
    read["rollout_batch_size"] = read["train_batch_size"]
    prompt = _prompt_tokens(text)
    read["max_prompt_length"] = prompt or ProbeConfig.max_prompt_length
    read["use_lora"] = bool(read["use_lora"])
    try:
        config = ProbeConfig(algorithm="grpo", **read)
    except (TypeError, ValueError) as exc:
        raise UserError(f"config '{path}': {exc}") from None
    launch = [name for name in data if name in launch_options() and name not in fields()]
    findings = [] if prompt else [_prompt_note(config.max_prompt_length)]
    findings += [
        Finding(
            "schema",
            f"{name}: an accelerate launch option: `trl grpo` hands it to accelerate launch",
            "keep it, or pass it to accelerate launch",
            severity="note",
            key=name,
        )
        for name in launch
    ]
    return Target(
        kind=TRL_KIND,
        config=config,
        model=values.get("model_name_or_path"),
        sharding="none",
        sharding_label="replicated (DDP, one process per GPU)",
        gpus=processes,
        findings=findings + trl_findings(config, processes),
        device="cpu" if values["use_cpu"] else None,
        prompt_known=prompt is not None,
    )


def _prompt_tokens(text: str) -> int | None:
    """The prompts' tokens the study measured (its header's figures); None for a file autotune did not
    write: TRL 1.16 has no prompt limit, so the file cannot say."""
    tokens = (measured_block(text) or {}).get("prompt_tokens")
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else None


def _prompt_note(assumed: int) -> Finding:
    return Finding(
        "lengths",
        f"prompt length not known: TRL 1.16 does not truncate prompts and the file cannot say their length; "
        f"memory is judged at {assumed} prompt tokens",
        "pass --data DATA (your prompts) to judge memory at their length",
        severity="note",
        key="max_prompt_length",
    )


def _processes(data: dict[str, Any], text: str, where: str) -> int:
    count = data.get("num_processes")
    if count is not None:
        if isinstance(count, str) and count.strip().isdigit():
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise UserError(
                f"config '{where}': num_processes={count!r}: accelerate wants a whole number >= 1"
            )
        return count
    found = PROCESSES.search(text)
    return int(next(g for g in found.groups() if g)) if found else 1
