"""The terminal at 80 columns: every help text whole, the summary table with no cell cut short; and feedback
for the waits of a run (checkpoint preparation, server start-up, warm-up, a refused connection)."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest
import typer
from rich.console import Console
from rich.text import Text
from typer.testing import CliRunner

import compare.cli as cli
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


# -- the summary table ---------------------------------------------------------------------------------------

BACKENDS = [
    ("reference", "eager"),
    ("reference", ""),
    ("vllm", "tp2"),
    ("llama.cpp", ""),
    ("trtllm-triton", "fp8"),
    ("sglang", ""),
]
LOADS = ["c=1", "c=64", "r=12.5", "r=inf", "trace=burst.jsonl"]
MEASURED = ["ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "output_tok_s"]


def _summary(seed: int) -> pd.DataFrame:
    """A summary of random backends, load points and magnitudes (0.01 ms to 100 s, up to 10,000 requests)."""
    rng = np.random.default_rng(seed)
    rows = []
    for workload in rng.choice(
        ["random-128x16", "sharegpt-ShareGPT_V3_unfiltered", "prefix-4x256+128x16"],
        size=rng.integers(1, 3),
        replace=False,
    ):
        for b in rng.choice(len(BACKENDS), size=rng.integers(1, len(BACKENDS) + 1), replace=False):
            for load in rng.choice(LOADS, size=rng.integers(1, 4), replace=False):
                rows.append(
                    {
                        "backend": BACKENDS[b][0],
                        "variant": BACKENDS[b][1],
                        "workload": workload,
                        "load_point": load,
                        "requests_ok": int(rng.integers(0, 10_000)),
                        "requests_failed": int(rng.integers(0, 100)),
                        "requests_cancelled": int(rng.integers(0, 10)),
                        "goodput_rps": np.nan if seed % 2 else float(rng.uniform(0, 500)),
                    }
                    | {m: float(10 ** rng.uniform(-2, 5)) for m in MEASURED}
                )
    return pd.DataFrame(rows)


def _labelled(lines: list[str], key: str, load: str) -> bool:
    """Whether a row starts with the backend `key` whole and then `load` whole, on its line or the next."""
    words = [line.split() for line in lines] + [[]]
    return any(
        w[:1] == [key] and (w[1:2] == [load] or words[i + 1][:1] == [load]) for i, w in enumerate(words[:-1])
    )


@pytest.mark.parametrize("width", [80, 100, 160])
@pytest.mark.parametrize("seed", range(6))
def test_the_summary_fits_the_terminal_with_every_name_whole(monkeypatch, seed, width):
    """At 80 columns and more: no cell cut with an ellipsis, no line wider than the terminal, every backend
    name and load point readable whole, every workload named, every row's TTFT p50 shown."""
    summary = _summary(seed)
    shown = Console(width=width, record=True, file=io.StringIO())
    monkeypatch.setattr(cli, "console", shown)
    cli.print_summary(SimpleNamespace(summary=summary, picks=[], warnings=["a warning"]))
    text = shown.export_text()
    lines = text.splitlines()
    assert "…" not in text
    assert max(map(len, lines)) <= width
    for _, r in summary.iterrows():
        key = f"{r['backend']}:{r['variant']}" if r["variant"] else r["backend"]
        assert _labelled(lines, key, r["load_point"]), (key, r["load_point"])
        assert cli._short(r["ttft_p50_ms"]) in text
    for workload in summary["workload"].unique():
        assert workload in flat(text)
    assert ("goodput" in text) == bool(summary["goodput_rps"].notna().any())
    assert "warning: a warning" in text


def test_short_numbers_keep_three_significant_digits():
    for value, shown in [
        (0.0123, "0.01"),
        (4.126, "4.13"),
        (45.66, "45.7"),
        (123.4, "123"),
        (12345.6, "12,346"),
        (float("nan"), "–"),
        (None, "–"),
    ]:
        assert cli._short(value) == shown
