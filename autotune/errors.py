"""autotune's errors: each says what went wrong in one line, and carries the exit code the CLI ends with.

raise UserError("--gpus 0: expected a whole number >= 1")   # printed as `error: ...`, exit code 2
"""

__all__ = ["AutotuneError", "Unavailable", "UserError", "single_line"]

# Control characters a user typed (`--set sharding=$'0\n0'`) are shown escaped: a problem stays one line.
_ESCAPED = {code: ascii(chr(code))[1:-1] for code in [*range(0x20), 0x7F]}


def single_line(text: str) -> str:
    """`text` with its control characters (newlines, tabs, escapes) written as Python escapes."""
    return text.translate(_ESCAPED)


class AutotuneError(Exception):
    """An error autotune explains in one line; the CLI prints it and exits with `exit_code`."""

    exit_code = 1


class UserError(AutotuneError):
    """Bad input: what is wrong, the value, and how to fix it — in one line (a search space's mistakes: one
    line each)."""

    exit_code = 2


class Unavailable(AutotuneError):
    """Something outside the tool failed for good (storage unreachable, output folder full): exit code 3.

    The message says what, and that nothing measured was lost; running the same command again resumes.
    """

    exit_code = 3
