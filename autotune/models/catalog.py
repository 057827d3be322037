"""Model registry: known architectures by name, or a local Hugging Face model directory.

A registry name (`llama-2-7b`, `qwen2.5-0.5b`, ...) is the published `config.json` of that model, shipped in
`autotune/models/configs/`: the architecture only, no weights. The probe builds it with random weights —
memory and speed do not depend on the values of the weights — and nothing is ever downloaded. A local
directory is read with `local_files_only=True`; it may hold real weights (`weights="pretrained"`) and its own
tokenizer (see `autotune.models.tokenizer`).

    spec = resolve_model("qwen2.5-0.5b")
    actor = build_causal_lm(spec, dtype=torch.bfloat16, device="cuda")
    critic = build_critic(spec, dtype=torch.bfloat16, device="cuda")        # logits [b, s, 1]
    reward = build_reward_model(resolve_reward_model("deberta-v3-large"), torch.bfloat16, "cuda")
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import hashlib
import importlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.utils import logging as transformers_logging

from autotune.config.numbers import number_problem
from autotune.errors import UserError
from autotune.models.names import MODELS

__all__ = [
    "REWARD_FUNCTION",
    "ModelSpec",
    "build_causal_lm",
    "build_critic",
    "build_reward_model",
    "causal_lm_config",
    "check_architecture",
    "count_parameters",
    "critic_config",
    "init_random_",
    "registry_config",
    "resolve_model",
    "resolve_reward_model",
    "reward_config",
    "to_dtype",
    "weight_files",
]

CONFIG_DIR = Path(__file__).resolve().parent / "configs"

REWARD_FUNCTION = "function"  # rule-based reward: no reward model
WEIGHTS = ("random", "pretrained")
AUTO_CLASSES: dict[str, Any] = {  # model kind -> transformers auto class
    "causal_lm": AutoModelForCausalLM,
    "critic": AutoModelForTokenClassification,
    "reward": AutoModelForSequenceClassification,
}
KINDS = tuple(AUTO_CLASSES)
WEIGHT_PATTERNS = ("*.safetensors", "*.bin")
NOT_WEIGHTS = {"training_args.bin", "optimizer.bin", "scheduler.bin", "rng_state.bin"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model: its architecture, where it comes from, and which weights to build it with."""

    name: str
    config: PretrainedConfig
    source: str  # "registry" | "local"
    path: Path | None = None  # the local directory (source == "local")
    weights: str = "random"  # "random" | "pretrained"
    tokenizer_path: Path | None = None  # a local directory with tokenizer files, when it has them
    trust_remote_code: bool = False


# ---------------------------------------------------------------------------------------------- resolving


def _config_dict(name: str) -> dict[str, Any]:
    with open(CONFIG_DIR / f"{name}.json", encoding="utf-8") as f:
        return json.load(f)


def registry_config(name: str) -> PretrainedConfig:
    """A fresh config object for a registry name (callers may modify it)."""
    data = dict(_config_dict(name))
    return AutoConfig.for_model(data.pop("model_type"), **data)


def resolve_model(ref: str, weights: str = "random", trust_remote_code: bool = False) -> ModelSpec:
    """A registry name, or a local Hugging Face model directory (read offline).

    An exact registry name wins over a directory of that name in the working directory (write `./name`).
    """
    if weights not in WEIGHTS:
        raise UserError(f"unknown weights {weights!r}: use one of {', '.join(WEIGHTS)}")
    ref = str(ref)
    if ref in MODELS:
        return _registry_spec(ref, weights)
    path = Path(ref).expanduser()
    if path.exists():
        return _local_spec(path, weights, trust_remote_code)
    if ref.lower() in MODELS:
        return _registry_spec(ref.lower(), weights)
    raise UserError(_unknown_model_message(ref))


def resolve_reward_model(
    ref: str, weights: str = "random", trust_remote_code: bool = False
) -> ModelSpec | None:
    """The reward model, or None for `REWARD_FUNCTION` (a rule-based reward, no model)."""
    if str(ref).strip().lower() == REWARD_FUNCTION:
        return None
    return resolve_model(ref, weights=weights, trust_remote_code=trust_remote_code)


def _registry_spec(name: str, weights: str) -> ModelSpec:
    if weights == "pretrained":
        raise UserError(
            f"model {name!r} is a registry name: it ships an architecture, not weights (nothing is "
            f"downloaded): use random weights, or a local Hugging Face model directory that holds the weights"
        )
    return ModelSpec(name=name, config=registry_config(name), source="registry", weights="random")


def _local_spec(path: Path, weights: str, trust_remote_code: bool) -> ModelSpec:
    path = path.resolve()
    if not path.is_dir():
        raise UserError(f"model path '{path}' is a file: pass the directory that holds its config.json")
    if not (path / "config.json").is_file():
        hint = (
            "it holds a PEFT adapter, not a model: pass the base model's directory"
            if (path / "adapter_config.json").is_file()
            else "pass a Hugging Face model directory (config.json, weights, tokenizer files)"
        )
        raise UserError(f"model directory '{path}' has no config.json: {hint}")
    if weights == "pretrained" and not weight_files(path):
        raise UserError(
            f"model directory '{path}' has no *.safetensors or *.bin weights: add them, or use random weights"
        )
    config = _load_local_config(path, trust_remote_code)
    check_architecture(config, f"'{path / 'config.json'}'")
    tokenizer_path = path if any((path / f).is_file() for f in TOKENIZER_FILES) else None
    return ModelSpec(
        name=path.name,
        config=config,
        source="local",
        path=path,
        weights=weights,
        tokenizer_path=tokenizer_path,
        trust_remote_code=trust_remote_code,
    )


def _load_local_config(path: Path, trust_remote_code: bool) -> PretrainedConfig:
    """The directory's config.json; anything transformers refuses in it (a file it cannot parse, a field of
    the wrong type, an inconsistent architecture) is the user's to fix: one line."""
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # its warnings about the file would precede our one line
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as exc:
        reason = " ".join(str(exc).split())[:200]
        custom = any(word in reason for word in ("trust_remote_code", "Unrecognized model", "model_type"))
        hint = (
            " (a model with custom code needs --trust-remote-code)"
            if custom and not trust_remote_code
            else ""
        )
        raise UserError(f"cannot read '{path / 'config.json'}': {reason}{hint}") from exc
    finally:
        transformers_logging.set_verbosity(verbosity)


# Sizes every architecture autotune builds must have, as positive whole numbers; optional ones when present.
REQUIRED_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
OPTIONAL_SIZES = ("intermediate_size", "num_key_value_heads", "head_dim", "max_position_embeddings")


def check_architecture(config: PretrainedConfig, where: str) -> None:
    """Refuse, in one line, a configuration that no model can be built from (before any memory arithmetic
    divides by it): sizes that are not positive whole numbers, heads that do not split the hidden size."""
    problems = []
    for key in (*REQUIRED_SIZES, *OPTIONAL_SIZES):
        value = getattr(config, key, None)
        if value is None and key in OPTIONAL_SIZES:
            continue
        problem = number_problem(value, integer=True, minimum=1)
        if problem:
            problems.append(f"{key}={value!r}: {problem}")
    if not problems:
        hidden, heads = config.hidden_size, config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        if getattr(config, "head_dim", None) is None and hidden % heads:
            problems.append(f"num_attention_heads={heads} does not divide hidden_size={hidden}")
        if heads % kv_heads:
            problems.append(f"num_key_value_heads={kv_heads} does not divide num_attention_heads={heads}")
    if problems:
        raise UserError(f"model config {where}: " + "; ".join(problems) + "; fix the model's config.json")


# Keys of a config that do not change the model built from it (versions, paths, the stored dtype: the probe
# chooses its own dtypes).
NOT_ARCHITECTURE = {"transformers_version", "_name_or_path", "_commit_hash", "torch_dtype", "dtype"}


def fingerprint(spec: ModelSpec) -> str:
    """What a study measured, not where it came from: a hash of the architecture (config.json's content
    less NOT_ARCHITECTURE) and of the weights used (random, or the local files' names and sizes)."""
    config = {k: v for k, v in spec.config.to_dict().items() if k not in NOT_ARCHITECTURE}
    weights = spec.weights
    if spec.weights == "pretrained" and spec.path is not None:
        weights += ":" + ",".join(f"{p.name}={p.stat().st_size}" for p in weight_files(spec.path))
    text = json.dumps({"config": config, "weights": weights}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def weight_files(path: Path) -> list[Path]:
    """The weight files of a local model directory (safetensors or PyTorch .bin shards)."""
    found = {p for pattern in WEIGHT_PATTERNS for p in path.glob(pattern) if p.name not in NOT_WEIGHTS}
    return sorted(found)


def _unknown_model_message(ref: str) -> str:
    names = ", ".join(MODELS)
    if "/" in ref or "\\" in ref or ref.startswith((".", "~")):
        return (
            f"model directory '{ref}' does not exist (nothing is downloaded from a model hub): "
            f"use one of {names} or a local Hugging Face model directory"
        )
    close = difflib.get_close_matches(ref.lower(), list(MODELS), n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown model {ref!r}{guess}: use one of {names} or a local Hugging Face model directory"


# ---------------------------------------------------------------------------------------------- building


def to_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """torch.bfloat16 from torch.bfloat16, "bfloat16", "bf16", "torch.bfloat16"."""
    if isinstance(dtype, torch.dtype):
        return dtype
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}
    name = str(dtype).removeprefix("torch.").lower()
    value = getattr(torch, aliases.get(name, name), None)
    if not isinstance(value, torch.dtype):
        raise UserError(f"unknown dtype {dtype!r}: use bfloat16, float16 or float32")
    return value


def causal_lm_config(spec: ModelSpec) -> PretrainedConfig:
    config = copy.deepcopy(spec.config)
    config.use_cache = True  # generation needs the KV cache
    return config


def critic_config(spec: ModelSpec) -> PretrainedConfig:
    """The actor's architecture with a one-output token head, as verl's critic."""
    config = copy.deepcopy(spec.config)
    config.num_labels = 1
    config.classifier_dropout = 0.0  # verl sets it too; transformers' default head dropout is 0.1
    config.use_cache = False
    return config


def reward_config(spec: ModelSpec, pad_token_id: int | None = None) -> PretrainedConfig:
    """A one-output sequence classifier; it needs a pad id to find each sequence's last token."""
    config = copy.deepcopy(spec.config)
    config.num_labels = 1
    if getattr(config, "pad_token_id", None) is None:
        eos = getattr(config, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, list) else eos
        config.pad_token_id = next(v for v in (pad_token_id, eos, 0) if v is not None)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    return config


def build_causal_lm(
    spec: ModelSpec, dtype: torch.dtype | str = torch.bfloat16, device: torch.device | str = "cpu"
) -> PreTrainedModel:
    """The actor (or reference) model on `device` in `dtype`."""
    return _build(AUTO_CLASSES["causal_lm"], spec, causal_lm_config(spec), dtype, device)


def build_critic(
    spec: ModelSpec, dtype: torch.dtype | str = torch.bfloat16, device: torch.device | str = "cpu"
) -> PreTrainedModel:
    """The critic: the actor architecture with a value head (`*ForTokenClassification`, logits [b, s, 1])."""
    return _build(AUTO_CLASSES["critic"], spec, critic_config(spec), dtype, device)


def build_reward_model(
    spec: ModelSpec,
    dtype: torch.dtype | str = torch.bfloat16,
    device: torch.device | str = "cpu",
    pad_token_id: int | None = None,
) -> PreTrainedModel:
    """The reward model (`...ForSequenceClassification`, logits [b, 1]); `pad_token_id` if it has none."""
    return _build(AUTO_CLASSES["reward"], spec, reward_config(spec, pad_token_id), dtype, device)


def _build(
    auto_class: Any,
    spec: ModelSpec,
    config: PretrainedConfig,
    dtype: torch.dtype | str,
    device: torch.device | str,
) -> PreTrainedModel:
    dtype = to_dtype(dtype)
    if spec.weights == "pretrained":
        return auto_class.from_pretrained(
            spec.path,
            config=config,
            dtype=dtype,
            device_map={"": torch.device(device)},
            local_files_only=True,
            trust_remote_code=spec.trust_remote_code,
        )
    # Random weights, allocated directly on the device in the target dtype. transformers' own initialisation
    # (per-module `_init_weights`) takes ~10 s for a 0.5B model on two CPU cores; skipping it and filling the
    # tensors ourselves takes ~2 s on CPU and is instant on a GPU.
    with torch.device(device), _skip_init():
        model = auto_class.from_config(config, dtype=dtype, trust_remote_code=spec.trust_remote_code)
    if any(p.dtype != dtype for p in model.parameters()):
        # transformers 5.10 (verl 0.9.1's environment) builds a *ForTokenClassification body in the config's
        # torch_dtype (fp16 for Llama-2) and only its head in `dtype`: FSDP then refuses the mix
        model.to(dtype)
    model.tie_weights()  # skipping init_weights also skipped the tying of input/output embeddings
    init_random_(model, std=getattr(config, "initializer_range", 0.02))
    return model


@contextlib.contextmanager
def _skip_init() -> Iterator[None]:
    try:  # transformers >= 5
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x (where 5.x's types do not have it)
        no_init_weights = importlib.import_module("transformers.modeling_utils").no_init_weights
    with no_init_weights():
        yield


@torch.no_grad()
def init_random_(model: torch.nn.Module, std: float = 0.02) -> None:
    """Fill uninitialised parameters: matrices ~ U(±std·√3) (std as HF's normal init), biases 0, norms 1."""
    bound = std * math.sqrt(3.0)
    for name, param in model.named_parameters():
        if param.ndim >= 2:
            param.uniform_(-bound, bound)  # twice as fast as normal_ on CPU, same std
        elif name.endswith("bias"):
            param.zero_()
        else:
            param.fill_(1.0)  # LayerNorm / RMSNorm scales


# ---------------------------------------------------------------------------------------------- counting


_PARAMETER_COUNTS: dict[tuple[str, str], int] = {}  # (config JSON, kind) -> count, per process


def count_parameters(spec: ModelSpec, kind: str = "causal_lm") -> int:
    """The exact parameter count (tied weights once), from an instance on the `meta` device (no memory)."""
    if kind not in KINDS:
        raise UserError(f"unknown model kind {kind!r}: use one of {', '.join(KINDS)}")
    config = {"causal_lm": causal_lm_config, "critic": critic_config, "reward": reward_config}[kind](spec)
    key = (config.to_json_string(use_diff=False), kind)
    if key not in _PARAMETER_COUNTS:
        with torch.device("meta"):
            model = AUTO_CLASSES[kind].from_config(config, trust_remote_code=spec.trust_remote_code)
        _PARAMETER_COUNTS[key] = sum(p.numel() for p in model.parameters())
    return _PARAMETER_COUNTS[key]
