"""The user's own file handed back tuned (`run --from`): `<out>/<stem>.tuned.<ext>`, only the searched system
knobs changed, checked by reading it back as the trainer reads it.

    tuned = write_tuned_file(job, space, best, out_dir)
    tuned.path, tuned.diff      # the file, and its changed lines as `name:LINE: - old` / `+ new`

The check: the copy reads back (bash runs a script again; Hydra's and TRL's parsers read the values) with
the original's recipe and every key the study did not change as the original has it, and the tuned values
where they changed; a script also passes `bash -n`. A copy that fails is not kept: the run says why, and the
report's own files stand.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.config.knobs import ProbeConfig
from autotune.errors import UserError
from autotune.files import write_whole
from autotune.formats.read import read_target
from autotune.formats.tuned_file import (
    short_diff,
    tuned_path,
)
from autotune.report.write import SUMMARY_FILE
from autotune.run.from_file import JobFile
from autotune.space.model import SearchSpace
from autotune.space.specs import SYSTEM_KNOBS
from autotune.status import Attr

__all__ = [
    "RECIPE_FIELDS",
    "TunedFile",
    "hand_back",
    "searched_system_knobs",
    "tuned_text",
    "write_tuned_file",
]

# what the study held: the tuned copy must read back with these as the original has them
RECIPE_FIELDS = (
    "train_batch_size",
    "max_prompt_length",
    "max_response_length",
    "algorithm",
    "rollout_n",
    "use_lora",
    "lora_r",
    "lora_alpha",
    "kl_coef",
)


@dataclass
class TunedFile:
    path: Path
    changes: dict[str, Any]  # the trainer's keys written, with their new values
    diff: list[str] = field(default_factory=list)


def searched_system_knobs(space: SearchSpace) -> list[str]:
    """The system knobs the study searched: the only ones the tuned copy may change."""
    return [spec.name for spec in space.knobs if spec.searched and spec.name in SYSTEM_KNOBS]


def tuned_text(job: JobFile, space: SearchSpace, best: ProbeConfig) -> tuple[str, dict[str, Any]]:
    """The file's text with the best configuration's searched system values, and the keys that changed.
    ValueError: the file cannot be edited so (its trainer call names its module through a variable, ...)."""
    text = job.path.read_text(encoding="utf-8")
    knobs = searched_system_knobs(space)
    changes = job.trainer.tuned_changes(best, space.gpus, knobs, job.target, text)
    return job.trainer.tuned_text(text, changes, job.target, job.path), changes


def write_tuned_file(job: JobFile, space: SearchSpace, best: ProbeConfig, out_dir: Path) -> TunedFile:
    """Write and check the tuned copy; UserError (one line) when it cannot be written or does not read back
    as the original with the tuned values."""
    try:
        text, changes = tuned_text(job, space, best)
    except ValueError as exc:
        raise UserError(f"cannot write the tuned copy of {job.path}: {exc}") from None
    path = tuned_path(job.path, out_dir)
    write_whole(path, text)
    try:
        _check_copy(job, path, changes)
    except UserError:
        path.unlink(missing_ok=True)
        raise
    before = job.path.read_text(encoding="utf-8")
    return TunedFile(path, changes, short_diff(before, text, job.path.name))


def _check_copy(job: JobFile, path: Path, changes: dict[str, Any]) -> None:
    """The copy as its trainer reads it: the original's recipe and untouched keys, the tuned values."""
    where = f"the tuned copy {path}"
    if job.target.call_line is not None:
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
        if done.returncode:
            raise UserError(f"{where}: bash -n refuses it: {done.stderr.strip().splitlines()[0]}")
    again = read_target(path, call=job.call)
    original = job.config
    if again.config is None:
        raise UserError(f"{where}: it no longer gives the batch sizes; it was not kept")
    moved = [name for name in RECIPE_FIELDS if getattr(again.config, name) != getattr(original, name)]
    if job.trainer.mini_batch(again) != job.mini_batch:
        moved.append("mini_batch_size")
    if moved:
        raise UserError(f"{where}: its recipe reads differently ({', '.join(moved)}); it was not kept")
    job.trainer.check_copy(job.path, job.target, path, again, changes, job.gpus)


def hand_back(job: JobFile, file_space: Any, space: SearchSpace, result: Any, narrator: Any) -> None:
    """After the report: write the tuned copy of the user's file beside it, say its diff in the terminal,
    and add both to report.md and summary.json (`result`: the written report's ReportResult)."""
    out_dir = result.out_dir
    if result.chosen is None:
        lines = [f"no feasible configuration: no tuned copy of {job.path.name} is written"]
        _add_to_report(out_dir, lines, {"source": str(job.path.resolve()), "written": None})
        for line in lines:
            narrator.say(line, markup=False)
        return
    best = ProbeConfig(**result.chosen.user_attrs[Attr.CONFIG])
    overridden = list(file_space.overridden) if file_space is not None else []
    try:
        tuned = write_tuned_file(job, space, best, out_dir)
    except UserError as exc:
        entry: dict[str, Any] = {"source": str(job.path.resolve()), "written": None, "why": str(exc)}
        _add_to_report(out_dir, [str(exc)], entry)
        narrator.say(str(exc), markup=False)
        return
    lines = _tuned_lines(tuned, overridden)
    for line in lines:
        narrator.say(line, markup=False)
    entry = {
        "source": str(job.path.resolve()),
        "written": str(tuned.path.resolve()),
        "changes": tuned.changes,
        "overridden": overridden,
    }
    _add_to_report(out_dir, lines, entry)


def _tuned_lines(tuned: TunedFile, overridden: list[str]) -> list[str]:
    if not tuned.changes:
        head = f"your file, tuned: {tuned.path.resolve()} (unchanged: your settings measured best)"
    else:
        head = f"your file, tuned: {tuned.path.resolve()} ({len(tuned.changes)} key(s) changed):"
    lines = [head, *("  " + line for line in tuned.diff)]
    if overridden:
        lines.append(
            f"  measured on a rehearsal ({'; '.join(overridden)}): confirm on the job's own GPUs before a "
            f"long run"
        )
    return lines


def _add_to_report(out_dir: Path, lines: list[str], entry: dict[str, Any]) -> None:
    """report.md gets the lines as a section; summary.json the entry under `tuned_file`."""
    report = out_dir / "report.md"
    if report.exists():
        body = "\n".join(lines)
        text = report.read_text(encoding="utf-8")
        write_whole(report, f"{text.rstrip()}\n\n## Your file, tuned\n\n```\n{body}\n```\n")
    summary = out_dir / SUMMARY_FILE
    if summary.exists():
        data = json.loads(summary.read_text(encoding="utf-8"))
        data["tuned_file"] = entry
        write_whole(summary, json.dumps(data, indent=2) + "\n")
