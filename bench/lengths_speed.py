"""Records tokenized per second by `autotune lengths` on synthetic prompt+response records.

    python -m bench.lengths_speed [--records 100000] [--model llama-2-7b]
    python -m bench.lengths_speed --records 1000000     # the aim: 10^6 records in <= 30 s on two cores

The records are English-like text whose lengths follow the article's e-commerce example (§4.5: prompt
median ~42 tokens, p95 ~187; response median ~63, p95 ~215), written as JSON lines in a temporary folder.
Two figures: end to end (read the file with pandas, render, tokenize prompts and responses, statistics)
and tokenizing alone, in this process with the tokenizer loaded and warmed up before the clock starts; and the
command a user types, `autotune lengths FILE --model M --json`, as a fresh process: its wall time and peak
resident memory. Past 50,000 records `autotune lengths` counts a uniform sample of 50,000
(autotune.data.records).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import numpy as np

WORDS = (
    "the order shipped yesterday but the package has not arrived and tracking shows it stuck at the "
    "regional warehouse please refund or resend customer service replied within two hours apologizing "
    "for the delay"
).split()


def synthetic_records(n: int, seed: int = 0) -> list[dict[str, str]]:
    """Lognormal word counts: median 32 / 48 words ≈ 42 / 63 tokens, a long tail like real support chats."""
    rng = random.Random(seed)

    def text(median_words: float) -> str:
        count = max(1, int(rng.lognormvariate(0, 0.9) * median_words))
        return " ".join(rng.choice(WORDS) for _ in range(count))

    return [{"prompt": text(32), "response": text(48)} for _ in range(n)]


def machine() -> str:
    from bench.common import machine as record

    here = record()
    return f"{here['processor']}, {here['physical_cores']} physical / {here['cpu_count']} logical cores"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--model", default="llama-2-7b")
    args = parser.parse_args()

    from autotune.data.lengths import collect_texts, measure_lengths, prompt_counts, response_counts
    from autotune.data.records import read_sample
    from autotune.models.catalog import resolve_model
    from autotune.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model(args.model))
    tokenizer(["warm up"] * 8)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for record in synthetic_records(args.records):
                f.write(json.dumps(record) + "\n")
        start = time.perf_counter()
        report = measure_lengths(path, args.model)
        end_to_end = time.perf_counter() - start
        texts = collect_texts(read_sample(path)[0], "prompt", "response", tokenizer)
        start = time.perf_counter()
        prompt_counts(tokenizer, texts)
        response_counts(tokenizer, texts)
        tokenize_only = time.perf_counter() - start
        command_seconds, command_rss = _command(path, args.model)
    tokens = int(report.prompts.sum() + report.responses.sum())
    medians = [float(np.median(c)) for c in (report.prompts, report.responses)]
    print(f"machine: {machine()}")
    counted = len(report.prompts)
    print(
        f"{args.records:,} records, {counted:,} counted ({tokens:,} tokens; median prompt {medians[0]:.0f}, "
        f"response {medians[1]:.0f}), model {args.model}"
    )
    rate, token_rate = args.records / end_to_end, tokens / tokenize_only
    print(f"end to end (read + tokenize + stats): {rate:,.0f} records/s ({end_to_end:.2f} s)")
    print(f"tokenizing only: {token_rate:,.0f} tokens/s")
    rss = command_rss / 2**30
    print(f"`autotune lengths` as a fresh process: {command_seconds:.1f} s, peak RSS {rss:.2f} GiB")


def _command(path: Path, model: str) -> tuple[float, int]:
    """Wall seconds and peak resident bytes of `autotune lengths PATH --model MODEL --json`, run anew."""
    import resource
    import subprocess
    import sys

    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "autotune", "lengths", str(path), "--model", model, "--json"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - start
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


if __name__ == "__main__":
    main()
