r"""A bash launch script read as verl gets it: its `python3 -m verl.trainer.main_ppo` command's arguments.

    lines, notes = script_overrides(Path("run_qwen2-7b.sh").read_text(), where="run_qwen2-7b.sh")
    # [Line(5, "algorithm.adv_estimator=grpo"), ...]: each override with the line it is written on

verl's example scripts are `python3 -m verl.trainer.main_ppo \` followed by `key=value \` lines, sometimes
ending in `$@`, with shell variables set earlier (`MODEL=...`, `export X=...`). Words are split by Python's
`shlex` (bash's quoting); `$NAME`, `${NAME}` and `${NAME:-default}` are expanded from the variables the
script itself assigns, as bash would (no expansion inside single quotes, word splitting outside quotes). A
variable the script does not set (`$HOME`, a command's output) is never guessed: in a key autotune reads it
is a UserError naming it; elsewhere (a data path, a run name) the value is kept as written and a note says so.
`$@` (the script's own arguments) reads as none, with a note.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from autotune.errors import UserError, single_line
from autotune.formats import verl_schema
from autotune.formats.hydra_read import Line

__all__ = ["looks_like_launch_script", "script_overrides"]

MODULE = "verl.trainer.main_ppo"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGNMENT = re.compile(rf"^({_NAME})=(.*)$", re.S)
_MARK = "__autotune_unset_{}__"  # stands for an unresolved variable until the word is known
_MARKED = re.compile(r"__autotune_unset_(\d+)__")
_DECLARE = ("export", "local", "readonly", "declare")


def looks_like_launch_script(text: str) -> bool:
    """A shell script: a shebang, or a command that starts verl's trainer."""
    return text.startswith("#!") or bool(re.search(r"(-m\s+verl\.trainer\.main_ppo|main_ppo\.py)\b", text))


@dataclass
class _Shell:
    where: str
    variables: dict[str, str] = field(default_factory=dict)
    unset: dict[str, str] = field(default_factory=dict)  # variable -> why it has no value
    marks: list[str] = field(default_factory=list)  # _MARK index -> the variable's name
    notes: list[str] = field(default_factory=list)


def script_overrides(text: str, where: str) -> tuple[list[Line], list[str]]:
    """The main_ppo command's overrides, each with its line, and notes on what was not expanded."""
    shell = _Shell(where)
    commands = []
    for segments in _commands(text, where):
        words = [(number, word) for number, part in segments for word in _words(shell, number, part)]
        if _is_main_ppo(words):
            commands.append(words)
        elif words and all(_assign(shell, word) for _, word in _declared(words)):
            continue
    if not commands:
        raise UserError(f"{where}: a shell script without a `python3 -m {MODULE}` command: nothing to read")
    if len(commands) > 1:
        starts = ", ".join(str(c[0][0]) for c in commands)
        raise UserError(
            f"{where}: {MODULE} is started {len(commands)} times (lines {starts}): autotune reads one"
        )
    return _overrides(shell, commands[0]), shell.notes


def _commands(text: str, where: str) -> list[list[tuple[int, str]]]:
    """Physical lines joined by a trailing backslash into commands: [(line number, text), ...] each. A
    backslash before an empty line or the end of the file ends the command there, and the lines after it
    would run as commands of their own: refused, naming the line."""
    lines = text.splitlines()
    commands: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    for number, raw in enumerate(lines, 1):
        comment = raw.lstrip().startswith("#")  # a backslash in a comment continues nothing
        continued = len(raw) - len(raw.rstrip("\\")) if raw.endswith("\\") and not comment else 0
        if current and (comment or not raw.strip()):
            previous = current[-1][0]
            raise UserError(
                f"{where}:{previous}: {single_line(lines[previous - 1].strip())!r} ends with a "
                f"backslash, but line {number} is {'a comment' if comment else 'empty'}: the command "
                f"ends there"
            )
        if comment:
            continue
        current.append((number, raw[:-1] if continued % 2 else raw))
        if not continued % 2:
            commands.append(current)
            current = []
    if current:
        last = current[-1][0]
        raise UserError(
            f"{where}:{last}: {single_line(lines[last - 1].strip())!r} ends with a backslash "
            f"at the end of the file: the command it continues is cut off"
        )
    return commands


def _words(shell: _Shell, number: int, text: str) -> list[str]:
    try:
        return shlex.split(_expand(shell, number, text), comments=True)
    except ValueError as exc:  # shlex: "No closing quotation", "No escaped character"
        raise UserError(f"{shell.where}:{number}: {single_line(text.strip())!r}: {exc}") from None


def _expand(shell: _Shell, number: int, text: str) -> str:
    """`text` with the script's variables substituted, quoted so that shlex splits it as bash would."""
    if re.search(r'"?\$[@*]"?', text):
        shell.notes.append(f"{shell.where}:{number}: $@ (the script's own arguments) read as none")
        text = re.sub(r'"\$[@*]"|\$[@*]', "", text)
    out, quote, i = [], "", 0
    while i < len(text):
        char = text[i]
        if char == "\\" and quote != "'":
            out.append(text[i : i + 2])
            i += 2
            continue
        if char in "'\"" and quote in ("", char):
            quote = "" if quote else char
        elif char == "#" and not quote and (i == 0 or text[i - 1].isspace()):
            out.append(text[i:])  # a comment: shlex drops it
            break
        elif char in "$`" and quote != "'":
            name, value, i = _variable(shell, text, i)
            if name is not None:
                out.append(_quoted(shell, name, value, quote))
                continue
        out.append(char)
        i += 1
    return "".join(out)


def _variable(shell: _Shell, text: str, i: int) -> tuple[str | None, str | None, int]:
    """The variable at text[i] (`$NAME`, `${NAME}`, `${NAME:-word}`), its value (None: unset) and where the
    text goes on; (None, None, i) when it is not a variable (a lone `$`)."""
    rest = text[i:]
    braced = re.match(rf"\$\{{({_NAME})(?:(:?[-=])([^}}]*))?\}}", rest)
    plain = re.match(rf"\$({_NAME}|[0-9])", rest)
    if braced:
        name, operator, word = braced.groups()
        value = shell.variables.get(name)
        if value is None or (operator and operator.startswith(":") and not value):
            value = word if operator else None
        return name, value, i + braced.end()
    if plain:
        return plain.group(1), shell.variables.get(plain.group(1)), i + plain.end()
    if rest.startswith(("$(", "`", "${")):  # command substitution, or an expansion bash alone computes
        end = _closing(rest)
        return rest[:end], None, i + end
    return None, None, i


def _closing(rest: str) -> int:
    closer = {"$(": ")", "${": "}", "`": "`"}[rest[:2] if rest[0] == "$" else "`"]
    end = rest.find(closer, 2 if rest[0] == "$" else 1)
    return len(rest) if end < 0 else end + 1


def _quoted(shell: _Shell, name: str, value: str | None, quote: str) -> str:
    if value is None:
        shell.marks.append(name)
        return _MARK.format(len(shell.marks) - 1)
    if quote == '"':
        return re.sub(r'(["\\$`])', r"\\\1", value)
    return " ".join(shlex.quote(piece) for piece in value.split())  # bash splits an unquoted expansion


def _declared(words: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return words[1:] if words and words[0][1] in _DECLARE else words


def _assign(shell: _Shell, word: str) -> bool:
    """`NAME=value` remembered (a value made of unset variables leaves NAME unset too); False: not one."""
    match = _ASSIGNMENT.match(word)
    if match is None:
        return False
    name, value = match.groups()
    unset = [shell.marks[int(i)] for i in _MARKED.findall(value)]
    if unset:
        shell.variables.pop(name, None)
        shell.unset[name] = f"its value uses {', '.join(map(_shown, unset))}, which have no value here"
    else:
        shell.variables[name] = value
        shell.unset.pop(name, None)
    return True


def _is_main_ppo(words: list[tuple[int, str]]) -> bool:
    plain = [word for _, word in words]
    return any(
        (word == MODULE and i > 0 and plain[i - 1] == "-m") or word.endswith("verl/trainer/main_ppo.py")
        for i, word in enumerate(plain)
    )


def _overrides(shell: _Shell, words: list[tuple[int, str]]) -> list[Line]:
    plain = [word for _, word in words]
    start = next(i for i, w in enumerate(plain) if w == MODULE or w.endswith("main_ppo.py")) + 1
    lines = []
    for number, word in words[start:]:
        if word.startswith("-"):
            raise UserError(
                f"{shell.where}:{number}: {single_line(word)!r}: autotune reads verl's default trainer "
                f"config (ppo_trainer) and key=value overrides, not Hydra's command-line flags"
            )
        lines.append(Line(number, _resolved(shell, number, word)))
    return lines


def _resolved(shell: _Shell, number: int, word: str) -> str:
    """The override with its unset variables: refused in a key autotune reads, kept as written elsewhere."""
    names = [shell.marks[int(i)] for i in _MARKED.findall(word)]
    if not names:
        return word
    key = word.partition("=")[0].lstrip("+~")
    shown = ", ".join(_shown(n) + (f" ({shell.unset[n]})" if n in shell.unset else "") for n in names)
    if verl_schema.kind(key) is not None:
        raise UserError(
            f"{shell.where}:{number}: {key}: {shown} is not set by the script, and autotune does not guess "
            f"it: set it in the script, or write the value"
        )
    shell.notes.append(f"{shell.where}:{number}: {key}: {shown} not set by the script: kept as written")
    written = _MARKED.sub(lambda m: _shown(shell.marks[int(m.group(1))]), word.partition("=")[2])
    escaped = written.replace("\\", "\\\\").replace("'", "\\'")
    return f"{word.partition('=')[0]}='{escaped}'"


def _shown(name: str) -> str:
    """A variable as the script writes it (a command substitution is kept whole)."""
    return name if name.startswith(("$", "`")) else f"${name}"
