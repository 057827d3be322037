r"""A launch script evaluated by bash itself, with every command that could act on the machine skipped.

    result = evaluate_script(Path("run_qwen2-7b.sh"))
    result.commands[0].argv  # ('python3', '-m', 'verl.trainer.main_ppo', 'data.train_batch_size=8', ...)

Bash is the parser of a bash script, as Hydra is of an override: branches, `source`, arrays, `$((...))`,
functions, quoting and redirections are bash's to decide. `bash_sandbox.sh` runs the script under a DEBUG
trap that lets bash run only what changes the shell itself (assignments, the script's functions, builtins
such as `cd`, `source`, `eval`, `printf`) and skips every other command before bash opens its redirections,
recording it with the arguments bash expanded for it. The trainer's launch is one of those commands. PATH
names an empty folder, stdin is empty, the environment is the user's (a script's `${VAR:-default}` reads it
as bash would), and bash gets `TIME_LIMIT` seconds. What bash cannot evaluate that way is one line, never a
guess.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from autotune.errors import UserError, single_line

__all__ = ["TIME_LIMIT", "BashCommand", "Evaluation", "evaluate_script"]

TIME_LIMIT = 20.0  # seconds: a launch script sets variables and starts a command; it does not wait
PURE = ("dirname", "basename", "realpath", "readlink", "seq", "expr")  # programs that only compute text
_DROPPED_ENV = ("BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "CDPATH", "GLOBIGNORE", "PROMPT_COMMAND", "IFS")


@dataclass(frozen=True)
class BashCommand:
    """A command bash would have run: where it is written and its arguments as bash expanded them."""

    file: str
    line: int
    text: str  # as bash prints it, before expansion
    argv: tuple[str, ...]


@dataclass
class Evaluation:
    commands: list[BashCommand] = field(default_factory=list)  # skipped commands, in the order bash met them
    markers: dict[str, str] = field(default_factory=dict)  # a skipped command's stand-in output -> its text
    refused: list[BashCommand] = field(default_factory=list)  # builtins and redirections not run
    unreadable: list[BashCommand] = field(default_factory=list)  # commands bash could not expand
    errors: list[str] = field(default_factory=list)  # what bash said on stderr


def evaluate_script(path: Path, where: str | None = None) -> Evaluation:
    """Run `path` in the sandbox; UserError when bash is missing, the file has CRLF line endings, or bash
    does not finish in TIME_LIMIT seconds."""
    where = where or str(path)
    raw = path.read_bytes()
    if b"\r\n" in raw:
        line = raw[: raw.index(b"\r\n")].count(b"\n") + 1
        raise UserError(
            f"{where}:{line}: Windows line endings (CRLF): bash fails on them ($'\\r': command not found); "
            f"convert the file with `dos2unix {where}` or `sed -i 's/\\r$//' {where}`"
        )
    bash = shutil.which("bash")
    if bash is None:
        raise UserError(f"{where}: reading a launch script needs bash, and none is on PATH: install bash")
    sandbox = resources.files("autotune.formats").joinpath("bash_sandbox.sh")
    with tempfile.TemporaryDirectory(prefix="autotune-bash-") as work, resources.as_file(sandbox) as program:
        record = Path(work) / "record"
        empty = Path(work) / "path"
        empty.mkdir()
        try:
            done = subprocess.run(
                [bash, "--noprofile", "--norc", str(program), str(record), work, str(path.resolve())],
                env=_environment(str(empty)),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=TIME_LIMIT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise UserError(
                f"{where}: bash did not finish reading the script in {TIME_LIMIT:.0f} s (a loop that waits "
                f"for something?): autotune reads launch scripts that set variables and start the trainer"
            ) from None
        evaluation = _parse(record.read_bytes() if record.exists() else b"")
        evaluation.errors = _errors(done.stderr.decode(errors="replace"), program, path, where)
    return evaluation


def _environment(empty_path: str) -> dict[str, str]:
    """The user's environment, with PATH an empty folder and nothing that changes how bash starts."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _DROPPED_ENV and not key.startswith(("BASH_FUNC_", "__AUTOTUNE_"))
    }
    env["PATH"] = empty_path
    for name in PURE:
        found = shutil.which(name)
        if found:
            env[f"__AUTOTUNE_PURE_{name}"] = found
    return env


def _parse(data: bytes) -> Evaluation:
    """The sandbox's records: KIND, FILE, LINE, COMMAND, ARGC, ARGV... each NUL-terminated."""
    fields = data.decode(errors="replace").split("\0")
    evaluation, i = Evaluation(), 0
    while i + 5 <= len(fields) - 1:
        kind, file, line, text, count = fields[i : i + 5]
        argv = tuple(fields[i + 5 : i + 5 + int(count)])
        i += 5 + int(count)
        command = BashCommand(file, int(line) if line.isdigit() else 0, text, argv)
        if kind == "marker":
            evaluation.markers[argv[0]] = text
        elif kind == "command":
            evaluation.commands.append(command)
        elif kind in ("builtin", "redirect"):
            evaluation.refused.append(command)
        elif kind == "unreadable":
            evaluation.unreadable.append(command)
    return evaluation


def _errors(stderr: str, program: Path, path: Path, where: str) -> list[str]:
    """Bash's own complaints about the script, named as the user wrote it (not the sandbox's internals)."""
    lines = []
    for line in stderr.splitlines():
        line = line.replace(str(path.resolve()), where).replace(str(program), "autotune")
        if line.strip() and not line.startswith("+"):  # `set -x` traces, the sandbox's included
            lines.append(single_line(line))
    return lines
