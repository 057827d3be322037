"""The small commands and the parser itself: every flag explained, `models` and `spaces` listed whole and
fast, the worker's storage advice, `run --json`."""

from __future__ import annotations

import argparse
import io
import json
import shlex
import subprocess
import sys

import pytest
from rich.console import Console

from autotune.cli import build_parser, main
from autotune.errors import UserError
from autotune.models.listing import model_rows, plain_table, print_model_table
from autotune.models.names import MODELS
from autotune.run.worker import check_shared_storage
from autotune.space.schema import read_space, shipped_spaces


def _parsers(parser: argparse.ArgumentParser, path: str = "autotune"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_argument_has_help():
    missing = [
        f"{path} {'/'.join(action.option_strings) or action.dest}"
        for path, parser in _parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert missing == []


def test_every_help_page_renders():
    for path, parser in _parsers(build_parser()):
        assert parser.format_help(), path  # a stray % in a help text would raise here


def test_every_command_has_a_one_line_description_and_examples_that_parse():
    """The first line of each help says what the command does; its examples are real command lines."""
    for path, parser in _parsers(build_parser()):
        summary = (parser.description or "").split("\n")[0]
        assert summary.endswith(".") and len(summary) <= 100, f"{path}: {summary!r}"
        assert (parser.epilog or "").startswith("examples:\n"), f"{path} has no examples"
        examples = [line.strip() for line in parser.epilog.splitlines()[1:] if line.strip()]
        assert examples, path
        for example in examples:
            argv = shlex.split(example, comments=True)
            assert " ".join(argv[: len(path.split())]) == path or path == "autotune", example
            build_parser().parse_args(argv[1:])  # a usage error would raise UserError


def test_run_json_flag():
    parser = build_parser()
    assert parser.parse_args(["run", "--json"]).json is True
    assert parser.parse_args(["run"]).json is False
    assert "autotune spaces" in parser._subparsers._group_actions[0].choices["run"].format_help()


# --- models --------------------------------------------------------------------------------------------


def test_models_in_a_pipe_are_plain_lines_with_whole_names(capsys):
    assert main(["models"]) == 0  # capsys' stdout is no terminal
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "role", "architecture", "parameters", "layers", "hidden", "vocab"]
    assert [line.split()[0] for line in lines[1:]] == list(MODELS)
    assert "DebertaV2ForSequenceClassification" in lines[len(lines) - 1]


@pytest.mark.parametrize("width", [40, 80, 200])
def test_models_on_a_terminal_never_cut_a_name(width):
    out = io.StringIO()
    print_model_table(model_rows(), Console(file=out, width=width, force_terminal=True, color_system=None))
    text = out.getvalue()
    for name in MODELS:
        assert name in text, (width, name)
    assert "…" not in text
    assert ("┃" in text) == (width == 200)  # a table only where every cell fits whole


def test_plain_table_aligns_numbers_right():
    lines = plain_table(model_rows()).splitlines()
    assert len({len(line) for line in lines}) == 1  # the last column is right-aligned: equal lengths


def test_models_list_counts_nothing_when_the_table_is_current(monkeypatch):
    import autotune.models.catalog as registry

    def slow(*args, **kwargs):
        raise AssertionError("counted by building the model: the shipped table is stale")

    monkeypatch.setattr(registry, "count_parameters", slow)
    assert [row["name"] for row in model_rows()] == list(MODELS)


@pytest.mark.e2e  # a child process: the only way to see what a fresh `autotune models` imports
def test_models_list_imports_neither_torch_nor_transformers():
    code = (
        "import sys, contextlib, io\n"
        "from autotune.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['models', '--json']) == 0\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# --- spaces --------------------------------------------------------------------------------------------


def test_spaces_lists_each_shipped_space_on_one_line(capsys):
    assert main(["spaces"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == shipped_spaces()
    for line, name in zip(lines, shipped_spaces(), strict=True):
        data = read_space(name)[0]
        assert data["description"] in line and f"{data['model']} on {data['gpus']} GPU" in line


def test_spaces_json(capsys):
    assert main(["spaces", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in rows] == shipped_spaces()
    default = next(row for row in rows if row["name"] == "default")
    assert default["model"] == "llama-2-7b" and default["gpus"] == 1 and default["description"]


# --- worker --------------------------------------------------------------------------------------------


def test_worker_on_sqlite_says_which_storage_to_use(capsys):
    with pytest.raises(UserError) as exc:
        check_shared_storage("sqlite:///x.db", "s")
    text = str(exc.value)
    assert "journal:PATH" in text and "PostgreSQL URL" in text and "autotune run --study s" in text
    assert "leave --storage out" not in text
    assert main(["worker", "--study", "s", "--storage", "sqlite:///x.db"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "journal:PATH" in err
    check_shared_storage("journal:/tmp/x.journal", "s")  # a shared storage passes


@pytest.mark.parametrize("argv", [["run", "--seed=--"], ["probe", "--iterations=--"]])
def test_a_lone_double_dash_as_a_value_is_refused_in_one_line(argv):
    # argparse itself strips it and stores [] without calling the flag's type (hypothesis found run --seed=--)
    with pytest.raises(UserError, match="expected a value, got '--'"):
        build_parser().parse_args(argv)


@pytest.mark.e2e  # a child process whose standard output has no reader
def test_a_closed_output_pipe_is_one_line_and_exit_141(tmp_path):
    """`autotune check ... | head` with head gone: no traceback and no talk of storage, the shell's 141."""
    import os

    config = tmp_path / "trl_config.yaml"
    config.write_text("generation_batch_size: 16\nnum_generations: 4\nmax_completion_length: 64\n")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first line
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "autotune", "check", str(config), "--model", "tiny-llama"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr.strip().splitlines() == ["autotune: standard output was closed (broken pipe); stopped"]
