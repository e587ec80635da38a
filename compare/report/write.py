"""The files of a report: summary.csv and summary.parquet, turns.csv, report.md and report.html, all from one
analysis of the run directory."""

from __future__ import annotations

from compare.analysis.results import Results
from compare.analysis.turns import write_turns
from compare.report.render import to_html, to_markdown
from compare.report.sections import build_blocks


def write_reports(results: Results) -> None:
    results.run.write_summary(results.summary)
    write_turns(results.run.path, results.turns)
    blocks = build_blocks(results)
    (results.run.path / "report.md").write_text(to_markdown(blocks), encoding="utf-8")
    (results.run.path / "report.html").write_text(
        to_html(blocks, results.run.manifest.get("run_id", "")), encoding="utf-8"
    )
