"""The prompts a verl probe trains on: a parquet of the recipe's shape in verl 0.9.1's RL dataset layout.

verl's `RLHFDataset` (verl/utils/dataset/rl_dataset.py) reads a `prompt` column of chat messages, and its
reward loop reads `data_source` and `reward_model.ground_truth` (verl/experimental/reward_loop/reward_manager/
naive.py:42-43). `data_source` "openai/gsm8k" is scored by verl's default reward with the standard library
only (verl/utils/reward_score/__init__.py:44-47), from a plain number as the ground truth.

Each row is one user message. verl's V1 agent loop renders it with the model's chat template
(`tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, tools=None,
return_dict=False, **data.apply_chat_template_kwargs)`: verl/utils/tokenizer/continuous_token.py:226-241,
verl/utils/tokenizer/chat_template.py:141-174) and keeps the last rollout.prompt_length (= data.max_prompt_
length) tokens of a longer one, with a warning per prompt (experimental/agent_loop/agent_loop.py:437-446).
So that every prompt the probe times is exactly max_prompt_length tokens and none is cut:
- with the model's tokenizer (`chat_counter`: a local model folder, or a hub id already in the local
  Hugging Face cache), each message is fitted until its rendering counts exactly max_prompt_length tokens;
- the words differ from the message's first word on (a different first word for each of up to
  len(FIRST_WORDS) prompts, a different second word beyond), then run on at random, so vLLM's prefix
  caching (on by default: verl/workers/config/rollout.py:247) can share no more than the chat template's
  fixed header and the first word's blocks between prompts. A step's prompts are the whole dataset (one step
  per epoch), and verl resets the prefix cache at every wake-up (vllm_async_server.py:841,849), so steps do
  not share either. rollout.n copies of a prompt share it, as they do in training.
Without a tokenizer (a registry name: autotune ships the architecture, not the tokenizer, and downloads
nothing), each message is FALLBACK_MARGIN words longer than max_prompt_length. Every word is at least one
token where whitespace starts a new piece (byte-level BPEs such as Qwen's and Llama 3's, SentencePiece as
Llama 2 uses it), so verl's truncation still leaves exactly max_prompt_length tokens, and the random words
keep the kept tails distinct; what is then not guaranteed: that nothing is cut (verl logs its truncation
warning once per prompt), that the chat template's header is in the prompt (it is cut with the message's
first words), and either for a vocabulary that merges across whitespace.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = [
    "DATA_SOURCE",
    "FIRST_WORDS",
    "TokenCounter",
    "chat_counter",
    "prompt_text",
    "prompt_words",
    "write_dataset",
]

DATA_SOURCE = "openai/gsm8k"
FALLBACK_MARGIN = 16  # words beyond max_prompt_length without a tokenizer: the chat footer's tokens and more
# Plain four-letter English words, nearly all one token in large vocabularies (489 of these 492, after a
# space, in Qwen2's), none a prefix of another. Prompt i starts FIRST_WORDS[i % n], FIRST_WORDS[i // n % n].
FIRST_WORDS = tuple(
    """
    able acid aged also area army away baby back ball band bank base bath bear beat been beer bell belt best
    bill bird blow blue boat body bond bone book boom born boss both bowl bulk burn bush busy call calm
    came camp card care cars case cash cast cell chat chip city club coal coat code cold come cook cool cope
    copy core cost crew crop dark data date dawn days deal dean dear debt deep deny desk dial diet disc
    disk does done door dose down draw drew drop dual duke dust duty each earn ease east easy edge else
    even ever exit face fact fail fair fall farm fast fate fear feed feel feet fell felt file fill film
    find fine fire firm fish five flat flow food foot ford form fort four free from fuel full fund gain game
    gate gave gear gene gift girl give glad goal goes gold golf gone good gray grew grey grow gulf hair half
    hall hand hang hard harm have head hear heat held help here hero high hill hire hold hole holy
    home hope host hour huge hung hunt hurt idea inch into iron item jack jane jean john join jump jury just
    keen keep kent kept kick kind king knee knew know lack lady laid lake land lane last late lead left
    less life lift like line link list live load loan lock logo long look lord lose loss lost love luck made
    mail main make male many mark mass matt meal mean meat meet menu mere mike mile milk mill mind mine miss
    mode mood moon more most move much must name navy near neck need news next nice nick nine none nose note
    okay once only onto open oral over pace pack page paid pain pair palm park part pass past path peak pick
    pink pipe plan play plot plug plus poll pool poor port post pull pure push race rail rain rank rare rate
    read real rear rely rent rest rice rich ride ring rise risk road rock role roll roof room root rose rule
    rush ruth safe said sake sale salt same sand save seat seed seek seem seen self sell send sent sept ship
    shop shot show shut sick side sign site size skin slip slow snow soft soil sold sole some song soon sort
    soul spot star stay step stop such suit sure take tale talk tall tank tape task team tech tell tend term
    test text than that them then they thin this thus till time tiny told tone tony took tool tour town tree
    trip true tune turn twin type unit upon used user vary vast very vice view vote wage wait wake walk wall
    want ward warm wash wave ways weak wear week well went were west what when whom wide wife wild will wind
    wine wing wire wise wish with wood word wore work yard yeah year your zero zone
    """.split()
)
BODY_SEED = 20_240_901  # the random words after the first ones: the same prompts on every run
FILLERS = (" a", ".", ",", " I", "!", "?", " x", ";")  # one token each in most vocabularies
GROWTHS = 8  # doublings of the words before a tokenizer that never reaches the target is given up on

TokenCounter = Callable[[str], int]  # tokens of one user message as verl renders it (chat template and all)


def _token_ids(tokenized: Any) -> list[int]:
    """A flat list of token ids from apply_chat_template's output, as verl's normalize_token_ids reads it
    (verl/utils/tokenizer/tokenizer.py:28-53: a list, a mapping or BatchEncoding with input_ids, a batch of
    one)."""
    ids = tokenized
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"] if isinstance(ids, Mapping) else ids.input_ids
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    ids = list(ids)
    if len(ids) == 1 and isinstance(ids[0], list | tuple):
        ids = list(ids[0])
    return ids


def chat_counter(tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None) -> TokenCounter:
    """Counts a user message's tokens as verl's agent loop renders it: the chat template with the generation
    prompt, no tools, `data.apply_chat_template_kwargs` (empty by default) passed on."""
    kwargs = dict(chat_template_kwargs or {})

    def count(text: str) -> int:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            tokenize=True,
            add_generation_prompt=True,
            tools=None,
            return_dict=False,
            **kwargs,
        )
        return len(_token_ids(rendered))

    return count


def prompt_words(index: int, count: int) -> list[str]:
    """`count` words of prompt `index`: its index in FIRST_WORDS digits first (the lowest first), so prompts
    differ from their first word, then words drawn at random with the index as the seed."""
    n = len(FIRST_WORDS)
    digits, rest = [FIRST_WORDS[index % n]], index // n
    while rest:
        digits.append(FIRST_WORDS[rest % n])
        rest //= n
    rng = random.Random(BODY_SEED + index)
    return (digits + [rng.choice(FIRST_WORDS) for _ in range(max(0, count - len(digits)))])[:count]


class _Fitter:
    """Fits prompt `index`'s words to exactly `target` tokens under `count_tokens`, each count asked once."""

    def __init__(self, index: int, target: int, count_tokens: TokenCounter) -> None:
        self.index, self.target, self.count_tokens = index, target, count_tokens
        self.words = prompt_words(index, target + FALLBACK_MARGIN)
        self.counts: dict[int, int] = {}

    def count(self, n: int) -> int:
        if n not in self.counts:
            self.counts[n] = self.count_tokens(" ".join(self.words[:n]))
        return self.counts[n]

    def longest_within(self) -> int | None:
        """The most words whose message counts at most `target` tokens; None when even the template's own
        tokens are more. Interpolation search: the count grows about linearly with the words."""
        for _ in range(GROWTHS):  # a tokenizer that merges across words needs more of them
            if self.count(len(self.words)) > self.target:
                break
            self.words = prompt_words(self.index, 2 * len(self.words))
        else:
            return len(self.words)
        lo, hi = 0, len(self.words)
        if self.count(lo) > self.target:
            return None
        while hi - lo > 1:
            low, high = self.count(lo), self.count(hi)
            guess = lo + (self.target - low) * (hi - lo) // max(1, high - low)
            mid = min(hi - 1, max(lo + 1, guess))
            if self.count(mid) == self.target:
                return mid
            lo, hi = (mid, hi) if self.count(mid) < self.target else (lo, mid)
        return lo

    def text(self) -> str:
        """Exactly `target` tokens when the words and single-token fillers can make it; else longer than
        `target` (verl cuts it to exactly `target`, with its warning)."""
        n = self.longest_within()
        if n is None:
            return " ".join(self.words)
        text, tokens = " ".join(self.words[:n]), self.count(n)
        while tokens < self.target:
            grown = self.grow(text, tokens)
            if grown is None:
                return " ".join(self.words[: n + 1])
            text, tokens = grown
        return text

    def grow(self, text: str, tokens: int) -> tuple[str, int] | None:
        """`text` and a filler, with its count, when one adds tokens without passing `target`."""
        for filler in FILLERS:
            grown = self.count_tokens(text + filler)
            if tokens < grown <= self.target:
                return text + filler, grown
        return None


def prompt_text(index: int, prompt_tokens: int, count_tokens: TokenCounter | None = None) -> str:
    """Prompt `index`'s user message: exactly `prompt_tokens` tokens as verl renders it when `count_tokens`
    can tell (see the module docstring), else FALLBACK_MARGIN words longer than `prompt_tokens`."""
    if count_tokens is None:
        return " ".join(prompt_words(index, prompt_tokens + FALLBACK_MARGIN))
    return _Fitter(index, prompt_tokens, count_tokens).text()


def write_dataset(
    path: Path, rows: int, prompt_tokens: int, count_tokens: TokenCounter | None = None
) -> Path:
    """`rows` distinct prompts in verl's layout, written to `path` (parquet)."""
    records = [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt_text(index, prompt_tokens, count_tokens)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(index % 97)},
            "extra_info": {"split": "train", "index": index},
        }
        for index in range(rows)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame.from_records(records).to_parquet(path, index=False)
    return path
