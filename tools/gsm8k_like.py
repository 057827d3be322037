"""Write `tests/data/gsm8k_like.jsonl`: grade-school maths records shaped like verl's GSM8K data.

verl's own example scripts train on GSM8K (`examples/data_preprocess/gsm8k.py` makes its parquet: a chat
prompt of the question plus the instruction `Let's think step by step and output the final answer after
"####".`, the worked answer kept beside it). GSM8K itself cannot be downloaded here, so this writes records
of its shape, deterministically: questions of 25-110 words (GSM8K's median is about 45), worked answers of
20-230 words (median about 80), ending in `#### <number>`, as GSM8K's answers do. The tests judge verl's
example scripts on these lengths (`autotune check ... --data tests/data/gsm8k_like.jsonl`).

    .venv/bin/python tools/gsm8k_like.py            # writes the file
    .venv/bin/python tools/gsm8k_like.py --check    # exit 1 if the committed file differs
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "gsm8k_like.jsonl"
RECORDS = 200
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
NAMES = ("Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis", "Tina", "Randy")
THINGS = ("clips", "apples", "pages", "marbles", "cookies", "tickets", "books", "eggs", "shirts", "dollars")
WORDS = (
    "she sold half as many in May as in April and then bought twice the number of boxes each week while "
    "her brother gave away a third of what was left after school on the last day of the month so how many "
    "does each friend get if they share the rest equally and every box holds the same number of items"
).split()


def _sentence(rng: random.Random, words: int) -> str:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    body = [rng.choice(WORDS) for _ in range(max(1, words - 4))]
    return f"{name} has {rng.randint(2, 99)} {thing}, " + " ".join(body) + "."


def record(rng: random.Random) -> dict:
    question_words = min(110, max(25, int(rng.lognormvariate(3.8, 0.35))))
    answer_words = min(230, max(20, int(rng.lognormvariate(4.4, 0.45))))
    question = _sentence(rng, question_words)
    steps = [_sentence(rng, max(5, answer_words // 4)) for _ in range(4)]
    answer = " ".join(steps) + f"\n#### {rng.randint(1, 999)}"
    return {"prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}], "answer": answer}


def text() -> str:
    rng = random.Random(8)  # GSM8K: 8.5K problems
    return "".join(json.dumps(record(rng)) + "\n" for _ in range(RECORDS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = parser.parse_args(argv)
    if args.check:
        return 0 if OUT.read_text() == text() else 1
    OUT.write_text(text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
