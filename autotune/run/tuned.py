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

import yaml

from autotune.config.knobs import ProbeConfig
from autotune.errors import UserError
from autotune.files import write_whole
from autotune.formats.launch_script import looks_like_launch_script
from autotune.formats.read import read_target
from autotune.formats.trl_read import parse_trl
from autotune.formats.tuned_file import (
    short_diff,
    tune_launch_script,
    tune_override_file,
    tune_yaml_config,
    tuned_path,
)
from autotune.formats.tuned_values import trl_changes, verl_changes
from autotune.formats.verl import parse_overrides, verl_rule_violations
from autotune.report.write import SUMMARY_FILE
from autotune.run.from_file import JobFile, mini_batch_of
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
    if job.trainer == "trl":
        trl = trl_changes(best, knobs, yaml.safe_load(text) or {})
        return (tune_yaml_config(text, trl) if trl else text), trl
    verl = verl_changes(best, space.gpus, knobs, job.target.overrides or {})
    if not verl:
        return text, {}
    if looks_like_launch_script(text):
        called_in = job.target.call_file
        if called_in is not None and Path(called_in).resolve() != job.path.resolve():
            raise ValueError(
                f"the trainer is started in {called_in}, which the script sources: tune that file"
            )
        return tune_launch_script(text, verl, job.target.call_line or 1), dict(verl)
    return tune_override_file(text, verl), dict(verl)


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
    if mini_batch_of(again, job.trainer) != job.mini_batch:
        moved.append("mini_batch_size")
    if moved:
        raise UserError(f"{where}: its recipe reads differently ({', '.join(moved)}); it was not kept")
    if job.trainer == "verl":
        _check_verl_values(job, again.overrides or {}, changes, where)
        _check_verl_rules(job, again.overrides or {}, where)
    else:
        _check_trl_values(job, path, changes, where)


def _check_verl_values(job: JobFile, values: dict[str, Any], changes: dict[str, Any], where: str) -> None:
    """Every key of the original reads the same, but the changed ones, which read their new values."""
    wanted = parse_overrides("".join(f"{key}={value}\n" for key, value in changes.items()), where)
    original = job.target.overrides or {}
    expected = {**original, **wanted}
    differing = sorted(key for key in expected.keys() | values.keys() if expected.get(key) != values.get(key))
    if differing:
        shown = ", ".join(
            f"{key}={values.get(key)!r} (wanted {expected.get(key)!r})" for key in differing[:3]
        )
        raise UserError(f"{where}: reads {shown}; it was not kept")


def _check_verl_rules(job: JobFile, values: dict[str, Any], where: str) -> None:
    """verl's own start-up rules on the job's GPUs: a value measured on a rehearsal (other GPUs, another
    batch) may not divide the real job's share of the batch. Rules the original already broke are its own."""
    before = set(verl_rule_violations(job.target.overrides or {}, job.gpus))
    broken = [rule for rule in verl_rule_violations(values, job.gpus) if rule not in before]
    if broken:
        raise UserError(
            f"{where}: verl would refuse it on the job's {job.gpus} GPU(s): {broken[0]}; not kept"
        )


def _check_trl_values(job: JobFile, path: Path, changes: dict[str, Any], where: str) -> None:
    """TRL's parser reads every field the original sets as the original, but the changed ones, which read
    their new values (fields TRL derives, such as steps_per_generation, follow them and are the recipe
    check's)."""
    written = yaml.safe_load(job.path.read_text(encoding="utf-8")) or {}
    before = parse_trl(written, str(job.path))
    after = parse_trl(yaml.safe_load(path.read_text(encoding="utf-8")) or {}, where)
    aliases = {"gradient_checkpointing", "activation_checkpointing"}
    allowed = set(changes) | (aliases if aliases & set(changes) else set())
    wrong = [key for key in written if key in before and key not in allowed and before[key] != after.get(key)]
    wrong += [key for key, value in changes.items() if after.get(key) != value]
    if wrong:
        shown = ", ".join(f"{key}={after.get(key)!r}" for key in wrong[:3])
        raise UserError(f"{where}: TRL reads {shown}, which the study did not set; it was not kept")


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
