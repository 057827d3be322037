"""The verl probe's prompts (autotune/probe/verl/dataset.py): exactly max_prompt_length tokens under the chat
template as verl renders them, distinct from their first words. The fast tests fit prompts with made-up
counters; the e2e ones hand the parquet the backend writes to verl's own RLHFDataset, Continuous Token builder
and truncation (tests/verl_dataset_check.py, run with .venv-verl's python).

The shipped verl space's model, qwen2.5-0.5b, is a registry name: autotune ships its config.json, not its
tokenizer (autotune/models/tokenizer_files holds only autotune's own byte-level BPE, with a generic ChatML
template), and nothing is downloaded here, so the real Qwen2.5 tokenizer and chat template cannot be had
offline. Its probe writes the dataset's fallback; verl's side is checked with the closest honest stand-in,
the folder `tools/model_dir.py` writes for that name (Qwen2.5-0.5B's config with autotune's BPE and ChatML).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from autotune.probe.contract import ProbeSettings
from autotune.probe.verl.backend import _model_path, _prompt_counter, _tokenizer_model
from autotune.probe.verl.dataset import (
    FALLBACK_MARGIN,
    FIRST_WORDS,
    chat_counter,
    prompt_text,
    prompt_words,
    write_dataset,
)
from autotune.space.loading import load_space
from tests.conftest import REPO
from tools.model_dir import write_model_dir

VERL_PYTHON = Path(os.environ.get("AUTOTUNE_VERL_PYTHON", REPO / ".venv-verl" / "bin" / "python"))
CHECK = REPO / "tests" / "verl_dataset_check.py"
VLLM_BLOCK = 16  # vLLM's default KV block: prefix caching shares whole blocks


def words_counter(header: int, per_word: int = 1):
    """A template of `header` tokens around a message of `per_word` tokens a word."""
    return lambda text: header + per_word * len(text.split())


def test_prompts_differ_from_their_first_word():
    firsts = [prompt_words(i, 3)[0] for i in range(len(FIRST_WORDS))]
    assert len(set(firsts)) == len(FIRST_WORDS)
    # beyond, the second word tells them apart
    pairs = {tuple(prompt_words(i, 2)) for i in range(3 * len(FIRST_WORDS))}
    assert len(pairs) == 3 * len(FIRST_WORDS)
    assert prompt_words(5, 40) == prompt_words(5, 80)[:40]  # more words extend, never change, a prompt


@pytest.mark.parametrize("header", [0, 7, 30])
def test_a_counter_fits_each_prompt_exactly(header):
    count = words_counter(header)
    for index in (0, 1, 700):
        assert count(prompt_text(index, 512, count)) == 512


def test_words_of_several_tokens_are_padded_with_fillers():
    """Two tokens a word and a one-token filler: an odd target is reached with the filler."""

    def count(text: str) -> int:
        words = text.split()
        return 5 + sum(1 if word in {"a", ".", ",", "I"} else 2 for word in words) + text.count(".")

    assert count(prompt_text(3, 301, count)) == 301


def test_a_target_no_filler_reaches_is_left_to_verls_truncation():
    """Three tokens a word and every filler too: the prompt is longer than the target, and verl cuts it."""
    count = words_counter(4, per_word=3)
    text = prompt_text(0, 200, lambda t: count(t) + 2 * t.count(".") + 2 * t.count(","))
    assert count(text) > 200


def test_without_a_tokenizer_prompts_are_longer_than_the_target():
    text = prompt_text(9, 512)
    assert len(text.split()) == 512 + FALLBACK_MARGIN  # a word is at least a token: verl cuts to 512


class FakeTokenizer:
    """apply_chat_template's forms across transformers versions: a list, a batch of one, a mapping."""

    def __init__(self, form: str) -> None:
        self.form = form
        self.calls: list[dict] = []

    def apply_chat_template(self, messages, **kwargs):
        self.calls.append(kwargs)
        ids = list(range(3 + len(messages[0]["content"].split())))
        return {"list": ids, "batch": [ids], "mapping": {"input_ids": ids}}[self.form]


@pytest.mark.parametrize("form", ["list", "batch", "mapping"])
def test_chat_counter_renders_as_verls_agent_loop(form):
    tokenizer = FakeTokenizer(form)
    assert chat_counter(tokenizer)("one two") == 5
    assert tokenizer.calls == [
        {"tokenize": True, "add_generation_prompt": True, "tools": None, "return_dict": False}
    ]


def test_a_registry_name_is_looked_up_offline_only(monkeypatch):
    """A registry name's tokenizer is the hub id's, from the local Hugging Face cache and never the network;
    not there, the fallback. autotune's own test models have no hub id: nothing to look up."""
    import transformers

    asked = []

    def from_pretrained(source, **kwargs):
        asked.append((source, kwargs))
        raise OSError("not in the cache")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    assert _prompt_counter("qwen2.5-0.5b", False) is None
    assert _prompt_counter("tiny-llama", False) is None
    assert asked == [("Qwen/Qwen2.5-0.5B", {"local_files_only": True, "trust_remote_code": False})]


def test_a_probe_reads_a_registry_models_tokenizer_by_its_name_not_the_path_verl_loads(tmp_path):
    """On a GPU verl loads a registry model by its hub id; the prompts' tokenizer is still looked up by the
    registry name (the hub id is no registry name). A folder is read as it is."""
    settings = ProbeSettings(model="qwen2.5-0.5b", device="cuda")
    model_path = _model_path(settings, tmp_path)
    assert model_path == "Qwen/Qwen2.5-0.5B"
    assert _tokenizer_model(model_path, settings) == "qwen2.5-0.5b"
    assert _tokenizer_model(str(tmp_path), settings) == str(tmp_path)


# --- verl's own reading ----------------------------------------------------------------------------------


def verl_check(parquet: Path, model_dir: Path, length: int, tmp_path: Path) -> dict:
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [str(VERL_PYTHON), str(CHECK), str(parquet), str(model_dir), str(length)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # verl prints "dataset len: N" first


def shipped_recipe() -> tuple[str, int, int]:
    """(model, prompts a step, max_prompt_length) of the shipped verl space."""
    space = load_space("verl-qwen2.5-0.5b-1gpu", cores=4)
    config = space.seed_configs[0].config
    return space.model, config.train_batch_size // config.rollout_n, config.max_prompt_length


@pytest.mark.e2e
def test_the_shipped_spaces_prompts_are_distinct_and_exact_after_verls_truncation(tmp_path):
    model, rows, length = shipped_recipe()
    assert (model, rows, length) == ("qwen2.5-0.5b", 64, 512)
    # as the probe writes it where the hub id is not in the local cache (test_a_registry_name_is_looked_up...)
    parquet = write_dataset(tmp_path / "train.parquet", rows, length, None)
    stand_in = write_model_dir(model, tmp_path / "model")  # see the module docstring
    report = verl_check(parquet, stand_in, length, tmp_path)
    assert report["rows"] == rows and report["exact_share"] == 1.0, report
    assert report["distinct_share"] >= 0.95
    # The fallback's price: every prompt was cut (and logged), the header with it; the tails stay apart
    assert report["warnings"] == rows and all(p["truncated"] for p in report["prompts"])
    assert max(p["shared_prefix"] for p in report["prompts"]) < VLLM_BLOCK


@pytest.mark.e2e
def test_a_local_models_prompts_are_exact_and_distinct_with_nothing_cut(tmp_path):
    folder = write_model_dir("tiny-llama", tmp_path / "tiny-llama")  # with autotune's ChatML template
    rows, length = 64, 512
    counter = _prompt_counter(str(folder), False)
    assert counter is not None
    parquet = write_dataset(tmp_path / "train.parquet", rows, length, counter)
    report = verl_check(parquet, folder, length, tmp_path)
    assert report["exact_share"] == 1.0 and report["distinct_share"] >= 0.95, report
    assert report["warnings"] == 0 and not any(p["truncated"] for p in report["prompts"])
    prompts = report["prompts"]
    assert all(p["tokens_rendered"] == length for p in prompts)
    # nothing shared beyond the template's header but, at most, the first word's first token
    assert max(p["shared_prefix"] for p in prompts) <= report["header"] + 1
