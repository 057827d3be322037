"""Token lengths of a dataset, and the length limits they suggest (the seed article: measure the data first).

    report = measure_lengths(Path("train.jsonl"), "llama-2-7b")
    report.suggested_prompt_length, report.suggested_response_length     # p95 and p90, multiples of 8

What is counted, so that a limit of that many tokens truncates nothing more than the share reported:
- a prompt as the model reads it: plain text with the tokenizer's special tokens (Llama's `<s>`); a chat
  prompt (a list of {role, content} messages) rendered by the tokenizer's chat template with the generation
  prompt, as verl's RLHFDataset does;
- a response as the model generates it: its text tokens plus the end-of-sequence token that stops it.
A chat column whose records end with an assistant message, with no separate response column, is split: the
last assistant message is the response, the messages before it the prompt.

Registry names (`llama-2-7b`, ...) are counted with the project's offline tokenizer and its generic ChatML
template, stand-ins for the real ones (see `autotune.models.tokenizer`): every registry name gets the same
counts, and the report says so rather than naming the model's tokenizer or template. A local model directory
is counted with its own tokenizer and chat template, exactly.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from autotune.data.records import SAMPLE_ROWS, read_sample
from autotune.errors import UserError
from autotune.units import round_up

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "LengthReport",
    "Texts",
    "collect_texts",
    "count_tokens",
    "length_stats",
    "measure_lengths",
    "parse_percentiles",
    "pick_keys",
    "print_report",
    "prompt_counts",
    "response_counts",
    "round_up_limit",
    "split_chat",
    "suggest_limit",
    "truncated_share",
]

PROMPT_KEYS = ("prompt", "question", "instruction", "query", "messages", "conversations")
RESPONSE_KEYS = ("response", "answer", "output", "completion", "chosen")
DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)
PROMPT_PERCENTILE, RESPONSE_PERCENTILE = 95.0, 90.0  # the article's rule: prompts at p95, responses at p90
MULTIPLE = 8  # limits rounded up to a multiple of 8: tensor-core friendly shapes
BATCH = 4096  # texts per tokenizer call: the fast tokenizer parallelises within a call


# --- pure parts: statistics and suggestions -----------------------------------------------------------


def round_up_limit(value: float) -> int:
    """A length limit: `value` rounded up to a multiple of 8 (and at least 8)."""
    return max(MULTIPLE, round_up(math.ceil(value), MULTIPLE))


def suggest_limit(counts: Sequence[int] | np.ndarray, percentile: float) -> int:
    """The percentile of the counts (numpy's linear interpolation), rounded up to a multiple of 8."""
    return round_up_limit(float(np.percentile(np.asarray(counts), percentile)))


def truncated_share(counts: Sequence[int] | np.ndarray, limit: int) -> float:
    """The share of samples longer than `limit` tokens: what that limit would cut."""
    array = np.asarray(counts)
    return float(np.mean(array > limit)) if array.size else 0.0


def length_stats(counts: Sequence[int] | np.ndarray, percentiles: Sequence[float]) -> dict[str, Any]:
    """count, mean, the percentiles (numpy's default, linear) and max of token counts."""
    array = np.asarray(counts)
    if not array.size:
        return {"count": 0, "mean": None, "percentiles": {}, "max": None}
    values = np.percentile(array, list(percentiles))
    return {
        "count": int(array.size),
        "mean": float(array.mean()),
        "percentiles": {_label(p): float(v) for p, v in zip(percentiles, values, strict=True)},
        "max": int(array.max()),
    }


def parse_percentiles(text: str) -> tuple[float, ...]:
    """ "50,90,95,99" -> (50.0, 90.0, 95.0, 99.0); each in [0, 100]."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(
            f"--percentiles {text!r}: expected numbers separated by commas, e.g. 50,90,95,99"
        ) from None
    if not values or any(not 0 <= v <= 100 for v in values):
        raise UserError(f"--percentiles {text!r}: each percentile must be between 0 and 100")
    return values


def _label(percentile: float) -> str:
    return f"{percentile:g}"


# --- reading ------------------------------------------------------------------------------------------


def pick_keys(
    columns: Sequence[str], prompt_key: str | None = None, response_key: str | None = None
) -> tuple[str, str | None]:
    """(prompt column, response column or None): the given keys, else the first common names present."""
    names = [str(c) for c in columns]
    listed = ", ".join(names)
    for key, flag in ((prompt_key, "--prompt-key"), (response_key, "--response-key")):
        if key is not None and key not in names:
            raise UserError(f"{flag} {key!r}: no such column; the data has: {listed}")
    prompt = prompt_key or next((k for k in PROMPT_KEYS if k in names), None)
    if prompt is None:
        raise UserError(
            f"no prompt column found (tried {', '.join(PROMPT_KEYS)}); the data has: {listed}; "
            f"pass --prompt-key"
        )
    response = response_key or next((k for k in RESPONSE_KEYS if k in names and k != prompt), None)
    return prompt, response


# --- rendering and counting ----------------------------------------------------------------------------


def _is_chat(value: Any) -> bool:
    """A list (or numpy array, as Parquet gives) of {role, content} messages."""
    if isinstance(value, np.ndarray):
        value = list(value)
    return (
        isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "content" in m for m in value)
    )


def _messages(value: Any) -> list[dict[str, str]]:
    return [{"role": str(m.get("role", "user")), "content": str(m["content"])} for m in value]


def split_chat(messages: list[dict[str, str]]) -> tuple[list[dict[str, str]], str | None]:
    """(prompt messages, response text): the last assistant message is the response, when there is one."""
    if len(messages) > 1 and messages[-1]["role"] == "assistant":
        return messages[:-1], messages[-1]["content"]
    return messages, None


def _plain(value: Any) -> str:
    if isinstance(value, dict) and "content" in value:
        return str(value["content"])
    if _is_chat(value):
        return "\n".join(m["content"] for m in _messages(value))
    return str(value)


@dataclass
class Texts:
    """What to tokenize: prompts (templated or plain) and responses, with how each was made."""

    templated: list[str] = field(default_factory=list)  # chat prompts rendered by the template
    plain: list[str] = field(default_factory=list)  # plain-text prompts (special tokens are added)
    responses: list[str] = field(default_factory=list)
    chat_records: int = 0
    chat_template: bool = False  # chat prompts were rendered by the tokenizer's template


def collect_texts(
    frame: pd.DataFrame, prompt_key: str, response_key: str | None, tokenizer: PreTrainedTokenizerBase
) -> Texts:
    """Prompt and response texts of every record with a prompt (missing values are skipped)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    texts = Texts(chat_template=has_template)
    conversations: list[list[dict[str, str]]] = []
    responses = frame[response_key].tolist() if response_key else [None] * len(frame)
    for prompt, response in zip(frame[prompt_key].tolist(), responses, strict=True):
        if _missing(prompt):
            continue
        if _is_chat(prompt):
            texts.chat_records += 1
            messages, tail = split_chat(_messages(prompt))
            response = tail if response_key is None else response
            if has_template:
                conversations.append(messages)
            else:  # no template: the contents as plain text (the report says so)
                texts.plain.append("\n".join(m["content"] for m in messages))
        else:
            texts.plain.append(str(prompt))
        if not _missing(response):
            texts.responses.append(_plain(response))
    if conversations:
        texts.templated = cast(  # tokenize=False and a list of conversations: one string each
            "list[str]",
            tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True),
        )
    return texts


def check_response_column(frame: pd.DataFrame, key: str, path: Path | str, given: bool) -> None:
    """A response column holds text (or chat messages): numbers or booleans would be counted as the tokens
    of their digits, a silent misreading. All empty: a column asked for by name is a mistake (one line); one
    found by its common name prices responses at the limit, as no column does."""
    values = [v for v in frame[key].tolist() if not _missing(v)]
    odd = next((v for v in values if not isinstance(v, str | dict | list) and not hasattr(v, "tolist")), None)
    if odd is not None:
        raise UserError(
            f"data file '{path}': response column {key!r} holds {type(odd).__name__} values (e.g. {odd!r}), "
            f"not text: pass --response-key with the column of the responses' text"
        )
    if not values and given:
        raise UserError(
            f"data file '{path}': --response-key {key!r}: every response is empty; pass the column that "
            f"holds the responses, or leave --response-key out to price responses at max_response_length"
        )


def _missing(value: Any) -> bool:
    """None, NaN, pandas' NA, or blank text (CSV and Parquet write all of them for an absent value)."""
    import pandas as pd

    if isinstance(value, str):
        return not value.strip()
    return pd.api.types.is_scalar(value) and bool(pd.isna(value))


def count_tokens(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    add_special_tokens: bool = True,
    counted: Callable[[int], None] = lambda n: None,
) -> np.ndarray:
    """Token counts through the fast tokenizer's batch call, BATCH texts at a time.

    The Rust backend's `encode_batch_fast` (no offsets) is 1.5x faster than `tokenizer(texts)` on long
    texts and gives the same ids; a slow (Python) tokenizer takes the ordinary call.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    fast = getattr(backend, "encode_batch_fast", None)
    counts = np.zeros(len(texts), dtype=np.int64)
    for start in range(0, len(texts), BATCH):
        chunk = list(texts[start : start + BATCH])
        if fast is not None:
            lengths = [len(e.ids) for e in fast(chunk, add_special_tokens=add_special_tokens)]
        else:
            ids = tokenizer(chunk, add_special_tokens=add_special_tokens, return_attention_mask=False)
            lengths = [len(i) for i in ids["input_ids"]]
        counts[start : start + len(chunk)] = lengths
        counted(len(chunk))
    return counts


def prompt_counts(
    tokenizer: PreTrainedTokenizerBase, texts: Texts, counted: Callable[[int], None] = lambda n: None
) -> np.ndarray:
    # the chat template writes the special tokens itself (Llama's <s>): adding them again would count twice
    templated = count_tokens(tokenizer, texts.templated, False, counted)
    return np.concatenate([templated, count_tokens(tokenizer, texts.plain, True, counted)])


def response_counts(
    tokenizer: PreTrainedTokenizerBase, texts: Texts, counted: Callable[[int], None] = lambda n: None
) -> np.ndarray:
    eos = 1 if tokenizer.eos_token_id is not None else 0  # generation ends with EOS: it takes a slot
    return count_tokens(tokenizer, texts.responses, False, counted) + eos


# --- the report ---------------------------------------------------------------------------------------


@dataclass
class LengthReport:
    path: str
    model: str
    tokenizer: str  # where the tokenizer comes from
    exact: bool  # the model's own tokenizer (else the project's approximation)
    prompt_key: str
    response_key: str | None  # None: no responses, or taken from the chat records
    records: int
    chat_records: int
    chat_template: bool  # chat prompts were rendered by a chat template (see chat_template_source)
    percentiles: tuple[float, ...]
    prompts: np.ndarray
    responses: np.ndarray
    prompt_texts: list[str] = field(
        default_factory=list
    )  # as tokenized: for the probe's prompts (run --data)
    chat_template_source: str | None = None  # whose template rendered the chat prompts; None: no template
    sampled: int | None = None  # the records counted, when a uniform sample of `records` (data.records)

    @property
    def suggested_prompt_length(self) -> int:
        return suggest_limit(self.prompts, PROMPT_PERCENTILE)

    @property
    def suggested_response_length(self) -> int | None:
        return suggest_limit(self.responses, RESPONSE_PERCENTILE) if self.responses.size else None

    def to_dict(self) -> dict[str, Any]:
        response_limit = self.suggested_response_length
        return {
            "path": self.path,
            "model": self.model,
            "tokenizer": self.tokenizer,
            "exact_tokenizer": self.exact,
            "prompt_key": self.prompt_key,
            "response_key": self.response_key,
            "records": self.records,
            "sampled": self.sampled,
            "chat_records": self.chat_records,
            "chat_template": self.chat_template,
            "chat_template_source": self.chat_template_source if self.chat_template else None,
            "prompts": length_stats(self.prompts, self.percentiles),
            "responses": length_stats(self.responses, self.percentiles) if self.responses.size else None,
            "suggested": {
                "max_prompt_length": self.suggested_prompt_length,
                "max_response_length": response_limit,
            },
            "rule": f"max_prompt_length = p{PROMPT_PERCENTILE:g}, max_response_length = "
            f"p{RESPONSE_PERCENTILE:g}, rounded up to a multiple of {MULTIPLE}",
            "truncated": {
                "prompts": truncated_share(self.prompts, self.suggested_prompt_length),
                "responses": truncated_share(self.responses, response_limit) if response_limit else None,
            },
        }


def measure_lengths(
    path: Path | str,
    model: str,
    prompt_key: str | None = None,
    response_key: str | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    sample_rows: int | None = SAMPLE_ROWS,
) -> LengthReport:
    """Read, render and tokenize a dataset: the counts and the suggested limits (UserError on bad input).
    Past `sample_rows` records, a uniform sample of them (autotune.data.records); None counts every one."""
    frame, total = read_sample(Path(path), sample_rows)
    prompt, response = pick_keys(list(frame.columns), prompt_key, response_key)
    if response is not None:
        check_response_column(frame, response, path, given=response_key is not None)
    from autotune.models.catalog import (
        resolve_model,  # torch and transformers: only once the data is readable
    )
    from autotune.models.tokenizer import load_tokenizer, stand_in_template, stand_in_tokenizer

    spec = resolve_model(model)
    tokenizer = load_tokenizer(spec)
    texts = collect_texts(frame, prompt, response, tokenizer)
    with _tokenizing(len(texts.templated) + len(texts.plain) + len(texts.responses)) as counted:
        prompts = prompt_counts(tokenizer, texts, counted)
        responses = response_counts(tokenizer, texts, counted)
    if not prompts.size:
        raise UserError(f"data file '{path}': every record's {prompt!r} is empty")
    exact = spec.tokenizer_path is not None
    # A registry name has no tokenizer of its own: say whose tokenizer and template made the counts.
    return LengthReport(
        path=str(path),
        model=spec.name,
        tokenizer=str(spec.tokenizer_path) if exact else stand_in_tokenizer(spec.name, len(tokenizer)),
        chat_template_source=f"{spec.name}'s own chat template" if exact else stand_in_template(spec.name),
        exact=exact,
        prompt_key=prompt,
        response_key=response,
        records=total,
        sampled=len(frame) if len(frame) < total else None,
        chat_records=texts.chat_records,
        chat_template=texts.chat_template,
        percentiles=tuple(percentiles),
        prompts=prompts,
        responses=responses,
        prompt_texts=texts.templated + texts.plain,
    )


PROGRESS_TEXTS = 20_000  # past this many texts, tokenizing takes seconds: a progress bar on a terminal


@contextlib.contextmanager
def _tokenizing(texts: int) -> Iterator[Callable[[int], None]]:
    """A transient progress bar on stderr while `texts` are tokenized (a terminal and enough texts only)."""
    if texts < PROGRESS_TEXTS or not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("tokenizing", total=texts)
        yield lambda n: progress.advance(task, n)


def print_report(report: LengthReport) -> None:
    """The statistics as a rich table, then the suggested limits and what they truncate."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    data = report.to_dict()
    how = "" if report.exact else ", approximate: a stand-in tokenizer"
    table = Table(title=f"token lengths: {report.path} ({report.model}{how})")
    table.add_column("", style="bold")
    table.add_column("count", justify="right")
    for p in report.percentiles:
        table.add_column("median" if p == 50 else f"p{p:g}", justify="right")
    table.add_column("max", justify="right")
    for name in ("prompts", "responses"):
        stats = data[name]
        if stats:
            cells = [f"{v:.1f}".removesuffix(".0") for v in stats["percentiles"].values()]
            table.add_row(name, str(stats["count"]), *cells, str(stats["max"]))
    console.print(table)
    for line in _summary_lines(report, data):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def _summary_lines(report: LengthReport, data: dict[str, Any]) -> list[str]:
    suggested, truncated = data["suggested"], data["truncated"]
    p95 = float(np.percentile(report.prompts, PROMPT_PERCENTILE))
    lines = []
    if report.sampled:  # first: it qualifies every figure below
        lines.append(
            f"lengths from a uniform random sample of {report.sampled:,} of the {report.records:,} records "
            "(seeded: the same file gives the same figures)"
        )
    if not report.exact:
        lines.append(
            f"counts are {report.tokenizer}; for exact counts point --model at a local directory with "
            f"{report.model}'s tokenizer files"
        )
    lines += [
        f"max_prompt_length: {suggested['max_prompt_length']}  (p95 {p95:.1f} rounded up to a multiple of "
        f"{MULTIPLE}; truncates {truncated['prompts']:.1%} of prompts)"
    ]
    if suggested["max_response_length"] is not None:
        p90 = float(np.percentile(report.responses, RESPONSE_PERCENTILE))
        lines.append(
            f"max_response_length: {suggested['max_response_length']}  (p90 {p90:.1f} rounded up; "
            f"truncates {truncated['responses']:.1%} of responses)"
        )
    else:
        lines.append("max_response_length: no responses in the data (pass --response-key if it has them)")
    if report.chat_records:
        how = (
            report.chat_template_source or "a chat template"
            if report.chat_template
            else "plain text (no chat template)"
        )
        lines.append(f"{report.chat_records} chat records rendered with {how}")
    return lines
