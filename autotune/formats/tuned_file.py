r"""The user's own file handed back with the tuned values: `<stem>.tuned.<ext>`, everything else untouched.

    text = tune_launch_script(script, {"actor_rollout_ref.rollout.n": "8"}, call_line=4)
    text = tune_override_file(overrides, {"data.train_batch_size": "64"})
    text = tune_yaml_config(trl_yaml, {"per_device_train_batch_size": 8})
    tuned_path(Path("run.sh"), out)          # out / "run.tuned.sh"
    short_diff(before, after, "run.sh")      # ["run.sh:18: - ...", "run.sh:18: + ..."]

A value is changed in place where the file sets it, and added where it does not; comments, variables,
logging, wrappers and line endings stay byte for byte. A launch script is edited as text, not rewritten: a
small lexer of bash's quoting (quotes, `$(...)`, `${...}`, comments, heredocs) says where each override
word is, so an override inside a comment or a heredoc is left alone, one inside a bash array or a quoted
string is changed, and its whole value (`$VAR`, `${VAR:-4}`, `$((a * b))`, `"4"`) is replaced. A key the
script does not set is added right after the trainer's module word and any Hydra options that follow it
(`--config-path`, `--config-name`: argparse refuses an override before an option when another follows it).
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["short_diff", "tune_launch_script", "tune_override_file", "tune_yaml_config", "tuned_path"]

MAX_DIFF_LINES = 40
_MODULE = re.compile(
    r"(?<![^\s'\"])(?:verl\.trainer\.main_ppo|(?:[^\s'\"]*/)?main_ppo\.py)(?=[\s'\";|&)\\]|$)"
)
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_.,:/@%+=-]+")  # a value bash passes as written, unquoted
_WORD_END = " \t\r\n;|&<>()"
# Hydra's options that take their value as the next word when written without `=`
_VALUE_OPTIONS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--cfg", "-c"}
_VALUE_OPTIONS |= {"--package", "-p", "--experimental-rerun"}


def tuned_path(source: Path, out_dir: Path) -> Path:
    """Where the tuned copy of `source` goes: run.sh -> out_dir/run.tuned.sh, NAME -> out_dir/NAME.tuned."""
    return out_dir / f"{source.stem}.tuned{source.suffix}"


def short_diff(before: str, after: str, name: str) -> list[str]:
    """The changed lines only, `name:LINE: - old` (the old file's line) and `name:LINE: + new` (the new
    file's line), at most MAX_DIFF_LINES of them (the last says how many more there are)."""
    old, new = before.splitlines(), after.splitlines()
    lines = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        lines += [f"{name}:{i + 1}: - {old[i]}" for i in range(i1, i2)]
        lines += [f"{name}:{j + 1}: + {new[j]}" for j in range(j1, j2)]
    if len(lines) > MAX_DIFF_LINES:
        more = len(lines) - (MAX_DIFF_LINES - 1)
        lines = [*lines[: MAX_DIFF_LINES - 1], f"... and {more} more changed lines"]
    return lines


# --- a bash launch script ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    kind: str  # "comment", "heredoc", "single" (inside '...'), "double" (inside "...")


class _Lexer:
    """Bash's quoting, enough to say where a position of the script is: in a comment, a heredoc's body, a
    single- or double-quoted string, or plain words. Command substitutions inside double quotes are plain
    words again, as bash reads them."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.spans: list[_Span] = []
        self.heredocs: list[tuple[str, bool]] = []  # pending (delimiter, strip tabs) until the next newline

    def run(self) -> list[_Span]:
        self.plain(0)
        return self.spans

    def context(self, pos: int) -> str:
        """The innermost kind of span holding `pos`, or "plain"."""
        kind, width = "plain", len(self.text) + 1
        for span in self.spans:
            if span.start <= pos < span.end and span.end - span.start < width:
                kind, width = span.kind, span.end - span.start
        return kind

    def plain(self, i: int, close: str | None = None, arithmetic: bool = False) -> int:
        """Words from i until `close` (")" of `$(`, "}" of `${`) or the end; the index after it."""
        text, depth, word_start = self.text, 0, True
        while i < len(text):
            c = text[i]
            if close and c == close and depth == 0:
                return i + 1
            if c == "\\":
                i, word_start = i + 2, False
                continue
            if c == "'":
                i, word_start = self.single(i + 1), False
                continue
            if c == '"':
                i, word_start = self.double(i + 1), False
                continue
            if c == "$" and text.startswith("$'", i):
                i, word_start = self.ansi(i + 2), False
                continue
            if c == "$" and i + 1 < len(text) and text[i + 1] in "({":
                i, word_start = self.dollar(i), False
                continue
            if c == "`":
                i, word_start = self.backtick(i + 1), False
                continue
            if c == "#" and word_start and close != "}":
                end = _line_end(text, i)
                self.spans.append(_Span(i, end, "comment"))
                i = end
                continue
            if c == "(" and word_start and text.startswith("((", i):
                i = self.plain(i + 1, ")", arithmetic=True)
                continue
            if text.startswith("<<<", i):  # a here-string: a word follows, not a body
                i, word_start = i + 3, True
                continue
            if not arithmetic and text.startswith("<<", i):
                i, word_start = self.heredoc_start(i + 2), False
                continue
            if c == "\n" and self.heredocs:
                i, word_start = self.heredoc_bodies(i + 1), True
                continue
            if close == ")" and c == "(":
                depth += 1
            elif close == ")" and c == ")":
                depth -= 1
            word_start = c in _WORD_END
            i += 1
        return i

    def single(self, i: int) -> int:
        end = self.text.find("'", i)
        end = len(self.text) if end < 0 else end
        self.spans.append(_Span(i, end, "single"))
        return end + 1

    def ansi(self, i: int) -> int:
        start, text = i, self.text
        while i < len(text) and text[i] != "'":
            i += 2 if text[i] == "\\" else 1
        self.spans.append(_Span(start, min(i, len(text)), "single"))
        return i + 1

    def double(self, i: int) -> int:
        start, text = i, self.text
        while i < len(text) and text[i] != '"':
            if text[i] == "\\":
                i += 2
            elif text[i] == "$" and i + 1 < len(text) and text[i + 1] in "({":
                i = self.dollar(i)
            elif text[i] == "`":
                i = self.backtick(i + 1)
            else:
                i += 1
        self.spans.append(_Span(start, min(i, len(self.text)), "double"))
        return i + 1

    def dollar(self, i: int) -> int:
        """`$(...)`, `$((...))` or `${...}` starting at i (the `$`): the index after it."""
        if self.text[i + 1] == "{":
            return self.plain(i + 2, "}")
        if self.text.startswith("$((", i):
            return self.plain(i + 2, ")", arithmetic=True)
        return self.plain(i + 2, ")")

    def backtick(self, i: int) -> int:
        text = self.text
        while i < len(text) and text[i] != "`":
            i += 2 if text[i] == "\\" else 1
        return i + 1

    def heredoc_start(self, i: int) -> int:
        text = self.text
        strip = text.startswith("-", i)
        i += strip
        while i < len(text) and text[i] in " \t":
            i += 1
        end = i
        while end < len(text) and text[end] not in _WORD_END:
            end += 1
        word = text[i:end]
        delimiter = word.replace("'", "").replace('"', "").replace("\\", "")
        if delimiter:
            self.heredocs.append((delimiter, strip))
        return end

    def heredoc_bodies(self, i: int) -> int:
        """Skip the bodies of the heredocs opened on the line that ended at i - 1."""
        text = self.text
        for delimiter, strip in self.heredocs:
            start = i
            while i < len(text):
                end = _line_end(text, i)
                line = text[i:end].rstrip("\r")
                i = end + 1
                if (line.lstrip("\t") if strip else line) == delimiter:
                    break
            self.spans.append(_Span(start, min(i, len(text)), "heredoc"))
        self.heredocs = []
        return i


def _line_end(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _value_end(text: str, i: int, context: str) -> int:
    """Where the value that starts at i ends: at unquoted whitespace, a line continuation, the end of the
    command, or (inside a quoted string) its closing quote; quotes, `$(...)` and `${...}` inside it are
    taken whole."""
    lexer = _Lexer(text)  # a scratch one: its spans are not the script's
    while i < len(text):
        c = text[i]
        if c in " \t\r\n" or (context == "single" and c == "'"):
            return i
        if context == "single":
            i += 1
            continue
        if c == "\\":
            if text.startswith("\n", i + 1) or text.startswith("\r\n", i + 1):
                return i
            i += 2
            continue
        if c == "$" and i + 1 < len(text) and text[i + 1] in "({":
            i = lexer.dollar(i)
        elif c == "`":
            i = lexer.backtick(i + 1)
        elif context == "double":
            if c == '"':
                return i
            i += 1
        elif c == "'":
            i = lexer.single(i + 1)
        elif c == '"':
            i = lexer.double(i + 1)
        elif c == "$" and text.startswith("$'", i):
            i = lexer.ansi(i + 2)
        elif c in _WORD_END:
            return i
        else:
            i += 1
    return min(i, len(text))


def _bash_value(value: str, context: str, whole_string: bool, key: str) -> str:
    """`value` written so bash passes it as Hydra should read it, in the quoting context of the old value."""
    spaced = any(c.isspace() for c in value)
    if spaced and context != "plain" and not whole_string:
        raise ValueError(
            f"{key}={value}: a value with a space cannot go into the quoted string of several overrides that "
            f"sets {key}; edit that string by hand"
        )
    if context == "single":
        return value.replace("'", "'\\''")
    if context == "double":
        return re.sub(r'(["$`\\])', r"\\\1", value)
    return value if _PLAIN_WORD.fullmatch(value) else shlex.quote(value)


def _occurrences(lexer: _Lexer, key: str) -> list[tuple[int, int, int, str]]:
    """Each (word start, value start, value end, quoting context) of an override word that sets `key`."""
    text = lexer.text
    found = []
    for match in re.finditer(rf"(?<![^\s'\"])(?:\+\+?)?{re.escape(key)}=", text):
        context = lexer.context(match.start())
        if context in ("comment", "heredoc"):
            continue
        start = match.end()
        end = _value_end(text, start, context)
        found.append((match.start(), start, end, context))
    return found


def _whole_string(text: str, word_start: int, value_end: int, context: str) -> bool:
    """Whether the override is the quoted string's only word: `"key=value"`."""
    quote = "'" if context == "single" else '"'
    return text[word_start - 1 : word_start] == quote and text[value_end : value_end + 1] == quote


def _insertion_point(lexer: _Lexer, call_line: int) -> tuple[int, str, str]:
    """Where new overrides go in the trainer's command at or after `call_line` (after its module word and
    the Hydra options that follow it), the indentation of its argument lines, and the quoting context."""
    text = lexer.text
    lines = text.split("\n")
    if not 1 <= call_line <= len(lines):
        raise ValueError(f"line {call_line} is not in the script ({len(lines)} lines)")
    offset = sum(len(line) + 1 for line in lines[: call_line - 1])
    module = next(
        (m for m in _MODULE.finditer(text, offset) if lexer.context(m.start()) not in ("comment", "heredoc")),
        None,
    )
    if module is None:
        raise ValueError(
            f"no `verl.trainer.main_ppo` or `main_ppo.py` word at or after line {call_line}: the trainer's "
            f"command names its module another way (a variable?), so there is no place to add overrides"
        )
    end = module.end()
    if (
        text[module.start() - 1 : module.start()] in ("'", '"')
        and text[end : end + 1] == text[module.start() - 1]
    ):
        end += 1
    taking_value = False
    while True:
        start = _next_word(text, end)
        if start is None:
            break
        word_end = _value_end(text, start, "plain")
        word = text[start:word_end].strip("'\"")
        if not (taking_value or word.startswith("-")):
            break
        taking_value = not taking_value and word in _VALUE_OPTIONS
        end = word_end
    return end, _indentation(text, end), lexer.context(module.start())


def _next_word(text: str, i: int) -> int | None:
    """The start of the command's next word after i, across line continuations; None at its end."""
    while i < len(text):
        if text[i] in " \t":
            i += 1
        elif text.startswith("\\\n", i):
            i += 2
        elif text.startswith("\\\r\n", i):
            i += 3
        elif text[i] in "\r\n;|&<>()#":
            return None
        else:
            return i
    return None


def _indentation(text: str, end: int) -> str:
    """The indentation of the command's next argument line after `end`, else its own line's plus 4."""
    line_start = text.rfind("\n", 0, end) + 1
    line = text[line_start : _line_end(text, line_start)]
    own = line[: len(line) - len(line.lstrip(" \t"))]
    rest = text[end : _line_end(text, end)].rstrip("\r")
    if rest.strip() == "\\":
        next_line = text[_line_end(text, end) + 1 :]
        argument = re.match(r"([ \t]*)\S", next_line)
        if argument:
            return argument.group(1)
    return own + "    "


def tune_launch_script(text: str, changes: dict[str, str], call_line: int) -> str:
    """The script with each Hydra key of `changes` set to its value (Hydra's grammar: "8", "true", "null").
    A key may carry Hydra's `+`/`++` (add a field verl's YAML lacks): it is found without them, and added
    with them.

    Every override word that sets the key (`key=`, `+key=`, `++key=`, in a command, an array or a quoted
    string; not in a comment or a heredoc) gets the new value in place of its whole old one. A key the
    script never sets is added to the trainer's command at or after the 1-based `call_line`, one
    ` \\` continuation line per key. ValueError: no module word to add after, or a value that cannot go
    where the old one was."""
    lexer = _Lexer(text)
    lexer.run()
    edits: list[tuple[int, int, str]] = []
    missing = []
    for key, value in changes.items():
        found = _occurrences(lexer, key.lstrip("+"))  # `+key` is how a new key is added
        if not found:
            missing.append((key, value))
        for word_start, start, end, context in found:
            whole = _whole_string(text, word_start, end, context)
            edits.append((start, end, _bash_value(value, context, whole, key)))
    if missing:
        at, indent, context = _insertion_point(lexer, call_line)
        newline = "\r\n" if text[_line_end(text, at) - 1 : _line_end(text, at)] == "\r" else "\n"
        words = [f"{key}={_bash_value(value, context, False, key)}" for key, value in missing]
        edits.append((at, at, "".join(f" \\{newline}{indent}{word}" for word in words)))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


# --- a verl override file ----------------------------------------------------------------------------------


def tune_override_file(text: str, changes: dict[str, str]) -> str:
    """The override file with each key's value replaced on the last line that sets it (`key=`, `+key=`,
    `++key=`), and `key=value` lines appended for the keys it does not set."""
    lines = text.splitlines(keepends=True)
    appended = []
    for key, value in changes.items():
        pattern = re.compile(rf"^(\s*\+{{0,2}}{re.escape(key.lstrip('+'))}\s*=)(.*?)(\r?\n)?$", re.S)
        last = next((i for i in reversed(range(len(lines))) if pattern.match(lines[i])), None)
        if last is None:
            appended.append(f"{key}={value}")
            continue
        match = pattern.match(lines[last])
        assert match is not None
        lines[last] = f"{match.group(1)}{value}{match.group(3) or ''}"
    tuned = _appended("".join(lines), appended)
    return tuned


# --- a TRL config YAML -------------------------------------------------------------------------------------


def _yaml_scalar(value: Any) -> str:
    dumped = yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True)
    if dumped.endswith("\n...\n"):
        dumped = dumped[: -len("...\n")]
    dumped = dumped.strip()
    if "\n" in dumped:
        raise ValueError(f"{value!r} does not fit on one line of YAML")
    return dumped


def _comment_start(rest: str) -> int:
    """Where the trailing ` # comment` of a YAML value starts (len(rest) when none), quotes respected."""
    quote = None
    for i, c in enumerate(rest):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"" and (i == 0 or rest[i - 1] in " \t[{,"):
            quote = c
        elif c == "#" and (i == 0 or rest[i - 1] in " \t"):
            return i
    return len(rest)


def tune_yaml_config(text: str, changes: dict[str, object]) -> str:
    """The flat YAML mapping with each top-level key's value replaced in place (its trailing comment kept,
    a block value below it removed), and `key: value` lines appended for the keys it does not set. Values
    are written as YAML scalars (flow style for a list). ValueError: not a mapping, or a file this cannot
    edit so that it reads back as the original with only the changed keys different."""
    try:
        original = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise ValueError(f"the YAML file does not load: {exc}") from None
    if not isinstance(original, dict):
        raise ValueError("the YAML file is not a mapping of settings")
    lines = text.splitlines(keepends=True)
    appended = []
    for key, value in changes.items():
        dumped = _yaml_scalar(value)
        pattern = re.compile(rf"^(?:{re.escape(key)}|'{re.escape(key)}'|\"{re.escape(key)}\")([ \t]*:)")
        hits = [i for i, line in enumerate(lines) if pattern.match(line)]
        if not hits:
            appended.append(f"{key}: {dumped}")
            continue
        for i in reversed(hits):
            lines[i : _block_end(lines, i)] = [_yaml_line(lines[i], pattern, dumped)]
    tuned = _appended("".join(lines), appended)
    expected = {**original, **{key: yaml.safe_load(_yaml_scalar(value)) for key, value in changes.items()}}
    try:
        kept = yaml.safe_load(tuned) == expected
    except yaml.YAMLError:
        kept = False
    if not kept:
        raise ValueError("the YAML file's layout cannot be edited in place; write the tuned values by hand")
    return tuned


def _yaml_line(line: str, pattern: re.Pattern[str], dumped: str) -> str:
    body = line.rstrip("\r\n")
    ending = line[len(body) :]
    head = pattern.match(body)
    assert head is not None
    rest = body[head.end() :]
    comment = _comment_start(rest)
    value = rest[:comment]
    space = value[: len(value) - len(value.lstrip())] or " "
    tail = rest[comment:]
    gap = value[len(value.rstrip()) :] if tail and value.strip() else (" " if tail else "")
    return f"{body[: head.end()]}{space}{dumped}{gap}{tail}{ending or ''}"


def _block_end(lines: list[str], i: int) -> int:
    """The end of the value of the key on line i: its indented (or `- ` list) lines below, not counting the
    blank and comment lines that end them."""
    end = i + 1
    last = i + 1
    while end < len(lines):
        stripped = lines[end].strip()
        if not stripped or stripped.startswith("#"):
            end += 1
            continue
        if lines[end][0] in " \t" or stripped == "-" or stripped.startswith("- "):
            end += 1
            last = end
            continue
        break
    return last


def _appended(text: str, lines: list[str]) -> str:
    """`text` with `lines` added at its end, in its own line endings (a last line without one gets one)."""
    if not lines:
        return text
    newline = "\r\n" if text.endswith("\r\n") else "\n"
    if text and not text.endswith("\n"):
        text += newline
    return text + "".join(line + newline for line in lines)
