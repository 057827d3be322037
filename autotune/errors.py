"""Errors a user can fix: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """Bad input: what is wrong, the value, and how to fix it — in one line."""

    exit_code = 2
