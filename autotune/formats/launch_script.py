r"""A bash launch script read as verl gets it: the arguments bash hands `python3 -m verl.trainer.main_ppo`.

    read = read_launch_script(Path("run_qwen2-7b.sh"), where="run_qwen2-7b.sh")
    read.lines      # [Line(12, "algorithm.adv_estimator=grpo"), ...]: each override with its line
    read.notes      # what the reader could not know: "$@" read as none, a value from a command not run

Bash evaluates the script (autotune.formats.bash_eval): its branches, `source`, arrays, `$((...))`,
functions, quoting and pipes are bash's to decide, and a wrapper (`torchrun`, `srun`, `ray job submit --`,
`sudo`, `env`) is looked through. A script that starts the trainer several times is read at `call` (1-based;
the calls are listed when it is missing). `--config-path/--config-name` compose the named YAML under the
command line's overrides (autotune.formats.verl_config_file). A value bash took from a command autotune
does not run (`$(nvidia-smi ...)`) is refused in a key autotune reads and kept as written elsewhere; an
empty value in such a key names the variable the script writes there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from autotune.errors import UserError, single_line
from autotune.formats import verl_schema
from autotune.formats.bash_eval import BashCommand, Evaluation, evaluate_script
from autotune.formats.hydra_read import Line

__all__ = [
    "MODULE",
    "LaunchRead",
    "TrainerCall",
    "looks_like_launch_script",
    "read_launch_script",
    "trainer_calls",
]

MODULE = "verl.trainer.main_ppo"
_MARKER = re.compile(r"@autotune-skipped-\d+-\d+@")
_HYDRA_FLAGS = {"--config-path": "config_path", "-cp": "config_path", "--config-name": "config_name",
                "-cn": "config_name"}  # fmt: skip


def looks_like_launch_script(text: str) -> bool:
    """A shell script: a shebang, or a command that starts verl's trainer."""
    return text.startswith("#!") or bool(re.search(r"(-m\s+verl\.trainer\.main_ppo|main_ppo\.py)\b", text))


@dataclass(frozen=True)
class TrainerCall:
    """One start of verl's trainer: where it is written and the arguments after the module."""

    command: BashCommand
    arguments: tuple[str, ...]

    @property
    def line(self) -> int:
        return self.command.line


@dataclass
class LaunchRead:
    """What the script hands the trainer, read at one call."""

    lines: list[Line]
    notes: list[str] = field(default_factory=list)
    call: TrainerCall | None = None
    calls: list[TrainerCall] = field(default_factory=list)
    config_path: str | None = None
    config_name: str | None = None


def trainer_calls(path: Path, where: str) -> tuple[list[TrainerCall], Evaluation]:
    """Every start of verl's trainer bash makes running the script, in order, and what bash did."""
    evaluation = evaluate_script(path, where)
    calls = [c for c in (_trainer_call(command) for command in evaluation.commands) if c is not None]
    return calls, evaluation


def read_launch_script(path: Path, where: str, call: int | None = None) -> LaunchRead:
    """The overrides of the script's `call`-th trainer start (the only one when None)."""
    calls, evaluation = trainer_calls(path, where)
    chosen = _choose(calls, call, evaluation, where)
    notes = _dollar_at_notes(chosen, where) + _cut_off_notes(evaluation, where)
    options, words = _hydra_options(chosen, where)
    lines = [_line(path, chosen, word, evaluation, where, notes) for word in words]
    if options.get("config_path") or options.get("config_name"):
        from autotune.formats.verl_config_file import config_file_lines

        path_given, name_given = options.get("config_path"), options.get("config_name")
        lines = config_file_lines(path_given, name_given, where, chosen.line) + lines
    return LaunchRead(lines, notes, chosen, calls, options.get("config_path"), options.get("config_name"))


def _trainer_call(command: BashCommand) -> TrainerCall | None:
    """The command when it starts verl's trainer, possibly through a wrapper (torchrun, srun, env...)."""
    argv = command.argv
    for i, word in enumerate(argv):
        if word == MODULE and i > 0 and argv[i - 1] == "-m":
            return TrainerCall(command, argv[i + 1 :])
        if word.endswith("verl/trainer/main_ppo.py") or word == "main_ppo.py":
            return TrainerCall(command, argv[i + 1 :])
    return None


def _choose(calls: list[TrainerCall], call: int | None, evaluation: Evaluation, where: str) -> TrainerCall:
    if not calls:
        raise UserError(_no_call(evaluation, where))
    listed = ", ".join(f"{i} (line {c.line})" for i, c in enumerate(calls, 1))
    if call is None and len(calls) > 1:
        raise UserError(
            f"{where}: bash starts {MODULE} {len(calls)} times: calls {listed}; choose one with --call N"
        )
    index = 1 if call is None else call
    if not 1 <= index <= len(calls):
        raise UserError(f"--call {index}: {where} starts {MODULE} {len(calls)} time(s): calls {listed}")
    return calls[index - 1]


def _no_call(evaluation: Evaluation, where: str) -> str:
    """Why no trainer start was found, in the order a user can act on it."""
    said = f"{where}: bash ran the script and it starts no `python3 -m {MODULE}`"
    unreadable = [c for c in evaluation.unreadable if MODULE in c.text or "main_ppo" in c.text]
    if unreadable:
        first = unreadable[0]
        why = _first_error(evaluation) or "bash could not expand its words"
        return f"{where}:{first.line}: the trainer's command cannot be evaluated: {_named(why, evaluation)}"
    modules = [c.argv[c.argv.index("-m") + 1] for c in evaluation.commands if "-m" in c.argv[:-1]]
    if modules:
        return f"{said}: it runs {', '.join(dict.fromkeys(modules))}; autotune reads {MODULE}'s config"
    error = _first_error(evaluation)
    return f"{said} ({_named(error, evaluation)})" if error else said


def _first_error(evaluation: Evaluation) -> str | None:
    return evaluation.errors[0] if evaluation.errors else None


def _named(text: str, evaluation: Evaluation) -> str:
    """Markers replaced by the commands they stand for."""
    return _MARKER.sub(lambda m: f"$({single_line(evaluation.markers.get(m.group(0), '...'))})", text)


def _dollar_at_notes(call: TrainerCall, where: str) -> list[str]:
    if re.search(r"\$\{?[@*]", call.command.text):
        return [f'{where}:{call.line}: "$@" (the script\'s own arguments) read as none']
    return []


def _cut_off_notes(evaluation: Evaluation, where: str) -> list[str]:
    """Overrides bash ran as commands of their own: a blank line or comment ended the trainer's command."""
    override = re.compile(r"^[+~]{0,2}[A-Za-z_]\w*(\.\w+)+=")
    return [
        f"{where}:{c.line}: {single_line(' '.join(c.argv))} runs as a command of its own (the command before "
        f"it ends there: a blank line or a comment between?): verl never gets it"
        for c in evaluation.commands
        if c.argv and override.match(c.argv[0])
    ]


def _hydra_options(call: TrainerCall, where: str) -> tuple[dict[str, str], list[str]]:
    """Hydra's own flags (config path and name) apart from the overrides."""
    options: dict[str, str] = {}
    words: list[str] = []
    arguments = list(call.arguments)
    while arguments:
        word = arguments.pop(0)
        flag, equals, value = word.partition("=")
        if flag in _HYDRA_FLAGS:
            if not equals:
                if not arguments:
                    raise UserError(f"{where}:{call.line}: {flag} has no value")
                value = arguments.pop(0)
            options[_HYDRA_FLAGS[flag]] = value
        elif word.startswith("-"):
            raise UserError(
                f"{where}:{call.line}: {single_line(word)!r}: autotune reads key=value overrides and "
                f"--config-path/--config-name, not Hydra's other flags"
            )
        else:
            words.append(word)
    return options, words


def _line(
    path: Path, call: TrainerCall, word: str, evaluation: Evaluation, where: str, notes: list[str]
) -> Line:
    """The override as Hydra gets it, numbered by the line of the script that writes its key."""
    key = word.partition("=")[0].lstrip("+~")
    number = _written_on(path, call, key)
    markers = _MARKER.findall(word)
    if markers:
        commands = ", ".join(f"`{single_line(evaluation.markers.get(m, '?'))}`" for m in markers)
        if verl_schema.kind(key) is not None:
            raise UserError(
                f"{where}:{number}: {key}: its value comes from {commands}, which autotune does not run: "
                f"write the value in the script"
            )
        notes.append(f"{where}:{number}: {key}: its value comes from {commands}, not run: kept as written")
        value = word.partition("=")[2]
        written = _MARKER.sub(lambda m: f"$({evaluation.markers.get(m.group(0), '')})", value)
        escaped = written.replace("\\", "\\\\").replace("'", "\\'")
        return Line(number, f"{word.partition('=')[0]}='{escaped}'")
    if word.endswith("=") and verl_schema.kind(key) is not None:
        source = _written_value(path, call, key)
        raise UserError(
            f"{where}:{number}: {key} is empty where bash runs it"
            + (f" (the script writes {key}={source})" if source else "")
            + ": set the variable in the script, or write the value"
        )
    return Line(number, word)


def _source_lines(path: Path, call: TrainerCall) -> list[str] | None:
    """The lines of the file the call is written in, when it is the script itself."""
    if Path(call.command.file).resolve() != path.resolve():
        return None
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def _written_on(path: Path, call: TrainerCall, key: str) -> int:
    """The first line at or after the call that writes `key=`; else the call's line."""
    lines = _source_lines(path, call)
    pattern = re.compile(rf"(^|[\s'\"+]){re.escape(key)}=")
    for number in range(max(call.line, 1), len(lines or []) + 1):
        if pattern.search((lines or [])[number - 1]):
            return number
    return call.line


def _written_value(path: Path, call: TrainerCall, key: str) -> str | None:
    lines = _source_lines(path, call) or []
    match = re.search(rf"(?:^|[\s'\"+]){re.escape(key)}=(\S+)", "\n".join(lines))
    return match.group(1).rstrip("\\").strip("\"'") if match else None
