"""The data of `--data` applied to a study: length knobs bounded below by the data's suggestions, and the
prompt texts the probes draw from."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

__all__ = ["PROMPTS_LIMIT", "data_prompts_file", "fit_space_to_data", "length_knob_at_least"]

PROMPTS_LIMIT = 10_000  # prompt texts of --data the probes draw from


def length_knob_at_least(space, name: str, minimum: int) -> Any:
    """The knob's YAML value with every length below `minimum` dropped and `minimum` itself offered.

    A fixed length becomes the data's suggestion; a range keeps its values at or above it, plus it.
    """
    spec = space.knob(name)
    if spec.kind == "fixed":
        return minimum
    kept = sorted({value for value in spec.values() if value > minimum} | {minimum})
    return kept[0] if len(kept) == 1 else {"choices": kept}


def fit_space_to_data(space, report) -> tuple[Any, list[str]]:
    """Bound the length knobs below by the data's suggestions (p95 prompts, p90 responses); a tuned length
    left with one value is no longer tuned."""
    from autotune.space.loading import space_from_dict

    limits = {
        "max_prompt_length": report.suggested_prompt_length,
        "max_response_length": report.suggested_response_length,
    }
    data = copy.deepcopy(dict(space.raw))
    notes = []
    for name, minimum in limits.items():
        if minimum is None:
            notes.append(f"{name}: the data has no responses; the space's values are kept")
            continue
        data["knobs"][name] = length_knob_at_least(space, name, minimum)
        notes.append(f"{name} >= {minimum} (the data's suggestion): {data['knobs'][name]}")
        if not isinstance(data["knobs"][name], dict) and name in data.get("tune", []):
            data["tune"] = [knob for knob in data["tune"] if knob != name]  # one value left: nothing to tune
    return space_from_dict(data, source=space.source, cores=space.cores, name=space.name), notes


def data_prompts_file(report, out_dir: Path, limit: int = PROMPTS_LIMIT) -> Path:
    """The data's prompt texts (templated when chat), for the probe's DataLoader to tokenize."""
    path = out_dir / "data_prompts.json"
    path.write_text(json.dumps(report.prompt_texts[:limit]))
    return path
