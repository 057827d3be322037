"""Command line: the entry point, the one-line error path and the walk over the commands' registry
(`autotune.commands.COMMANDS`; each command's parser and work live in its own module).

A user's mistake ends with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from autotune import __version__
from autotune.commands import COMMANDS
from autotune.commands.arguments import examples_text
from autotune.errors import AutotuneError, UserError

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse, but its usage errors are one line with exit code 2 like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message} (see {self.prog} --help)")

    def parse_known_args(self, args=None, namespace=None):
        # argparse strips a lone `--` from `--flag=--` and stores [] without calling the flag's type.
        for arg in sys.argv[1:] if args is None else args:
            if arg.startswith("--") and arg.endswith("=--"):
                self.error(f"argument {arg[:-3]}: expected a value, got '--'")
        return super().parse_known_args(args, namespace)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="autotune",
        description="Find fast, memory-safe batch settings for verl PPO/GRPO.",
        epilog=examples_text(
            [
                "autotune run --space cpu-tiny --trials 12    # the embedded CPU default, about 5 minutes",
                "autotune run --model llama-2-7b --gpus 2 --time-budget 8h",
                "autotune check reports/<study>/best_config.yaml --gpus 4",
            ]
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        parser_class=_Parser,
        metavar="COMMAND",
        help="one of the commands below; `autotune COMMAND --help` lists its options",
    )
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        handler: Callable[[argparse.Namespace], int] = args.handler
        code = handler(args)
        sys.stdout.flush()  # a closed pipe (`autotune check ... | head`) surfaces here, not at exit
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except AutotuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from autotune.study.storage import scrub, transient

        if not transient(exc):
            raise
        # A storage or file error outside the retried paths: one line, no password, nothing measured lost.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(
            f"error: storage or output unavailable ({type(exc).__name__}: {scrub(first)}); every completed "
            f"trial is kept: run the same command again when it is back",
            file=sys.stderr,
        )
        return 3


EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for a command whose reader went away


def _stdout_closed() -> int:
    """The reader of standard output went away: stop writing there, say so on stderr, exit as shells do."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
    with contextlib.suppress(OSError):
        print("autotune: standard output was closed (broken pipe); stopped", file=sys.stderr)
    return EXIT_PIPE_CLOSED


if __name__ == "__main__":
    sys.exit(main())
