"""`autotune lengths`: statistics, suggestions, file formats, chat records, bad input (exit 2, one line)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autotune.cli import main
from autotune.data.lengths import (
    length_stats,
    measure_lengths,
    parse_percentiles,
    pick_keys,
    round_up_limit,
    split_chat,
    suggest_limit,
    truncated_share,
)
from autotune.errors import UserError
from autotune.models.catalog import resolve_model
from autotune.models.tokenizer import load_tokenizer

MODEL = "tiny-llama"  # a registry name: the project's offline BPE, where "the" and " the" are one token each
RECORDS = 3000


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model(MODEL))


@pytest.fixture(scope="module")
def known():
    """Records of k words "the the ...": k text tokens. A prompt adds <s>, a response its </s>."""
    rng = random.Random(0)
    prompt_words = [rng.randint(1, 300) for _ in range(RECORDS)]
    response_words = [int(rng.lognormvariate(3.5, 0.7)) + 1 for _ in range(RECORDS)]
    records = [
        {"prompt": " ".join(["the"] * p), "response": " ".join(["the"] * r), "id": i}
        for i, (p, r) in enumerate(zip(prompt_words, response_words, strict=True))
    ]
    return records, np.array(prompt_words) + 1, np.array(response_words) + 1


def _write_jsonl(path, records) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def _lengths_json(capsys, *args: str) -> dict:
    assert main(["lengths", *args, "--model", MODEL, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _error_line(capsys, *args: str) -> str:
    assert main(["lengths", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


# --- pure parts --------------------------------------------------------------------------------------


def test_round_up_to_a_multiple_of_8():
    assert [round_up_limit(v) for v in (0, 1, 8, 8.01, 187, 192, 193)] == [8, 8, 8, 16, 192, 192, 200]


def test_suggestion_is_the_percentile_rounded_up_and_truncation_is_the_share_above():
    counts = list(range(1, 101))  # numpy: p95 = 95.05, p90 = 90.1
    assert suggest_limit(counts, 95) == 96
    assert suggest_limit(counts, 90) == 96
    assert truncated_share(counts, 96) == pytest.approx(0.04)
    assert truncated_share([], 8) == 0.0


def test_stats_are_numpys_linear_percentiles():
    counts = np.random.default_rng(1).integers(1, 1000, size=777)
    stats = length_stats(counts, (50, 90, 95, 99))
    assert stats["count"] == 777 and stats["max"] == counts.max()
    assert list(stats["percentiles"].values()) == pytest.approx(list(np.percentile(counts, [50, 90, 95, 99])))
    assert length_stats([], (50,))["count"] == 0


def test_percentiles_option_is_parsed_and_checked():
    assert parse_percentiles("50, 90,99.5") == (50.0, 90.0, 99.5)
    for bad in ("", "abc", "50,101"):
        with pytest.raises(UserError):
            parse_percentiles(bad)


def test_default_keys_try_common_names():
    assert pick_keys(["prompt", "response"]) == ("prompt", "response")
    assert pick_keys(["question", "answer", "id"]) == ("question", "answer")
    assert pick_keys(["instruction", "output"]) == ("instruction", "output")
    assert pick_keys(["messages"]) == ("messages", None)
    assert pick_keys(["prompt", "data_source"]) == ("prompt", None)  # prompts only (verl's parquet)
    with pytest.raises(UserError, match="the data has: text, label"):
        pick_keys(["text", "label"])


def test_split_chat_takes_the_last_assistant_message_as_the_response():
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert split_chat(chat) == (chat[:1], "hello")
    assert split_chat(chat[:1]) == (chat[:1], None)


# --- the command on files ----------------------------------------------------------------------------


def test_jsonl_percentiles_match_numpy_on_the_tokenizers_counts(tmp_path, capsys, tokenizer, known):
    records, prompt_tokens, response_tokens = known
    path = tmp_path / "data.jsonl"
    _write_jsonl(path, records)
    out = _lengths_json(capsys, str(path))

    # the same tokenizer, one text at a time: prompts with <s>, responses plus the </s> that ends them
    prompts = np.array([len(tokenizer(r["prompt"])["input_ids"]) for r in records])
    responses = np.array(
        [len(tokenizer(r["response"], add_special_tokens=False)["input_ids"]) + 1 for r in records]
    )
    assert (prompts == prompt_tokens).all() and (responses == response_tokens).all()  # the known lengths

    percentiles = [50, 90, 95, 99]
    for name, counts in (("prompts", prompts), ("responses", responses)):
        stats = out[name]
        assert stats["count"] == RECORDS and stats["max"] == counts.max()
        assert list(stats["percentiles"].values()) == pytest.approx(list(np.percentile(counts, percentiles)))
    p95, p90 = np.percentile(prompts, 95), np.percentile(responses, 90)
    suggested = out["suggested"]
    assert suggested["max_prompt_length"] == 8 * int(np.ceil(p95 / 8))
    assert suggested["max_response_length"] == 8 * int(np.ceil(p90 / 8))
    assert suggested["max_prompt_length"] % 8 == 0 and suggested["max_prompt_length"] >= p95
    assert out["truncated"]["prompts"] == pytest.approx(np.mean(prompts > suggested["max_prompt_length"]))
    assert out["truncated"]["responses"] == pytest.approx(
        np.mean(responses > suggested["max_response_length"])
    )
    assert out["truncated"]["prompts"] <= 0.05 and out["truncated"]["responses"] <= 0.10


def test_table_output_and_custom_percentiles(tmp_path, capsys, known):
    path = tmp_path / "data.jsonl"
    _write_jsonl(path, known[0][:200])
    assert main(["lengths", str(path), "--model", MODEL, "--percentiles", "50,75"]) == 0
    out = capsys.readouterr().out
    assert "median" in out and "p75" in out and "p95" not in out.split("max_prompt_length")[0]
    assert "max_prompt_length: " in out and "max_response_length: " in out and "approximate" in out


def test_csv_and_parquet_give_the_same_figures_as_jsonl(tmp_path, capsys, known):
    records = known[0][:500]
    _write_jsonl(tmp_path / "data.jsonl", records)
    pd.DataFrame(records).to_csv(tmp_path / "data.csv", index=False)
    reference = _lengths_json(capsys, str(tmp_path / "data.jsonl"))
    csv = _lengths_json(capsys, str(tmp_path / "data.csv"))
    assert csv["prompts"] == reference["prompts"] and csv["responses"] == reference["responses"]
    pytest.importorskip("pyarrow", reason="pandas reads Parquet through pyarrow (setup.sh test installs it)")
    pd.DataFrame(records).to_parquet(tmp_path / "data.parquet")
    parquet = _lengths_json(capsys, str(tmp_path / "data.parquet"))
    assert parquet["suggested"] == reference["suggested"] and parquet["prompts"] == reference["prompts"]


def test_chat_records_use_the_chat_template(tmp_path, capsys, tokenizer):
    rng = random.Random(2)
    conversations = [
        [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": " ".join(["the"] * rng.randint(1, 60))},
            {"role": "assistant", "content": " ".join(["the"] * rng.randint(1, 40))},
        ]
        for _ in range(300)
    ]
    path = tmp_path / "chat.jsonl"
    _write_jsonl(path, [{"messages": c} for c in conversations])
    out = _lengths_json(capsys, str(path))
    assert out["prompt_key"] == "messages" and out["chat_records"] == 300 and out["chat_template"]

    def templated(chat):
        text = tokenizer.apply_chat_template(chat[:-1], tokenize=False, add_generation_prompt=True)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompts = [templated(c) for c in conversations]
    responses = [
        len(tokenizer(c[-1]["content"], add_special_tokens=False)["input_ids"]) + 1 for c in conversations
    ]
    assert out["prompts"]["max"] == max(prompts)
    assert out["prompts"]["percentiles"]["95"] == pytest.approx(np.percentile(prompts, 95))
    assert out["responses"]["percentiles"]["90"] == pytest.approx(np.percentile(responses, 90))
    # the template's markup counts: every prompt is longer than its user text alone
    assert (
        min(
            p - len(tokenizer(c[1]["content"])["input_ids"])
            for p, c in zip(prompts, conversations, strict=True)
        )
        > 5
    )


def test_verl_style_parquet_prompts_only(tmp_path, capsys):
    """verl's datasets: `prompt` is a list of messages (Parquet gives numpy arrays of dicts), no response."""
    pytest.importorskip("pyarrow", reason="pandas reads Parquet through pyarrow (setup.sh test installs it)")
    rows = [{"prompt": [{"role": "user", "content": "the " * i}], "data_source": "x"} for i in range(1, 101)]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    out = _lengths_json(capsys, str(tmp_path / "train.parquet"))
    assert out["chat_records"] == 100 and out["responses"] is None
    assert out["suggested"]["max_response_length"] is None


def test_question_answer_json_array(tmp_path, capsys):
    path = tmp_path / "qa.json"
    path.write_text(json.dumps([{"question": "the " * i, "answer": "the"} for i in range(1, 41)]))
    out = _lengths_json(capsys, str(path))
    assert (out["prompt_key"], out["response_key"]) == ("question", "answer")
    assert out["responses"]["max"] == 2  # "the" + </s>


# --- bad input: one line, exit 2 ---------------------------------------------------------------------


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert "does not exist" in _error_line(capsys, str(tmp_path / "missing.jsonl"), "--model", MODEL)
    (tmp_path / "notes.txt").write_text("hello")
    assert "unknown format '.txt'" in _error_line(capsys, str(tmp_path / "notes.txt"), "--model", MODEL)
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    assert "cannot read" in _error_line(capsys, str(tmp_path / "broken.jsonl"), "--model", MODEL)
    (tmp_path / "empty.csv").write_text("prompt,response\n")
    assert "no records" in _error_line(capsys, str(tmp_path / "empty.csv"), "--model", MODEL)
    _write_jsonl(tmp_path / "ok.jsonl", [{"text": "a", "label": 1}])
    err = _error_line(capsys, str(tmp_path / "ok.jsonl"), "--model", MODEL, "--response-key", "answer")
    assert "the data has: text, label" in err
    assert "percentile" in _error_line(
        capsys, str(tmp_path / "ok.jsonl"), "--model", MODEL, "--percentiles", "x"
    )
    # a response column of numbers would count their digits; one asked for by name that is all empty
    _write_jsonl(
        tmp_path / "scores.jsonl", [{"prompt": "a b", "response": 5}, {"prompt": "c", "response": 7}]
    )
    assert "holds int values (e.g. 5), not text" in _error_line(
        capsys, str(tmp_path / "scores.jsonl"), "--model", MODEL
    )
    _write_jsonl(tmp_path / "blank.jsonl", [{"prompt": "a b", "answer": ""}, {"prompt": "c", "answer": " "}])
    err = _error_line(capsys, str(tmp_path / "blank.jsonl"), "--model", MODEL, "--response-key", "answer")
    assert "every response is empty" in err


@pytest.mark.e2e
def test_missing_key_through_the_real_cli(tmp_path, cli):
    _write_jsonl(tmp_path / "d.jsonl", [{"text": "a", "label": 1}])
    proc = cli("lengths", str(tmp_path / "d.jsonl"), "--model", MODEL, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "no prompt column found" in proc.stderr and "the data has: text, label" in proc.stderr


# --- which tokenizer and template made the counts ---------------------------------------------------------

CHAT = [
    {
        "messages": [
            {"role": "user", "content": "What is two plus two?"},
            {"role": "assistant", "content": "4"},
        ]
    },
    {"messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]},
]


def test_registry_names_say_the_counts_come_from_a_stand_in(tmp_path, capsys):
    """Every registry name is counted with the project's BPE and generic ChatML template: the same counts for
    llama-2-7b and qwen2.5-7b, and the output says so instead of naming the model's tokenizer or template."""
    path = tmp_path / "chat.jsonl"
    _write_jsonl(path, CHAT)
    reports = {}
    for model in ("llama-2-7b", "qwen2.5-7b"):
        assert main(["lengths", str(path), "--model", model, "--json"]) == 0
        reports[model] = json.loads(capsys.readouterr().out)
    llama = reports["llama-2-7b"]
    assert llama["prompts"] == reports["qwen2.5-7b"]["prompts"]  # alike: that is why it must be said
    assert not llama["exact_tokenizer"] and "stand-in" in llama["tokenizer"]
    assert "not llama-2-7b's tokenizer" in llama["tokenizer"]
    assert llama["chat_template"] and "generic ChatML" in llama["chat_template_source"]
    assert "not llama-2-7b's own chat template" in llama["chat_template_source"]
    assert main(["lengths", str(path), "--model", "llama-2-7b"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps the title
    assert "approximate" in out and "not llama-2-7b's tokenizer" in out
    assert "2 chat records rendered with a generic ChatML template" in out
    assert "the tokenizer's chat template" not in out


def test_a_local_tokenizer_without_a_template_renders_plain_text(tmp_path, capsys):
    from transformers import LlamaConfig

    from tests.test_tokenizer import save_word_level_tokenizer

    model = tmp_path / "model"
    LlamaConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2).save_pretrained(
        model
    )
    save_word_level_tokenizer(model, pad=True)
    path = tmp_path / "chat.jsonl"
    _write_jsonl(path, CHAT)
    assert main(["lengths", str(path), "--model", str(model), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["exact_tokenizer"] and report["tokenizer"] == str(model.resolve())
    assert not report["chat_template"] and report["chat_template_source"] is None
    assert main(["lengths", str(path), "--model", str(model)]) == 0
    out = capsys.readouterr().out
    assert "plain text (no chat template)" in out and "approximate" not in out


# --- large files: streamed, sampled -----------------------------------------------------------------------


def _numbered(tmp_path, count: int, name: str = "many.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(
        "".join(json.dumps({"prompt": f"p{i}", "response": "r " * (i % 7)}) + "\n" for i in range(count))
    )
    return path


def test_a_large_file_is_a_uniform_sample_in_file_order_the_same_every_time(tmp_path):
    from autotune.data.records import read_sample

    path = _numbered(tmp_path, 1200)
    frame, total = read_sample(path, rows=100)
    assert total == 1200 and len(frame) == 100
    numbers = [int(p[1:]) for p in frame["prompt"]]
    assert numbers == sorted(numbers) and numbers[0] < 200 and numbers[-1] > 1000  # spread, in order
    again, _ = read_sample(path, rows=100)
    assert again["prompt"].tolist() == frame["prompt"].tolist()
    parquet = tmp_path / "many.parquet"
    pd.read_json(path, lines=True).to_parquet(parquet)
    assert read_sample(parquet, rows=100)[0]["prompt"].tolist() == frame["prompt"].tolist()  # one rule
    everything, total = read_sample(path, rows=None)
    assert len(everything) == total == 1200


def test_a_column_whose_type_changes_is_read_by_pandas_and_sampled_alike(tmp_path):
    from autotune.data.records import read_sample

    path = _numbered(tmp_path, 300)
    with path.open("a") as f:  # a chat prompt after 300 text ones: pyarrow cannot type the column
        f.write(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "response": "ok"}) + "\n")
    frame, total = read_sample(path, rows=50)
    assert total == 301 and len(frame) == 50


def test_the_report_says_when_its_lengths_are_a_sample(tmp_path):
    report = measure_lengths(_numbered(tmp_path, 1000), MODEL, sample_rows=200)
    assert report.records == 1000 and report.sampled == 200 and report.prompts.size == 200
    assert report.to_dict()["sampled"] == 200
