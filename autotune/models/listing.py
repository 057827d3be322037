"""`autotune models`: the registry's rows and their rendering, without importing torch or transformers.

Building every model on the `meta` device to count its parameters (`registry.count_parameters`) costs a
second, and importing torch and transformers for it several more: far too slow for a list. The counts are
shipped instead, each keyed by a hash of the config file it was counted from; a config that changed since (or
a model added without a count) is counted exactly, the slow way, so a stale table is slow, never wrong. A test
keeps the table current.

    rows = model_rows()          # name, role, architecture, parameters, layers, hidden, vocab, source
    print_model_table(rows)      # a table on a terminal, plain columns in a pipe: names are never cut
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from autotune.models.names import MODELS

__all__ = ["PARAMETERS", "config_hash", "model_rows", "plain_table", "print_model_table"]

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
COLUMNS = ("name", "role", "architecture", "parameters", "layers", "hidden", "vocab")
NUMERIC = ("parameters", "layers", "hidden", "vocab")
TITLE = "models (architectures shipped with autotune; random weights unless a local directory)"

# name -> (config_hash of its config file, exact parameter count by registry.count_parameters: tied weights
# once; the reward models with their one-output head)
PARAMETERS: dict[str, tuple[str, int]] = {
    "llama-2-7b": ("7b77e1affeaa", 6_738_415_616),
    "llama-2-13b": ("dfd6a5996991", 13_015_864_320),
    "tinyllama-1.1b": ("824c64041f37", 1_100_048_384),
    "qwen2.5-0.5b": ("920c3dc42a29", 494_032_768),
    "qwen2.5-1.5b": ("52796cf71d03", 1_543_714_304),
    "qwen2.5-3b": ("106f52b9ceb0", 3_085_938_688),
    "qwen2.5-7b": ("1a6d3b11a964", 7_615_616_512),
    "qwen2.5-32b": ("3b7fccad0ca7", 32_763_876_352),
    "qwen2.5-72b": ("9f52fefe1450", 72_706_203_648),
    "qwen2-7b": ("d9166ed5e3e4", 7_615_616_512),
    "qwen2-72b": ("9f52fefe1450", 72_706_203_648),
    "deepseek-llm-7b": ("863bba8f2617", 6_910_365_696),
    "deberta-v3-large": ("f4a7eeea2e8f", 435_062_785),
    "tiny-llama": ("70b40305c977", 4_178_240),
    "tiny-qwen2": ("81cf43aecf2f", 9_798_208),
    "small-llama": ("780562bc8deb", 35_197_824),
    "tiny-deberta": ("b87785bd8301", 8_278_017),
}


def config_hash(name: str) -> str:
    """The first 12 hex digits of the SHA-256 of a registry model's config file."""
    return hashlib.sha256((CONFIG_DIR / f"{name}.json").read_bytes()).hexdigest()[:12]


def model_rows() -> list[dict[str, Any]]:
    """One row per registry model, in the registry's order (fresh dicts: callers may modify them)."""
    return [_row(name, role, origin) for name, (role, origin) in MODELS.items()]


def _row(name: str, role: str, origin: str) -> dict[str, Any]:
    config = json.loads((CONFIG_DIR / f"{name}.json").read_text(encoding="utf-8"))
    architecture = (config.get("architectures") or [config["model_type"]])[0]
    reward = role == "reward" or architecture.endswith("ForSequenceClassification")
    return {
        "name": name,
        "role": role,
        "architecture": architecture,
        "parameters": _parameters(name, "reward" if reward else "causal_lm"),
        "layers": config["num_hidden_layers"],
        "hidden": config["hidden_size"],
        "vocab": config["vocab_size"],
        "source": origin,
    }


def _parameters(name: str, kind: str) -> int:
    shipped = PARAMETERS.get(name)
    if shipped is not None and shipped[0] == config_hash(name):
        return shipped[1]
    from autotune.models.catalog import (
        count_parameters,
        resolve_model,
    )  # torch: only when the table is stale

    return count_parameters(resolve_model(name), kind)


def _cells(row: dict[str, Any]) -> list[str]:
    params = row["parameters"]
    shown = f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.2f}M"
    return [str(row[c]) if c != "parameters" else shown for c in COLUMNS]


def _widths(rows: list[dict[str, Any]]) -> list[int]:
    lines = [list(COLUMNS)] + [_cells(row) for row in rows]
    return [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]


def plain_table(rows: list[dict[str, Any]]) -> str:
    """Columns padded to their widest cell, no borders and nothing cut: for a pipe (grep, awk, cut)."""
    widths = _widths(rows)
    return "\n".join(
        "  ".join(
            cell.rjust(width) if column in NUMERIC else cell.ljust(width)
            for cell, width, column in zip(line, widths, COLUMNS, strict=True)
        ).rstrip()
        for line in [list(COLUMNS)] + [_cells(row) for row in rows]
    )


def print_model_table(rows: list[dict[str, Any]], console: Any = None) -> None:
    """A rich table on a terminal wide enough for every cell whole, else plain columns: a name is what the
    user types, so it is never cut (rich shrinks a table to the width by cutting or folding cells)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    bordered = sum(width + 3 for width in _widths(rows)) + 1  # "│ cell " per column, then "│"
    if not console.is_terminal or console.width < bordered:
        console.print(plain_table(rows), markup=False, highlight=False, soft_wrap=True)
        return
    table = Table(title=TITLE)
    for column in COLUMNS:
        table.add_column(column, justify="right" if column in NUMERIC else "left", no_wrap=True)
    for row in rows:
        table.add_row(*_cells(row))
    console.print(table)
