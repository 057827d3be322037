"""The offline tokenizers: the project BPE for registry names, a local directory's own when it has one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, PreTrainedTokenizerFast

from autotune.errors import UserError
from autotune.models import catalog, tokenizer
from autotune.models.catalog import resolve_model
from autotune.models.tokenizer import load_project_tokenizer, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
TEXTS = [
    "Hello, world!",
    "Proximal Policy Optimization clips the probability ratio to [0.8, 1.2].",
    "  leading spaces, tabs\tand\nnew lines\n\n",
    "numbers 3.14159 and 1,000,000; code: def f(x):\n    return x ** 2",
    "accents: naïve café, Größe; CJK: 強化学習; emoji: 🤖",
    "",
]


def test_shipped_file_is_small_and_described() -> None:
    assert tokenizer.PROJECT_TOKENIZER_FILE.stat().st_size < 1.5e6
    info = json.loads(tokenizer.PROJECT_TOKENIZER_META.read_text(encoding="utf-8"))
    assert 16_000 <= info["vocab_size"] <= 32_000
    assert info["vocab_size"] == len(load_project_tokenizer())
    assert "standard library" in info["corpus"]


def test_special_tokens() -> None:
    tok = load_project_tokenizer()
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    ids = tok("a short prompt")["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.eos_token_id not in ids
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [3, 4]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(text: str) -> None:
    tok = load_project_tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text


def test_english_is_compressed() -> None:
    tok = load_project_tokenizer()
    text = (
        "Reinforcement learning from human feedback fine-tunes a language model: the policy generates "
        "responses, a reward model scores them, and the optimizer updates the policy within a trust region."
    )
    n_tokens = len(tok(text, add_special_tokens=False)["input_ids"])
    assert n_tokens < 1.6 * len(text.split())  # Llama's tokenizer: ~1.3 tokens per English word


@pytest.mark.parametrize("name", list(catalog.MODELS))
def test_ids_fit_every_registry_model(name: str) -> None:
    spec = resolve_model(name)
    tok = load_tokenizer(spec)
    assert len(tok) <= spec.config.vocab_size  # every id, special ones included, is below the vocab size
    ids = [i for text in TEXTS for i in tok(text)["input_ids"]]
    assert max(ids) < spec.config.vocab_size


def test_too_small_vocabulary_is_an_error() -> None:
    spec = resolve_model("tiny-llama")
    spec.config.vocab_size = 1000
    with pytest.raises(UserError) as exc:
        load_tokenizer(spec)
    assert "\n" not in str(exc.value) and "1000" in str(exc.value)


def test_chat_template_and_padding() -> None:
    tok = load_project_tokenizer()
    messages = [{"role": "user", "content": "What is 2+2?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<s><|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    batch = tok(["one two three", "one"], padding=True)
    assert batch["input_ids"][1][-1] == tok.pad_token_id and batch["attention_mask"][1][-1] == 0


def test_copies_are_independent() -> None:
    load_project_tokenizer().padding_side = "left"
    assert load_project_tokenizer().padding_side == "right"


def save_word_level_tokenizer(path: Path, pad: bool) -> None:
    vocab = {"<unk>": 0, "</s>": 1, "hello": 2, "world": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")
    if pad:
        tok.add_special_tokens({"pad_token": "<pad>"})
    tok.save_pretrained(path)


@pytest.mark.parametrize("pad", [True, False])
def test_local_tokenizer_is_preferred(tmp_path: Path, pad: bool) -> None:
    LlamaConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2).save_pretrained(
        tmp_path
    )
    save_word_level_tokenizer(tmp_path, pad)
    spec = resolve_model(str(tmp_path))
    assert spec.tokenizer_path == tmp_path.resolve()
    tok = load_tokenizer(spec)
    assert tok("hello world")["input_ids"][-2:] == [2, 3]
    assert tok.pad_token == ("<pad>" if pad else "</s>")  # without a pad token, eos pads


def test_broken_local_tokenizer(tmp_path: Path) -> None:
    LlamaConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2).save_pretrained(
        tmp_path
    )
    (tmp_path / "tokenizer.json").write_text("not json")
    with pytest.raises(UserError) as exc:
        load_tokenizer(resolve_model(str(tmp_path)))
    assert "\n" not in str(exc.value) and str(tmp_path) in str(exc.value)


@pytest.mark.e2e
def test_generator_reproduces_the_shipped_file() -> None:
    info = json.loads(tokenizer.PROJECT_TOKENIZER_META.read_text())
    if info["python"] != sys.version.split()[0]:
        pytest.skip(f"the shipped tokenizer was made with Python {info['python']}: its corpus differs here")
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "make_tokenizer.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
