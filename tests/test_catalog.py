"""The model registry: shipped configs, local directories, user errors, model builds and parameter counts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, LlamaConfig

from autotune.errors import UserError
from autotune.models import catalog
from autotune.models.catalog import (
    REWARD_FUNCTION,
    ModelSpec,
    build_causal_lm,
    build_critic,
    build_reward_model,
    count_parameters,
    resolve_model,
    resolve_reward_model,
)
from autotune.models.listing import model_rows

# Published parameter counts (model cards / papers), for the 2% check.
PUBLISHED = {
    "llama-2-7b": 6.74e9,
    "llama-2-13b": 13.0e9,
    "tinyllama-1.1b": 1.10e9,
    "qwen2.5-0.5b": 0.49e9,
    "qwen2.5-1.5b": 1.54e9,
    "qwen2.5-7b": 7.61e9,
    "deberta-v3-large": 435e6,
}


def tiny_llama_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=1000,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    path = tmp_path / "my-model"
    tiny_llama_config().save_pretrained(path)
    return path


def assert_one_line(exc: pytest.ExceptionInfo, *parts: str) -> None:
    message = str(exc.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, message


# ---------------------------------------------------------------------------------------------- configs


def test_shipped_configs_are_the_registry() -> None:
    shipped = {p.stem for p in catalog.CONFIG_DIR.glob("*.json")}
    assert shipped == set(catalog.MODELS)


@pytest.mark.parametrize("name", list(catalog.MODELS))
def test_every_name_resolves(name: str) -> None:
    spec = resolve_model(name)
    assert (spec.name, spec.source, spec.weights, spec.path, spec.tokenizer_path) == (
        name,
        "registry",
        "random",
        None,
        None,
    )
    data = json.loads((catalog.CONFIG_DIR / f"{name}.json").read_text())
    model_type = data.pop("model_type")
    assert type(AutoConfig.for_model(model_type, **data)) is type(spec.config)
    assert spec.config.architectures == data["architectures"]


def test_registry_configs_are_fresh_copies() -> None:
    resolve_model("tiny-llama").config.num_labels = 7
    assert resolve_model("tiny-llama").config.num_labels != 7


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_counts_match_published(name: str) -> None:
    kind = "reward" if catalog.MODELS[name][0] == "reward" else "causal_lm"
    count = count_parameters(resolve_model(name), kind)
    assert count == pytest.approx(PUBLISHED[name], rel=0.02)


def test_model_rows_and_timing() -> None:
    start = time.perf_counter()
    rows = model_rows()
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"model_rows took {elapsed:.1f} s"  # ~0.3 s measured; generous for slow CI
    assert [row["name"] for row in rows] == list(catalog.MODELS)
    by_name = {row["name"]: row for row in rows}
    assert by_name["llama-2-7b"] | {"source": None} == {
        "name": "llama-2-7b",
        "role": "actor",
        "architecture": "LlamaForCausalLM",
        "parameters": 6_738_415_616,
        "layers": 32,
        "hidden": 4096,
        "vocab": 32000,
        "source": None,
    }
    assert by_name["deberta-v3-large"]["role"] == "reward"
    assert {by_name[n]["role"] for n in ("tiny-llama", "tiny-qwen2", "tiny-deberta")} == {"test"}
    rows[0]["name"] = "changed"
    assert model_rows()[0]["name"] == "llama-2-7b"


def test_count_parameters_is_exact_for_every_kind() -> None:
    spec = resolve_model("tiny-llama")
    builders = {"causal_lm": build_causal_lm, "critic": build_critic, "reward": build_reward_model}
    for kind, build in builders.items():
        model = build(spec, torch.float32, "cpu")
        assert count_parameters(spec, kind) == sum(p.numel() for p in model.parameters()), kind
    with pytest.raises(UserError) as exc:
        count_parameters(spec, "value")
    assert_one_line(exc, "'value'", "causal_lm")


# ---------------------------------------------------------------------------------------------- resolving


def test_local_directory_resolves(config_dir: Path) -> None:
    spec = resolve_model(str(config_dir))
    assert (spec.name, spec.source, spec.path, spec.weights) == ("my-model", "local", config_dir, "random")
    assert spec.config.hidden_size == 32
    assert spec.tokenizer_path is None


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(UserError) as exc:
        resolve_model("llama-3")
    assert_one_line(exc, "unknown model 'llama-3'", "tinyllama-1.1b", "qwen2.5-7b", "local Hugging Face")


def test_near_miss_suggests_a_name() -> None:
    with pytest.raises(UserError) as exc:
        resolve_model("qwen2.5-05b")
    assert_one_line(exc, "did you mean 'qwen2.5-0.5b'?")
    assert resolve_model("Llama-2-7B").name == "llama-2-7b"  # case does not matter


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(UserError) as exc:
        resolve_model(str(tmp_path / "nope"))
    assert_one_line(exc, "does not exist", "nothing is downloaded")
    with pytest.raises(UserError) as exc:
        resolve_model("meta-llama/Llama-2-7b-hf")  # a hub id is not fetched
    assert_one_line(exc, "'meta-llama/Llama-2-7b-hf' does not exist")


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(UserError) as exc:
        resolve_model(str(tmp_path))
    assert_one_line(exc, str(tmp_path), "no config.json")
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(UserError) as exc:
        resolve_model(str(tmp_path))
    assert_one_line(exc, "PEFT adapter")
    with pytest.raises(UserError) as exc:
        resolve_model(str(tmp_path / "adapter_config.json"))
    assert_one_line(exc, "is a file")


def test_unreadable_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(UserError) as exc:
        resolve_model(str(tmp_path))
    assert_one_line(exc, "cannot read", "config.json")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"vocab_size": 0}, "vocab_size=0: must be a whole number >= 1"),
        ({"hidden_size": "64"}, "hidden_size"),
        ({"num_attention_heads": 3}, "not a multiple of the number of attention heads"),
        ({"num_hidden_layers": -2}, "num_hidden_layers=-2: must be a whole number >= 1"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ],
)
def test_a_malformed_model_config_is_refused_in_one_line(tmp_path: Path, change: dict, said: str) -> None:
    """Before any memory arithmetic divides by it (a vocabulary of 0 was a ZeroDivisionError)."""
    data = {**json.loads((catalog.CONFIG_DIR / "tiny-llama.json").read_text()), **change}
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(UserError) as exc:
        resolve_model(str(tmp_path))
    assert_one_line(exc, str(tmp_path), said)


def test_pretrained_needs_weights(config_dir: Path) -> None:
    with pytest.raises(UserError) as exc:
        resolve_model(str(config_dir), weights="pretrained")
    assert_one_line(exc, str(config_dir), "no *.safetensors or *.bin weights")
    with pytest.raises(UserError) as exc:
        resolve_model("llama-2-7b", weights="pretrained")
    assert_one_line(exc, "'llama-2-7b'", "nothing is downloaded", "local Hugging Face model directory")
    with pytest.raises(UserError) as exc:
        resolve_model("tiny-llama", weights="real")
    assert_one_line(exc, "'real'", "random, pretrained")


def test_pretrained_weights_are_loaded(tmp_path: Path) -> None:
    spec = resolve_model("tiny-llama")
    saved = build_causal_lm(spec, torch.float32, "cpu")
    saved.save_pretrained(tmp_path)
    local = resolve_model(str(tmp_path), weights="pretrained")
    assert catalog.weight_files(tmp_path) and local.weights == "pretrained"
    loaded = build_causal_lm(local, torch.float32, "cpu")
    assert torch.equal(loaded.model.embed_tokens.weight, saved.model.embed_tokens.weight)
    assert loaded.config.use_cache is True


def test_reward_model_resolution() -> None:
    assert resolve_reward_model(REWARD_FUNCTION) is None
    spec = resolve_reward_model("tiny-deberta")
    assert isinstance(spec, ModelSpec)
    assert spec.config.architectures == ["DebertaV2ForSequenceClassification"]


# ---------------------------------------------------------------------------------------------- building


def test_builds_on_tiny_llama() -> None:
    spec = resolve_model("tiny-llama")
    ids = torch.randint(0, spec.config.vocab_size, (2, 5))
    actor = build_causal_lm(spec, torch.float32, "cpu")
    critic = build_critic(spec, "float32", "cpu")
    reward = build_reward_model(spec, torch.float32, "cpu")
    with torch.no_grad():
        assert actor(input_ids=ids).logits.shape == (2, 5, 32000)
        values = critic(input_ids=ids).logits
        scores = reward(input_ids=ids).logits
    assert values.shape == (2, 5, 1) and torch.isfinite(values).all()
    assert scores.shape == (2, 1)
    assert actor.config.use_cache is True
    assert reward.config.pad_token_id is not None
    assert spec.config.num_labels == 2  # the spec's config is not modified by the builds


def test_random_init_is_sane() -> None:
    actor = build_causal_lm(resolve_model("tiny-qwen2"), "bf16", "cpu")
    assert actor.dtype == torch.bfloat16
    assert actor.lm_head.weight is actor.model.embed_tokens.weight  # Qwen2 ties them
    assert torch.equal(actor.model.norm.weight, torch.ones_like(actor.model.norm.weight))
    assert torch.equal(actor.model.layers[0].self_attn.q_proj.bias, torch.zeros(64, dtype=torch.bfloat16))
    weight = actor.model.layers[0].mlp.up_proj.weight.float()
    assert 0.015 < weight.std().item() < 0.025 and torch.isfinite(weight).all()
    prompt = torch.randint(0, 1000, (2, 4))
    out = actor.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=True, pad_token_id=0)
    assert out.shape == (2, 7)


def test_reward_model_on_tiny_deberta() -> None:
    reward = build_reward_model(resolve_reward_model("tiny-deberta"), torch.float32, "cpu")
    ids = torch.randint(0, 1000, (3, 7))
    with torch.no_grad():
        scores = reward(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert scores.shape == (3, 1) and torch.isfinite(scores).all()
    layer_norm = reward.deberta.embeddings.LayerNorm
    assert torch.equal(layer_norm.weight, torch.ones_like(layer_norm.weight))


def test_reward_pad_token_id_when_missing() -> None:
    spec = resolve_model("tiny-llama")
    assert spec.config.pad_token_id is None
    assert catalog.reward_config(spec, pad_token_id=5).pad_token_id == 5
    assert catalog.reward_config(spec).pad_token_id == spec.config.eos_token_id


def test_dtype_names() -> None:
    assert catalog.to_dtype("bf16") is torch.bfloat16
    assert catalog.to_dtype("torch.float16") is torch.float16
    with pytest.raises(UserError) as exc:
        catalog.to_dtype("float8")
    assert_one_line(exc, "'float8'", "bfloat16")


@pytest.mark.parametrize("name", list(catalog.MODELS))
def test_shipped_parameter_counts_are_current(name: str) -> None:
    """`autotune models` reads the counts from a table (no torch): each must be the exact count of the config
    file as it is now (else the list falls back to counting, slowly)."""
    from autotune.models.listing import PARAMETERS, config_hash

    role = catalog.MODELS[name][0]
    kind = "reward" if role == "reward" or name.endswith("deberta") else "causal_lm"
    assert PARAMETERS[name] == (config_hash(name), count_parameters(resolve_model(name), kind))
