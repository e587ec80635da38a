"""The terminal at 80 columns: every help text whole, the summary table with no cell cut short; and feedback
for the waits of a run (checkpoint preparation, server start-up, warm-up, a refused connection)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from rich.text import Text
from typer.testing import CliRunner

from compare.cli import app

runner = CliRunner()
BOX = re.compile(r"[\u2500-\u257f]")  # box-drawing characters of rich's panels


def flat(text: str) -> str:
    """Text as words: box characters dropped, whitespace collapsed, so that wrapping does not matter."""
    return " ".join(BOX.sub(" ", text).split())


def _commands() -> list[tuple[list[str], Any]]:
    """Every command of the app (typer's own click command objects), with the words that call it."""
    group: Any = typer.main.get_command(app)
    return [([], group)] + [([name], cmd) for name, cmd in group.commands.items()]


def _id(value: Any) -> str:
    return "-".join(value) if isinstance(value, list) else ""


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("path, command", _commands(), ids=_id)
def test_every_help_text_is_whole_at_80_columns(path, command, width):
    """Each option's and argument's help, and the command's own text (the exit codes of `run` among it),
    appear in full: wrapped at the width, never cut with an ellipsis."""
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(width), "TERMINAL_WIDTH": ""})
    assert result.exit_code == 0, result.output
    out = result.output
    assert max(len(line) for line in out.splitlines()) <= width
    assert "…" not in out
    shown = flat(out)
    texts = [p.help for p in command.params if getattr(p, "help", None)]
    texts += [p for p in (command.help or "").split("\n\n") if p.strip()]
    assert texts
    for text in texts:
        assert flat(Text.from_markup(text).plain) in shown, text
    if path == ["run"]:
        assert "130 interrupted by Ctrl-C or SIGTERM" in shown


def test_run_help_paragraphs_are_reflowed_not_broken_at_the_source_lines():
    """At 80 columns the exit codes read as one paragraph: no line ends far short of the width while the
    paragraph goes on (the docstring's own line breaks used to leave half-empty lines)."""
    out = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "80"}).output
    head = out.split("╭")[0].splitlines()
    exit_lines = [line.rstrip() for line in head if line.strip()]
    start = next(i for i, line in enumerate(exit_lines) if "Exit codes" in line)
    paragraph = exit_lines[start:]
    assert len(paragraph) >= 3
    for line in paragraph[:-1]:
        assert len(line) >= 60, paragraph
