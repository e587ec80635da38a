"""A committed run directory rebuilds to the reports committed beside it. `compare report` reads nothing but
the run directory, so a change to the comparator that moves a number, a verdict or a sentence shows here;
when the change is meant, `bash benchmarks/rebuild_reports.sh` brings the committed reports up to date."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from compare_cli import ROOT, run_compare

#: the smallest committed run that kept its request records (three engines on a CPU, two launches each)
RUN = ROOT / "benchmarks/results/cpu_three_engines/run"


@pytest.mark.slow
def test_a_committed_run_rebuilds_its_summary_and_report(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    run_compare("report", str(run))  # as benchmarks/rebuild_reports.sh does
    for name in ("summary.csv", "report.md"):
        assert (run / name).read_text() == (RUN / name).read_text(), name
