"""Model names: the registry's names, their Hugging Face ids, and the way back (no torch import here).

model_name_or_path("llama-2-7b")                  # "meta-llama/Llama-2-7b-hf" (the seed schema's key)
registry_name("meta-llama/Llama-2-13b-chat-hf")   # "llama-2-13b" (check reads the article's configs)
verl_model_path("tiny-llama")                     # None: a test model verl cannot load
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["MODELS", "model_name_or_path", "registry_name", "verl_model_path"]

# name -> (role, where the config comes from). Roles: "actor" (policy/critic/reference), "reward" (reward
# model), "test" (tiny models for CPU tests: 2 layers, width 64, as torchtune's recipe tests).
# - tiny-llama keeps Llama's 32,000-token vocabulary, so its logits (s·b·V) weigh as much as in real runs.
# - tiny-qwen2 keeps Qwen2's real 151,936-token vocabulary, by the same rule: its logits cost per token what
#   they cost in every Qwen2/2.5 model (the large-vocabulary regime of RL log-prob passes), and
#   the two tiny models differ 4.75x in V, so a memory model calibrated on both can separate the logits term.
#   Price, measured on two CPU cores: forward+backward over 8x48 tokens 0.5-1 s (tiny-llama: 0.13 s),
#   sampling 16 tokens for 8 prompts 0.6 s (0.18 s). Tests that only need some causal LM use tiny-llama.
#   Otherwise Qwen2 as published: GQA (4 heads, 2 KV heads), q/k/v biases, tied embeddings, rope_theta 1e6.
# - small-llama (35M parameters, width 384, 6 layers): a small model whose training states outweigh the
#   Python+torch process on CPU, so what sharding saves shows in a probe's peak RSS (tests, bench/sharding).
# - tiny-deberta keeps DeBERTa-v3's 128,100-token vocabulary (an embedding only: no logits over it).
MODELS: dict[str, tuple[str, str]] = {
    "llama-2-7b": ("actor", "meta-llama/Llama-2-7b-hf"),
    "llama-2-13b": ("actor", "meta-llama/Llama-2-13b-hf"),
    "tinyllama-1.1b": ("actor", "TinyLlama/TinyLlama-1.1B-Chat-v1.0"),
    "qwen2.5-0.5b": ("actor", "Qwen/Qwen2.5-0.5B"),
    "qwen2.5-1.5b": ("actor", "Qwen/Qwen2.5-1.5B"),
    "qwen2.5-3b": ("actor", "Qwen/Qwen2.5-3B"),
    "qwen2.5-7b": ("actor", "Qwen/Qwen2.5-7B"),
    "qwen2.5-32b": ("actor", "Qwen/Qwen2.5-32B"),
    "qwen2.5-72b": ("actor", "Qwen/Qwen2.5-72B"),
    "qwen2-7b": ("actor", "Qwen/Qwen2-7B"),
    "qwen2-72b": ("actor", "Qwen/Qwen2-72B"),
    "deepseek-llm-7b": ("actor", "deepseek-ai/deepseek-llm-7b-base"),
    "deberta-v3-large": ("reward", "OpenAssistant/reward-model-deberta-v3-large"),
    "tiny-llama": ("test", "autotune test model (Llama architecture)"),
    "tiny-qwen2": ("test", "autotune test model (Qwen2 architecture)"),
    "small-llama": ("test", "autotune test model whose states dominate (Llama architecture)"),
    "tiny-deberta": ("test", "autotune test model (DeBERTa-v2 reward model)"),
}

# Hugging Face ids (the article's model_name_or_path) -> registry names; org prefix and suffixes ignored
HF_PATTERNS = (
    (r"^llama-2-(7b|13b)", "llama-2-{}"),
    (r"^tinyllama", "tinyllama-1.1b"),
    (r"^qwen2\.5-(\d+(?:\.\d+)?b)", "qwen2.5-{}"),
    (r"^qwen2-(7b|72b)", "qwen2-{}"),
    (r"^deepseek-llm-(7b)", "deepseek-llm-{}"),
    (r"deberta-v3-large", "deberta-v3-large"),
)
UNKNOWN = "unknown"


def model_name_or_path(name: str) -> str:
    """The Hugging Face id of a registry model (the seed's `model_name_or_path`), else the name or path."""
    if Path(name).exists() or name == UNKNOWN:
        return name
    role, source = MODELS.get(name, ("", name))
    return name if role in ("test", "") else source


def verl_model_path(name: str) -> str | None:
    """A path verl can load (hub id or local directory); None for autotune's own test models."""
    path = model_name_or_path(name)
    return None if path in (name, UNKNOWN) and not Path(name).exists() else path


def registry_name(ref: str | None) -> str | None:
    """The registry name of a model reference: a registry name, a local directory, or a known HF id."""
    if not ref:
        return None
    if ref in MODELS or Path(ref).expanduser().exists():
        return ref
    for name, (_, source) in MODELS.items():
        if source.lower() == ref.lower():
            return name
    tail = ref.lower().rsplit("/", 1)[-1]
    for pattern, template in HF_PATTERNS:
        match = re.search(pattern, tail)
        if match:
            name = template.format(*match.groups())
            return name if name in MODELS else None
    return None
