"""`autotune spaces`: the shipped search spaces, one line each, so a user can pick `run --space NAME`.

Each line is the space's name, its model and GPUs, and its `description:` (the first comment line of a
space without one). The YAML is read, not checked: listing must not need torch, the model registry or this
machine's cores, and `autotune run --space NAME` checks the space it uses.

    rows = space_rows()        # name, description, model, reward_model, gpus, memory_budget_gib, path
    print(space_lines(rows))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.space.schema import read_space, shipped_spaces

__all__ = ["space_lines", "space_rows"]


def space_rows() -> list[dict[str, Any]]:
    """One row per shipped space, sorted by name."""
    return [_row(name) for name in shipped_spaces()]


def _row(name: str) -> dict[str, Any]:
    data, source, _ = read_space(name)
    data = data if isinstance(data, dict) else {}
    return {
        "name": name,
        "description": str(data.get("description") or _first_comment(Path(source))),
        "model": data.get("model"),
        "reward_model": data.get("reward_model"),
        "gpus": data.get("gpus"),
        "memory_budget_gib": data.get("memory_budget_gib"),
        "path": source,
    }


def _first_comment(path: Path) -> str:
    """The first comment line's text: what a space without a description says about itself first."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") and line.lstrip("#").strip():
            return line.lstrip("#").strip()
    return ""


def space_lines(rows: list[dict[str, Any]]) -> str:
    """`name  model on N GPUs  description`, one line per space, the first two columns aligned."""
    where = [_where(row) for row in rows]
    name_width = max((len(row["name"]) for row in rows), default=0)
    where_width = max((len(w) for w in where), default=0)
    return "\n".join(
        f"{row['name']:<{name_width}}  {w:<{where_width}}  {row['description']}".rstrip()
        for row, w in zip(rows, where, strict=True)
    )


def _where(row: dict[str, Any]) -> str:
    gpus = row["gpus"]
    unit = "GPU" if gpus == 1 else "GPUs"
    return f"{row['model'] or '?'} on {gpus if gpus is not None else '?'} {unit}"
