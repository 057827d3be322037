"""Train the project's offline tokenizer: `autotune/models/tokenizer_files/autotune-bpe.json`.

Registry models (`llama-2-7b`, `qwen2.5-0.5b`, ...) ship without their real tokenizers (nothing can be
downloaded), so the probe counts tokens with this byte-level BPE instead. It is trained, deterministically,
on English prose available on every machine that runs Python:

- the docstrings (module, class, function) and the comments of the standard library's `.py` sources, files
  sorted by path, test suites and `site-packages` excluded;
- the Python reference documentation that ships as `pydoc_data.topics` (the text `help()` shows), topics
  sorted by name.

Same Python version -> same corpus -> same file (checked by `corpus_sha256` in the meta file). A different
Python version gives a slightly different corpus and therefore a slightly different vocabulary; regenerate
only on purpose and commit both files.

    python tools/make_tokenizer.py          # writes autotune/models/tokenizer_files/autotune-bpe{,.meta}.json
    python tools/make_tokenizer.py --check  # exit 1 if the shipped file differs from a fresh build
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import sys
import sysconfig
import tokenize
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# At most (min_frequency=2 may stop earlier); below every registry model's vocab (smallest: Llama's 32,000).
VOCAB_SIZE = 24_576
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]  # ids 0..4: bos=1, eos=2 as Llama
SKIPPED_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}
OUT_DIR = Path(__file__).resolve().parent.parent / "autotune" / "models" / "tokenizer_files"
OUT_FILE = OUT_DIR / "autotune-bpe.json"
META_FILE = OUT_DIR / "autotune-bpe.meta.json"


def stdlib_sources(root: Path) -> list[Path]:
    """The standard library's .py files, sorted, without tests and third-party packages."""
    files = []
    for path in sorted(root.rglob("*.py")):
        if SKIPPED_DIRS.isdisjoint(path.relative_to(root).parts):
            files.append(path)
    return files


def docstrings(path: Path) -> Iterator[str]:
    """Module, class and function docstrings of one source file, in source order."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node)
            if text:
                yield text


def comments(path: Path) -> str:
    """The `#` comments of one source file, one per line, without the `#`."""
    lines = []
    try:
        source = path.read_text(encoding="utf-8")
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT and (text := token.string.lstrip("#").strip()):
                lines.append(text)
    except (SyntaxError, UnicodeDecodeError, tokenize.TokenError):
        return ""
    return "\n".join(lines)


def corpus() -> list[str]:
    """The training texts, in a deterministic order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in stdlib_sources(root):
        texts.extend(docstrings(path))
        if text := comments(path):
            texts.append(text)
    from pydoc_data.topics import topics

    texts.extend(topics[name] for name in sorted(topics))
    return texts


def build_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE with Llama-like digit splitting and a `<s>` prefix on encodings."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),  # numbers digit by digit, as Llama and Qwen do
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def add_post_processor(tokenizer: Tokenizer) -> None:
    bos = "<s>"
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A",
                pair=f"{bos} $A {bos}:1 $B:1",
                special_tokens=[(bos, tokenizer.token_to_id(bos))],
            ),
        ]
    )


def train(texts: list[str]) -> Tokenizer:
    tokenizer = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    add_post_processor(tokenizer)
    return tokenizer


def meta(texts: list[str], tokenizer: Tokenizer) -> dict:
    digest = hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()
    return {
        "file": OUT_FILE.name,
        "vocab_size": tokenizer.get_vocab_size(),
        "special_tokens": {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS},
        "corpus": "docstrings and comments of the Python standard library sources + pydoc_data.topics",
        "corpus_texts": len(texts),
        "corpus_chars": sum(len(t) for t in texts),
        "corpus_sha256": digest,
        "python": sys.version.split()[0],
        "made_by": "tools/make_tokenizer.py",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped file, write nothing")
    args = parser.parse_args(argv)

    texts = corpus()
    tokenizer = train(texts)
    text = tokenizer.to_str(pretty=False)
    if args.check:
        same = OUT_FILE.exists() and OUT_FILE.read_text(encoding="utf-8") == text
        print(f"{OUT_FILE}: {'up to date' if same else 'differs from a fresh build'}")
        return 0 if same else 1
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    OUT_FILE.write_text(text, encoding="utf-8")
    META_FILE.write_text(json.dumps(meta(texts, tokenizer), indent=2) + "\n", encoding="utf-8")
    size_kb = OUT_FILE.stat().st_size / 1024
    print(f"wrote {OUT_FILE} ({tokenizer.get_vocab_size()} tokens, {size_kb:.0f} KiB, {len(texts)} texts)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
